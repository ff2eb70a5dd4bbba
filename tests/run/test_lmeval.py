"""lm-evaluation-harness on an edited model (editscope.run.lmeval): a tiny local multiple-choice task, offline.

lm-eval's accuracy equals the accuracy computed with editscope's own scoring engine (sum log-prob of each choice,
argmax); after an edit the in-process model lm-eval scores is the edited one, and the weights are back after the
revert; the exported folder loads in lm-eval with the edited scores; the run config's ``lm_eval`` key writes rows
at the chain checkpoints tagged with the number of edits applied. The tests that run lm-eval skip, saying why, where
it is not installed (``pip install 'editscope[lmeval]'``); the config errors are checked either way."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import edited
from editscope.edit.patch import tensor_checksum
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.run import Runner, parse_config
from editscope.run.lmeval import LM_EVAL_FILE

TASK = "editscope_tiny_mc"
DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "London", "Rome"], "answer": 0},
    {"question": "Hamlet was written by", "choices": ["Shakespeare", "Goethe", "Dante"], "answer": 0},
    {"question": "The Eiffel Tower is in", "choices": ["Berlin", "Paris"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": ["Celsius", "Fahrenheit", "Kelvin"], "answer": 0},
    {"question": "The largest planet is", "choices": ["Mars", "Jupiter", "Venus"], "answer": 1},
    {"question": "Danielle Darrieux is a citizen of", "choices": ["France", "Japan", "Italy"], "answer": 0},
]
EDIT = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")


def write_task(folder, docs=DOCS, name=TASK):
    """A multiple-choice task YAML over a local JSON Lines file (no hub)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return folder


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def lm_eval_or_skip():
    return pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed (pip install "
                               "'editscope[lmeval]'); make setup installs it")


def engine_choice_sums(bundle) -> list[list[float]]:
    """The independent computation: editscope's engine, sum log-prob of ' choice' after the question."""
    engine = ScoringEngine(bundle)
    return [[s.sum for s in engine.score([(d["question"], c) for c in d["choices"]])] for d in DOCS]


def lm_eval_choice_sums(out) -> list[list[float]]:
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    return [[float(r[0][0]) for r in s["resps"]] for s in samples]


def assert_close(got: list[list[float]], want: list[list[float]], atol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=atol)


def accuracy(sums: list[list[float]]) -> float:
    return float(np.mean([int(np.argmax(s)) == d["answer"] for s, d in zip(sums, DOCS, strict=True)]))


def test_in_process_accuracy_equals_engine_and_follows_the_edit(tiny_bundles, tmp_path, offline):
    lm_eval_or_skip()
    from editscope.run.lmeval import evaluate, task_metrics

    bundle = tiny_bundles["llama"]
    tasks = write_task(tmp_path / "tasks")
    before = {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}

    def run():
        return evaluate(bundle.model, bundle.tokenizer, [TASK], include_path=str(tasks), log_samples=True)

    training = bundle.model.training
    torch.manual_seed(7)
    expected_draw = torch.rand(3)
    torch.manual_seed(7)
    out = run()
    assert bundle.model.training == training and torch.is_grad_enabled()  # lm-eval left the model as it was
    assert torch.equal(torch.rand(3), expected_draw)  # and torch's random stream where it was
    pre = engine_choice_sums(bundle)
    assert_close(lm_eval_choice_sums(out), pre)
    assert task_metrics(out, TASK)["acc,none"] == pytest.approx(accuracy(pre))
    with edited(bundle, "rome", EDIT):
        out_edit = run()
        post = engine_choice_sums(bundle)
    assert_close(lm_eval_choice_sums(out_edit), post)
    assert task_metrics(out_edit, TASK)["acc,none"] == pytest.approx(accuracy(post))
    edited_doc = 5  # the edited fact: 'Japan' gains on it
    assert post[edited_doc][1] - pre[edited_doc][1] > 1.0
    assert lm_eval_choice_sums(out_edit)[edited_doc] != pytest.approx(lm_eval_choice_sums(out)[edited_doc])
    assert {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()} == before  # restored
    assert_close(lm_eval_choice_sums(run()), pre, atol=1e-6)


def test_exported_folder_loads_in_lm_eval_with_the_edited_scores(tiny_bundles, tmp_path, offline):
    lm_eval_or_skip()
    import lm_eval
    from lm_eval.tasks import TaskManager

    from editscope.cli import main

    bundle = tiny_bundles["llama"]
    tasks = write_task(tmp_path / "tasks")
    with edited(bundle, "rome", EDIT) as patch:
        post = engine_choice_sums(bundle)
        patch_file = patch.save(tmp_path / "p.safetensors")
    out_dir = tmp_path / "edited-model"
    assert main(["patch", "apply", str(patch_file), "--model", "tiny-llama", "--out", str(out_dir)]) == 0
    # what the docs show: lm_eval --model hf --model_args pretrained=DIR --tasks ... --include_path ...
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={out_dir},dtype=float32", tasks=[TASK],
                                  task_manager=manager, device="cpu", batch_size=8)
    assert_close(lm_eval_choice_sums(out), post)


def lifelong_config(tmp_path, lm_eval_key):
    return {
        "model": "tiny-llama", "output": str(tmp_path / "run"),
        "mode": {"sequential_batches": {"batch": 1, "rounds": 3, "checkpoints": 1}},
        "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
        "dataset": "counterfact", "slice": {"limit": 3}, "suites": ["counterfact"],
        "lm_eval": lm_eval_key,
    }


def test_lifelong_hook_writes_rows_at_the_chosen_checkpoints(tiny_bundles, tmp_path, offline):
    lm_eval_or_skip()
    tasks = write_task(tmp_path / "tasks")
    config = parse_config(lifelong_config(tmp_path, {"tasks": [TASK], "include_path": str(tasks),
                                                     "checkpoints": [0, 2, 3]}))
    runner = Runner(config, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None)
    runner.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / LM_EVAL_FILE).read_text().splitlines()]
    assert [(r["method"], r["edits_applied"], r["round"]) for r in rows] == [("none", 0, 0), ("rome", 2, 2),
                                                                             ("rome", 3, 3)]
    assert all(r["task"] == TASK and r["n_samples"] == len(DOCS) and 0 <= r["metrics"]["acc,none"] <= 1
               for r in rows)
    # the unedited row equals lm-eval's accuracy computed with the engine on the unedited model
    assert rows[0]["metrics"]["acc,none"] == pytest.approx(accuracy(engine_choice_sums(tiny_bundles["llama"])))
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["config"]["lm_eval"]["checkpoints"] == [0, 2, 3] and meta["lm_eval_version"]
    # a resume computes nothing again
    Runner(config, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    assert len((tmp_path / "run" / LM_EVAL_FILE).read_text().splitlines()) == 3


def test_config_errors_name_the_field(tmp_path, monkeypatch):
    tasks = write_task(tmp_path / "tasks")
    bad = {"tasks": [TASK], "include_path": str(tasks), "checkpoints": [-1]}
    with pytest.raises(EditscopeError, match=r"key 'lm_eval.checkpoints'"):
        parse_config(lifelong_config(tmp_path, bad))
    single = lifelong_config(tmp_path, {"tasks": [TASK]}) | {"mode": "single"}
    with pytest.raises(EditscopeError, match=r"key 'lm_eval': .*sequential_batches"):
        parse_config(single)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as without lm-eval installed: import fails
    with pytest.raises(EditscopeError) as err:
        parse_config(lifelong_config(tmp_path, {"tasks": [TASK], "include_path": str(tasks)}))
    assert "key 'lm_eval'" in str(err.value) and "pip install 'editscope[lmeval]'" in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_task_is_one_line_error_naming_the_field(tmp_path):
    lm_eval_or_skip()
    tasks = write_task(tmp_path / "tasks")
    with pytest.raises(EditscopeError) as err:
        parse_config(lifelong_config(tmp_path, {"tasks": [TASK, "no_such_task_xyz"], "include_path": str(tasks)}))
    assert "key 'lm_eval.tasks[1]'" in str(err.value) and "no_such_task_xyz" in str(err.value)
    assert "\n" not in str(err.value)


def test_run_package_does_not_import_lm_eval():
    import subprocess

    code = ("import sys, editscope.run, editscope.run.lmeval, editscope.run.runner, editscope.commands.run; "
            "print('lm_eval' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_checkpoint_schedule(tmp_path):
    from editscope.run.lmeval import LmEvalHook, LmEvalSpec

    default = LmEvalHook(LmEvalSpec((TASK,)), tmp_path, every=2)  # every 2nd round and the last one
    assert [r for r in range(1, 6) if default.due(r, 2 * (r - 1), 2 * r, last=r == 5)] == [2, 4, 5]
    listed = LmEvalHook(LmEvalSpec((TASK,), checkpoints=(0, 3, 7)), tmp_path, every=0)  # 2 edits per round
    assert [r for r in range(1, 5) if listed.due(r, 2 * (r - 1), 2 * r, last=r == 4)] == [2, 4]


def test_a_task_that_evaluates_nothing_is_an_error_naming_it(tiny_bundles, tmp_path, offline):
    """A task whose metric_list names a metric lm-eval does not know evaluates 0 documents and reports no metric:
    that is a failed run naming the task, never rows of nothing and exit 0."""
    lm_eval_or_skip()
    from editscope.run.lmeval import LmEvalFailed

    tasks = write_task(tmp_path / "tasks")
    yaml = tasks / f"{TASK}.yaml"
    yaml.write_text(yaml.read_text().replace("metric: acc", "metric: no_such_metric"))
    config = parse_config(lifelong_config(tmp_path, {"tasks": [TASK], "include_path": str(tasks),
                                                     "checkpoints": [0]}))
    with pytest.raises(LmEvalFailed, match=f"task '{TASK}' evaluated 0 document\\(s\\) and gave no metric at the "
                                           "unedited model"):
        Runner(config, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    assert not (tmp_path / "run" / LM_EVAL_FILE).exists() or not (tmp_path / "run" / LM_EVAL_FILE).read_text()
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"


def test_merged_shards_hold_the_unsharded_runs_lm_eval_rows(tiny_bundles, tmp_path, offline):
    """Two edit orders spread over two shards: the merge holds every lm_eval row an unsharded run writes (the same
    keys, metrics and order) and is complete; a shard that lost a row leaves the merge incomplete, naming it."""
    lm_eval_or_skip()
    from editscope.run.merge import merge_runs

    tasks = write_task(tmp_path / "tasks")
    raw = lifelong_config(tmp_path, {"tasks": [TASK], "include_path": str(tasks), "checkpoints": [0, 3]})
    raw["mode"]["sequential_batches"]["orders"] = 2
    config = parse_config(raw)

    def run(name, shard=(0, 1)):
        Runner(config, out_dir=tmp_path / name, shard=shard, bundle=tiny_bundles["llama"], progress=False,
               log=lambda _m: None).run()

    def lm_rows(name):
        rows = [json.loads(line) for line in (tmp_path / name / LM_EVAL_FILE).read_text().splitlines()]
        return [(r["dataset"], r["method"], r["edits_applied"], r["task"], r["metrics"]) for r in rows]

    run("whole")
    run("s0", (0, 2))
    run("s1", (1, 2))
    assert {r[0] for r in lm_rows("s0")} != {r[0] for r in lm_rows("s1")}  # each shard ran one order's chain
    merge_runs(tmp_path / "merged", [tmp_path / "s0", tmp_path / "s1"])
    assert lm_rows("merged") == lm_rows("whole")
    assert [r[:3] for r in lm_rows("whole")] == [(None, "none", 0), ("counterfact", "rome", 3),
                                                 ("counterfact~order1", "rome", 3)]
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["status"] == "complete"

    lines = (tmp_path / "s1" / LM_EVAL_FILE).read_text().splitlines(keepends=True)
    (tmp_path / "s1" / LM_EVAL_FILE).write_text("".join(line for line in lines if "order1" not in line))
    merge_runs(tmp_path / "lacking", [tmp_path / "s0", tmp_path / "s1"])
    meta = json.loads((tmp_path / "lacking" / "run.json").read_text())
    assert meta["status"] == "incomplete"
    assert any("2 of 3 planned lm_eval.jsonl rows (1 missing, the first: task editscope_tiny_mc at 3 edit(s) "
               "(dataset counterfact~order1" in p for p in meta["problems"])
