"""A failure inside lm-evaluation-harness is one line: six broken tasks (a broken Jinja template, an answer index out
of range, a document without choices, an empty data file, a NaN answer, more few-shot examples than documents) each
stop a lifelong run before its first edit with one line naming the task, the checkpoint, the file, the record and
the field, and run.json says ``failed`` with it; a failure lm-eval raises at a later checkpoint keeps every row
written before it and the rerun resumes; the same six, raised by lm-eval itself, are described by file, record and
field; a broken task YAML is reported as broken, unreachable checkpoints and a repeated task are refused at config
load (tiny local task YAMLs and data files, offline; tiny-llama, real ROME, the real Runner)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config
from editscope.run.lmeval import LM_EVAL_FILE, LmEvalFailed
from tests.run.test_lmeval import DOCS, TASK, write_task

pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed (pip install 'editscope[lmeval]')")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def bad_docs(**change) -> list[dict]:
    return DOCS[:2] + [dict(DOCS[2], **change)] + DOCS[3:]


def broken_task(folder: Path, kind: str) -> tuple[Path, str]:
    """A task folder with one fault, and the text the error must hold (file, record, field)."""
    data = folder / f"{TASK}.jsonl"
    yaml_file = folder / f"{TASK}.yaml"
    if kind == "jinja":
        write_task(folder)
        yaml_file.write_text(yaml_file.read_text().replace("doc_to_text: '{{question}}'",
                                                           "doc_to_text: '{{question'"))
        return folder, f"{yaml_file}: field 'doc_to_text': broken Jinja template"
    if kind == "index":
        write_task(folder, bad_docs(answer=7))
        return folder, f"{data}:record 2: field 'doc_to_target': answer 7 is not the index of one of the 2 choices"
    if kind == "no_choices":
        write_task(folder, bad_docs(choices=[]))
        return folder, f"{data}:record 2: field 'doc_to_choice': no choices"
    if kind == "empty":
        write_task(folder)
        data.write_text("")
        return folder, f"{yaml_file}: field 'dataset_kwargs.data_files.test': the data file {data} holds no documents"
    if kind == "nan":
        write_task(folder, bad_docs(answer=math.nan))
        return folder, f"{data}:record 2: field 'doc_to_target': answer nan is not the index of one of the 2 choices"
    if kind == "fewshot":
        write_task(folder)
        yaml_file.write_text(yaml_file.read_text() + "num_fewshot: 10\n")
        return folder, (f"{yaml_file}: field 'num_fewshot': 10 few-shot example(s), but the split they are drawn from "
                        f"holds {len(DOCS)} document(s), one of them the evaluated one")
    raise AssertionError(kind)


KINDS = ["jinja", "index", "no_choices", "empty", "nan", "fewshot"]


def lifelong(tmp_path, folder: Path, **lm) -> dict:
    return {
        "model": "tiny-llama", "output": str(tmp_path / "run"),
        "mode": {"sequential_batches": {"batch": 1, "rounds": 2, "checkpoints": 1}},
        "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
        "dataset": "counterfact", "slice": {"limit": 2}, "suites": ["counterfact"],
        "lm_eval": {"tasks": [TASK], "include_path": str(folder)} | lm,
    }


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_task_stops_the_run_before_any_edit_in_one_line(kind, tmp_path, tiny_llama):
    tasks, expected = broken_task(tmp_path / "tasks", kind)
    config = parse_config(lifelong(tmp_path, tasks))
    with pytest.raises(LmEvalFailed) as err:
        Runner(config, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    message = str(err.value)
    assert "\n" not in message and expected in message, message
    assert message.startswith(f"lm_eval: task '{TASK}' cannot be evaluated (checked before the first edit): ")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "failed" and meta["error"] == message
    assert not (tmp_path / "run" / "results.jsonl").exists() or not (tmp_path / "run" / "results.jsonl").read_text()


def test_a_failure_at_a_later_checkpoint_keeps_the_rows_and_the_rerun_resumes(tmp_path, tiny_llama, monkeypatch):
    """lm-eval raises at the checkpoint after round 2 (here: a ValueError of its few-shot sampler, injected into
    the call the hook makes): the run stops with one line naming the checkpoint, run.json says failed, the rows of
    round 1 and the unedited model stay, and a rerun computes exactly what is missing."""
    import editscope.run.lmeval as lmeval

    tasks = write_task(tmp_path / "tasks")
    config = parse_config(lifelong(tmp_path, tasks))
    real = lmeval.evaluate
    calls = []

    def failing_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("Sample larger than population or is negative\n(a second line lm-eval prints)")
        return real(*args, **kwargs)

    monkeypatch.setattr(lmeval, "evaluate", failing_third)
    with pytest.raises(EditscopeError) as err:
        Runner(config, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    message = str(err.value)
    assert message == (f"lm_eval: task '{TASK}' failed at the checkpoint of 2 edit(s) (dataset counterfact, group 0, "
                       f"method rome, round 2): {tasks / (TASK + '.yaml')}: ValueError: Sample larger than population "
                       "or is negative; the rows written so far are kept, fix the task and rerun to resume")
    out = tmp_path / "run"
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed" and meta["error"] == message
    lm_rows = [json.loads(line) for line in (out / LM_EVAL_FILE).read_text().splitlines()]
    assert [(r["method"], r["edits_applied"]) for r in lm_rows] == [("none", 0), ("rome", 1)]
    kept = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["case_id"], r["checkpoint"], r["edits_applied"]) for r in kept] == [(kept[0]["case_id"], True, 1)]

    monkeypatch.setattr(lmeval, "evaluate", real)
    result = Runner(config, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    assert result.written == 2 and result.skipped == 1
    lm_rows = [json.loads(line) for line in (out / LM_EVAL_FILE).read_text().splitlines()]
    assert [(r["method"], r["edits_applied"]) for r in lm_rows] == [("none", 0), ("rome", 1), ("rome", 2)]
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and "error" not in meta


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "index"])  # lm-eval scores an index past the end as
def test_errors_lm_eval_raises_are_described_by_file_record_and_field(kind, tmp_path, tiny_llama):  # wrong, silently
    from editscope.run.lmeval import evaluate, task_manager
    from editscope.run.lmeval_tasks import describe_failure

    tasks, expected = broken_task(tmp_path / "tasks", kind)
    manager = task_manager(str(tasks), [TASK])
    with pytest.raises(Exception) as err:  # noqa: PT011 -- whatever lm-eval raises: that is the point
        evaluate(tiny_llama.model, tiny_llama.tokenizer, [TASK], manager=manager)
    assert not isinstance(err.value, EditscopeError)  # lm-eval's own exception, caught at the hook in a run
    line = describe_failure(err.value, manager, TASK)
    assert line == expected or line.startswith(expected), line
    assert "\n" not in line


def test_a_broken_task_yaml_is_reported_as_broken_not_unknown(tmp_path):
    tasks = write_task(tmp_path / "tasks")
    yaml_file = tasks / f"{TASK}.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("doc_to_target: answer", "doc_to_target: [answer"))
    with pytest.raises(EditscopeError) as err:
        parse_config(lifelong(tmp_path, tasks), where="exp.yaml")
    message = str(err.value)
    assert message.startswith(f"exp.yaml: key 'lm_eval.tasks[0]': task '{TASK}': its task YAML {yaml_file} is "
                              "broken: "), message
    assert "unknown" not in message and "\n" not in message
    # an unknown name beside a broken YAML of another task: unknown, and the broken file named
    with pytest.raises(EditscopeError) as err:
        parse_config(lifelong(tmp_path, tasks, tasks=["no_such_task_xyz"]), where="exp.yaml")
    assert "unknown lm-eval task 'no_such_task_xyz'" in str(err.value)
    assert f"broken task YAML under include_path: {yaml_file}: " in str(err.value)


def test_unreachable_checkpoints_are_refused_when_the_run_starts_and_a_repeated_task_at_config_load(tmp_path):
    """Parsing a config reads no cases; the run refuses a checkpoint no chain reaches before it loads a model
    (no bundle is given: the error comes first)."""
    tasks = write_task(tmp_path / "tasks")
    config = parse_config(lifelong(tmp_path, tasks, checkpoints=[0, 2, 5]), where="exp.yaml")
    with pytest.raises(EditscopeError) as err:  # 2 cases, one request each: the chain applies 2 edits
        Runner(config, progress=False, log=lambda _m: None).run()
    assert str(err.value) == ("exp.yaml: key 'lm_eval.checkpoints[2]': 5 edits: no chain reaches it (the longest "
                              "applies 2 edits: batch 1 x rounds 2 cases and their requests)")
    assert not (tmp_path / "run" / "results.jsonl").exists()
    assert parse_config(lifelong(tmp_path, tasks, checkpoints=[0, 2])).lm_eval.checkpoints == (0, 2)
    with pytest.raises(EditscopeError) as err:
        parse_config(lifelong(tmp_path, tasks, tasks=[TASK, TASK]), where="exp.yaml")
    assert str(err.value) == f"exp.yaml: key 'lm_eval.tasks[1]': task '{TASK}' is listed twice (also tasks[0])"
