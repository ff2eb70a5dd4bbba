"""Torn or missing rows are never "complete": the plan of a run (editscope.run.planned) equals the keys of a real
run's rows; ``merge`` of a shard with a torn last line or a lost row marks the merged run incomplete, naming the file
and line and counting the missing rows, and a merge after the shard's resume is complete; a ``models`` rerun
resumes a model whose run.json says complete but whose results lost a row; the report says ``n of N planned``; a
lost ``lm_eval.jsonl`` row is computed again on resume (tiny-llama, real ROME/MEMIT, the real Runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editscope.report import build_report
from editscope.run import Runner, merge_runs, parse_config, read_results
from editscope.run.lmeval import LM_EVAL_FILE
from editscope.run.models import run_models
from editscope.run.planned import count_rows, plan_run
from editscope.run.runner import timing_free
from editscope.run.store import row_key
from tests.run.helpers import SUITES, base_config

QUIET = dict(suite_factories=SUITES, progress=False, log=lambda _m: None)


def config(**changes):
    return parse_config(base_config(**changes), suites=SUITES)


def meta(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def drop_line(path: Path, index: int) -> dict:
    lines = path.read_text().splitlines(keepends=True)
    gone = json.loads(lines.pop(index))
    path.write_text("".join(lines))
    return gone


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_llama):
    """A 2-way sharded run of 3 cases x 2 methods (4 + 2 rows) and the unsharded run."""
    root = tmp_path_factory.mktemp("shards")
    for i in range(2):
        Runner(config(), out_dir=root / f"s{i}", bundle=tiny_llama, shard=(i, 2), **QUIET).run()
    Runner(config(), out_dir=root / "whole", bundle=tiny_llama, **QUIET).run()
    return root


def test_plan_equals_the_rows_a_run_writes(shards):
    rows = read_results(shards / "whole" / "results.jsonl")
    plan = plan_run(config(), suite_factories=SUITES)
    assert list(plan.rows) == [row_key(r) for r in rows] and len(plan.rows) == 6
    assert [len(plan_run(config(), shard=(i, 2), suite_factories=SUITES).rows) for i in range(2)] == [4, 2]
    assert meta(shards / "whole")["planned_rows"] == 6 and meta(shards / "s1")["planned_rows"] == 2
    count = count_rows(shards / "whole", plan)
    assert count.complete and count.present == 6 and count.line("x") == ""


def test_lifelong_plan_holds_the_checkpoint_rows(tmp_path, tiny_llama):
    cfg = config(mode={"sequential_batches": {"batch": 1, "rounds": 3, "checkpoints": 1}},
                 methods=[{"name": "rome", "overrides": {"v_steps": 2}}])
    Runner(cfg, out_dir=tmp_path, bundle=tiny_llama, **QUIET).run()
    rows = read_results(tmp_path / "results.jsonl")
    plan = plan_run(cfg, suite_factories=SUITES)
    assert sorted(plan.rows) == sorted(row_key(r) for r in rows)
    assert len(plan.rows) == 3 + 1 + 2 and plan.longest_chain == 3  # final rows, checkpoints after rounds 1 and 2


def test_merge_of_a_torn_shard_is_incomplete_until_the_shard_resumes(shards, tmp_path, tiny_llama):
    torn = tmp_path / "s0"
    import shutil

    shutil.copytree(shards / "s0", torn)
    path = torn / "results.jsonl"
    text = path.read_text()
    lost = json.loads(text.splitlines()[-1])
    path.write_text(text[: -len(text.splitlines()[-1]) // 2 - 1])  # a write killed halfway: no newline
    said: list[str] = []
    n, _ = merge_runs(tmp_path / "m", [torn, shards / "s1"], suite_factories=SUITES, log=said.append)
    m = meta(tmp_path / "m")
    assert n == 5 and m["status"] == "incomplete" and m["missing_rows"] == 1 and m["planned_rows"] == 6
    assert said == m["problems"] and len(said) == 2
    assert said[0].startswith(f"{path}:line 4: a torn last line") and "\n" not in said[0]
    assert f"dataset counterfact, case {lost['case_id']}, method {lost['method']}" in said[1]
    assert "5 of 6 planned rows (1 missing" in said[1]
    # the shard's resume computes the lost row; merging again into the same folder gives the unsharded rows
    assert Runner(config(), out_dir=torn, bundle=tiny_llama, shard=(0, 2), **QUIET).run().written == 1
    said.clear()
    assert merge_runs(tmp_path / "m", [torn, shards / "s1"], suite_factories=SUITES, log=said.append)[0] == 6
    assert said == [] and meta(tmp_path / "m")["status"] == "complete" and meta(tmp_path / "m")["missing_rows"] == 0
    assert [timing_free(r) for r in read_results(tmp_path / "m" / "results.jsonl")] == [
        timing_free(r) for r in read_results(shards / "whole" / "results.jsonl")]


def test_merge_with_a_row_gone_from_the_middle_is_incomplete(shards, tmp_path):
    import shutil

    short = tmp_path / "s1"
    shutil.copytree(shards / "s1", short)
    gone = drop_line(short / "results.jsonl", 0)  # whole lines only: nothing torn, one row missing
    said: list[str] = []
    merge_runs(tmp_path / "m", [shards / "s0", short], suite_factories=SUITES, log=said.append)
    m = meta(tmp_path / "m")
    assert m["status"] == "incomplete" and m["missing_rows"] == 1 and m["rows"] == 5
    assert said == [f"merge: 5 of 6 planned rows (1 missing, the first: dataset counterfact, case "
                    f"{gone['case_id']}, method {gone['method']})"]


def test_models_rerun_recomputes_a_lost_row_and_the_report_says_it(tmp_path):
    data = base_config(methods=[{"name": "rome", "overrides": {"v_steps": 2}}], slice={"offset": 0, "limit": 2},
                       output=str(tmp_path / "out"))
    data.pop("model")
    data["models"] = ["tiny-llama"]
    cfg = parse_config(data, where="m.yaml", suites=SUITES)
    run_models(cfg, **QUIET)
    run_dir = tmp_path / "out" / "tiny-llama"
    whole = read_results(run_dir / "results.jsonl")
    gone = drop_line(run_dir / "results.jsonl", 1)
    assert meta(run_dir)["status"] == "complete"  # run.json alone would call it finished
    _, md = build_report([tmp_path / "out"], suite_factories=SUITES)
    assert "- **rows**: 1 of 2 planned (1 missing: resume the run to compute them)" in md.read_text()
    said: list[str] = []
    runs = run_models(cfg, suite_factories=SUITES, progress=False, log=said.append)
    assert runs[0].result is not None and runs[0].result.written == 1 and runs[0].result.skipped == 1
    assert f"{run_dir}: 1 of 2 planned rows (1 missing, the first: dataset counterfact, case {gone['case_id']}, " \
           "method rome); run.json says complete: resuming" in said
    assert [timing_free(r) for r in read_results(run_dir / "results.jsonl")] == [timing_free(r) for r in whole]
    _, md = build_report([tmp_path / "out"], suite_factories=SUITES)
    assert "- **rows**: 2\n" in md.read_text()
    assert run_models(cfg, **QUIET)[0].result is None  # whole again: skipped


def test_a_lost_lm_eval_row_is_computed_again_on_resume(tmp_path, tiny_llama, monkeypatch):
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness not installed (pip install 'editscope[lmeval]')")
    from tests.run.test_lmeval import TASK, write_task

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tasks = write_task(tmp_path / "tasks")
    cfg = config(mode={"sequential_batches": {"batch": 1, "rounds": 3, "checkpoints": 1}},
                 methods=[{"name": "rome", "overrides": {"v_steps": 2}}],
                 lm_eval={"tasks": [TASK], "include_path": str(tasks), "checkpoints": [0, 1, 3]})
    out = tmp_path / "run"
    Runner(cfg, out_dir=out, bundle=tiny_llama, **QUIET).run()
    lm_path = out / LM_EVAL_FILE
    before = [json.loads(line) for line in lm_path.read_text().splitlines()]
    assert [(r["method"], r["edits_applied"]) for r in before] == [("none", 0), ("rome", 1), ("rome", 3)]
    plan = plan_run(cfg, suite_factories=SUITES)
    assert [k[2:4] for k in plan.lm_eval] == [("none", 0), ("rome", 1), ("rome", 3)]
    results = (out / "results.jsonl").read_text()
    gone = drop_line(lm_path, 1)  # the row after round 1 of the chain, whose final rows are all written
    count = count_rows(out, plan)
    assert not count.complete and count.line(out) == (
        f"{out}: 2 of 3 planned {LM_EVAL_FILE} rows (1 missing, the first: task {TASK} at 1 edit(s) (dataset "
        "counterfact, group 0, method rome))")
    said: list[str] = []
    result = Runner(cfg, out_dir=out, bundle=tiny_llama, suite_factories=SUITES, progress=False,
                    log=said.append).run()
    assert result.written == 0 and (out / "results.jsonl").read_text() == results  # no results row twice
    after = [json.loads(line) for line in lm_path.read_text().splitlines()]
    assert [(r["method"], r["edits_applied"]) for r in after] == [("none", 0), ("rome", 3), ("rome", 1)]
    assert after[2]["metrics"] == pytest.approx(gone["metrics"])  # the same chain, edited again the same way
    assert count_rows(out, plan).complete and meta(out)["status"] == "complete"
