"""The runner on a tiny model with real editors: resume after a kill, torn last line, recomputable metrics,
shard + merge, restored weights, group modes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from editscope.edit.patch import tensor_checksum
from editscope.errors import EditscopeError
from editscope.run import Runner, merge_runs, parse_config, read_results, recompute_metrics
from editscope.run.runner import timing_free
from editscope.run.store import dumps_row, dumps_run_json
from tests.run.helpers import SUITES, base_config


def config(**changes):
    return parse_config(base_config(**changes), suites=SUITES)


def weights(bundle) -> dict[str, str]:
    return {name: tensor_checksum(p) for name, p in bundle.model.named_parameters()}


def run_into(out: Path, bundle, cfg=None, **kw):
    kw.setdefault("log", lambda _m: None)
    return Runner(cfg or config(), out_dir=out, bundle=bundle, suite_factories=SUITES, progress=False, **kw).run()


class Kill(Exception):
    pass


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_llama):
    """An uninterrupted run: 3 cases x 2 methods."""
    before = weights(tiny_llama)
    out = tmp_path_factory.mktemp("ref")
    result = run_into(out, tiny_llama)
    assert weights(tiny_llama) == before
    return out, result


def test_reference_run_files(reference):
    out, result = reference
    rows = read_results(out / "results.jsonl")
    assert result.written == 6 and len(rows) == 6
    assert [(r["case_id"], r["method"]) for r in rows][:2] == [(rows[0]["case_id"], "rome"),
                                                                 (rows[0]["case_id"], "memit")]
    row = rows[0]
    assert set(row) >= {"dataset", "case_id", "method", "mode", "edit_seconds", "metrics", "pre", "post"}
    assert row["mode"] == "single" and row["edit_seconds"] > 0
    assert set(row["metrics"]["rewrite_es"]) == {"ES", "PS", "dlogp_new"}
    # pre-edit probes are computed once per case and shared by the methods; the edits change the post probes
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        assert a["case_id"] == b["case_id"] and a["pre"] == b["pre"]
        assert a["post"] != a["pre"] and b["post"] != b["pre"]
    assert all(r["metrics"]["rewrite_es"]["dlogp_new"] != 0 for r in rows)
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and meta["rows"] == 6
    assert set(meta["versions"]) >= {"editscope", "torch", "transformers", "numpy"}
    assert meta["model"]["fingerprint"]
    csv = (out / "summary.csv").read_text().splitlines()
    assert csv[0] == "dataset,suite,method,metric,n,mean,ci95_low,ci95_high,std,ci"
    es_rome = next(line for line in csv if ",rome,ES," in line).split(",")
    es = [r["metrics"]["rewrite_es"]["ES"] for r in rows if r["method"] == "rome"]
    assert int(es_rome[4]) == 3 and float(es_rome[5]) == pytest.approx(sum(es) / 3)
    assert "## rewrite_es on counterfact" in (out / "summary.md").read_text()


def test_metrics_recompute_from_raw_probes(reference):
    out, _ = reference
    assert recompute_metrics(out, suite_factories=SUITES) == []
    # and a tampered stored value is detected
    lines = (out / "results.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["metrics"]["rewrite_es"]["dlogp_new"] += 1.0
    tampered = out.parent / "tampered"
    tampered.mkdir()
    (tampered / "run.json").write_text((out / "run.json").read_text())
    # sealed again (a writer that stored a wrong number): the digest vouches for it, recomputation does not
    (tampered / "results.jsonl").write_text("\n".join([dumps_row(row)] + lines[1:]) + "\n")
    bad = recompute_metrics(tampered, suite_factories=SUITES)
    assert len(bad) == 1 and bad[0][0][2] == "rome"


def test_kill_and_torn_line_then_resume_equals_uninterrupted(reference, tmp_path, tiny_llama):
    ref_out, _ = reference
    before = weights(tiny_llama)
    seen = []

    def kill_after_three(row):
        seen.append(row)
        if len(seen) == 3:  # the middle of case 2: rome done, memit not
            raise Kill

    with pytest.raises(Kill):
        run_into(tmp_path, tiny_llama, on_row=kill_after_three)
    assert weights(tiny_llama) == before  # restored although the run died
    assert len(read_results(tmp_path / "results.jsonl")) == 3
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "interrupted"
    # a kill in the middle of writing the 4th line
    with open(tmp_path / "results.jsonl", "a") as fh:
        fh.write('{"dataset": "counterfact", "case_id": "x", "meth')
    result = run_into(tmp_path, tiny_llama)
    assert result.skipped == 3 and result.written == 3
    got = read_results(tmp_path / "results.jsonl")
    want = read_results(ref_out / "results.jsonl")
    assert [timing_free(r) for r in got] == [timing_free(r) for r in want]
    assert (tmp_path / "results.jsonl").read_text().endswith("}\n")
    # a third run has nothing to do
    assert run_into(tmp_path, tiny_llama).written == 0


def test_shard_and_merge_equal_unsharded(reference, tmp_path, tiny_llama):
    ref_out, _ = reference
    shards = []
    for i in range(2):
        out = tmp_path / f"shard{i}"
        run_into(out, tiny_llama, shard=(i, 2))
        shards.append(out)
    assert [len(read_results(s / "results.jsonl")) for s in shards] == [4, 2]
    n, _ = merge_runs(tmp_path / "merged", shards + [shards[0]])  # a repeated shard is deduplicated
    assert n == 6
    got = read_results(tmp_path / "merged" / "results.jsonl")
    want = read_results(ref_out / "results.jsonl")
    assert [timing_free(r) for r in got] == [timing_free(r) for r in want]
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["status"] == "complete"
    with pytest.raises(EditscopeError, match="already holds"):
        merge_runs(tmp_path / "merged", shards)


def test_merge_refuses_other_config_or_model(reference, tmp_path):
    ref_out, _ = reference
    for field, value, message in (("config_digest", "0" * 24, "different config"),
                                  ("model", {"name": "x", "fingerprint": "f" * 32}, "fingerprint")):
        other = tmp_path / field
        shutil.copytree(ref_out, other)
        meta = json.loads((other / "run.json").read_text())
        meta[field] = value
        (other / "run.json").write_text(dumps_run_json(meta))
        with pytest.raises(EditscopeError, match=message):
            merge_runs(tmp_path / f"m-{field}", [ref_out, other])


def test_resume_refuses_other_config(reference, tiny_llama):
    ref_out, _ = reference
    with pytest.raises(EditscopeError, match="different config"):
        run_into(ref_out, tiny_llama, cfg=config(seed=5))


def test_resume_refuses_rows_of_another_device(reference, tmp_path, tiny_llama):
    """The fingerprint ignores the device but a row's last bits do not: resuming a CPU run on CUDA (or back) would
    mix them silently, so run.json records the device and a resume on another one is refused."""
    ref_out, _ = reference
    assert json.loads((ref_out / "run.json").read_text())["model"]["device"] == tiny_llama.device.type
    other = tmp_path / "other"
    shutil.copytree(ref_out, other)
    meta = json.loads((other / "run.json").read_text())
    meta["model"]["device"] = "cuda" if tiny_llama.device.type == "cpu" else "cpu"
    (other / "run.json").write_text(dumps_run_json(meta))
    with pytest.raises(EditscopeError, match=f"computed on {meta['model']['device']}, this run is on"):
        run_into(other, tiny_llama)
    del meta["model"]["device"]  # a run.json written before the device was recorded resumes as before
    (other / "run.json").write_text(dumps_run_json(meta))
    assert run_into(other, tiny_llama).written == 0


def test_torch_threads_recorded_and_a_resume_with_another_count_is_said(reference, tmp_path, tiny_llama):
    """A CPU matmul's last bits depend on the thread count, so run.json records the counts its rows were computed
    with: a resume under another count goes on (cores are not an experiment setting), says so in one line and
    records both; a merge keeps every shard's."""
    ref_out, _ = reference
    here = torch.get_num_threads()
    assert json.loads((ref_out / "run.json").read_text())["torch_threads"] == [here]
    other = tmp_path / "other"
    shutil.copytree(ref_out, other)
    lines = (other / "results.jsonl").read_text().splitlines()
    (other / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # one row left to compute
    meta = json.loads((other / "run.json").read_text())
    (other / "run.json").write_text(dumps_run_json(meta | {"torch_threads": [here + 3]}))
    said: list[str] = []
    assert run_into(other, tiny_llama, log=said.append).written == 1
    notes = [m for m in said if "torch thread" in m]
    assert len(notes) == 1 and f"computed with {here + 3} torch thread(s), this session runs {here}" in notes[0]
    assert json.loads((other / "run.json").read_text())["torch_threads"] == [here + 3, here]
    said.clear()
    assert run_into(other, tiny_llama, log=said.append).written == 0  # the count is known now: nothing said
    assert not [m for m in said if "torch thread" in m]
    merge_runs(tmp_path / "merged", [ref_out, other])
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["torch_threads"] == [here, here + 3]


@pytest.mark.parametrize("mode", [{"batch": 2}, {"sequential": 2}])
def test_group_modes(mode, tmp_path, tiny_llama):
    before = weights(tiny_llama)
    method = "alphaedit" if "sequential" in mode else "memit"
    cfg = config(mode=mode, methods=[{"name": method, "overrides": {"v_steps": 2}}], slice={"limit": 3})
    run_into(tmp_path, tiny_llama, cfg=cfg)
    assert weights(tiny_llama) == before
    rows = read_results(tmp_path / "results.jsonl")
    name, n = next(iter(mode.items()))
    assert {r["mode"] for r in rows} == {f"{name}:{n}"}
    assert [(r["group"], r["group_size"]) for r in rows if r["method"] == method] == [(0, 2), (0, 2), (1, 1)]
    if name == "batch":  # one edit for the group: one edit time
        assert rows[0]["edit_seconds"] == rows[1]["edit_seconds"]
    assert recompute_metrics(tmp_path, suite_factories=SUITES) == []


def test_limit(tmp_path, tiny_llama):
    result = run_into(tmp_path, tiny_llama, cfg=config(methods=["rome"]), limit=1)
    assert result.total_rows == 1
