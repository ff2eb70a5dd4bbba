"""The benchmark scripts run end to end on a tiny model and print their ratios (no timing assertions: the
numbers depend on the machine; the scripts' own agreement checks still fail the run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_bench_edit_runs_on_two_records():
    out = _run("bench_edit.py", "--cases", "2", "--model", "tiny-llama", "--threads", "1", "--profile-top", "3")
    for method in ("rome", "memit", "alphaedit"):
        assert f"{method} speedup " in out
        assert f"{method}: (a) editscope " in out
    assert "rome batched speedup " in out and "memit batched speedup " in out  # (c): v* of the records batched


@pytest.mark.slow
def test_bench_wild_runs_and_agrees_with_the_naive_loop():
    out = _run("bench_wild.py", "--model", "tiny-llama", "--cases", "2", "--max-new-tokens", "6", "--threads", "1")
    assert "answers equal on all" in out  # the script exits non-zero when the batched answers differ
    assert "wild vs naive speedup " in out and "wild / teacher-forced cost " in out
    assert "wild vs batched generate speedup " in out


@pytest.mark.slow
def test_bench_stats_runs():
    out = _run("bench_stats.py", "--model", "tiny-llama", "--tokens", "512", "--seq-len", "64", "--layers", "1,2",
               "--rounds", "1", "--threads", "1")
    assert "token rate ratio " in out and "speedup " in out


@pytest.mark.slow
def test_bench_run_runs_on_two_records():
    out = _run("bench_run.py", "--cases", "1", "--model", "tiny-llama", "--threads", "1")
    assert "fast: 6 edits" in out  # 3 methods x (1 CounterFact + 1 zsRE case), one result row each
    assert "edits per minute" in out


@pytest.mark.slow
def test_bench_lifelong_runs_on_tiny_batches():
    out = _run("bench_lifelong.py", "--model", "tiny-llama", "--batch", "3", "--rounds", "2", "--z-batch", "3",
               "--threads", "1")
    assert "(b) ratio " in out and "relative ΔW difference" in out
    flop_ratio = float(out.split("FLOP ratio ")[1].split()[0].rstrip(","))
    assert flop_ratio > 1  # the suffix, not whole rows, runs each step
    assert "(a) alphaedit: 6 edits in 2 batches of 3" in out and "edits/min" in out
    assert "(c) peak RSS after 3 edits" in out and "(c) peak RSS after 6 edits" in out


@pytest.mark.slow
def test_bench_lifelong_compares_ultraedit_with_alphaedit_and_times_checkpoints():
    out = _run("bench_lifelong.py", "--model", "tiny-llama", "--parts", "uk", "--u-batch", "4", "--k-edits", "8,40",
               "--k-batch", "4", "--k-every", "1", "--k-reprobe", "6", "--threads", "1")
    per = {name: float(out.split(f"(u) {name}: ")[1].split("= ")[1].split()[0]) for name in ("alphaedit", "ultraedit")}
    ratio = float(out.split("(u) ratio ")[1].split()[0])
    assert ratio == pytest.approx(per["alphaedit"] / per["ultraedit"], rel=0.05)
    # the stream config's checkpoint after 8 edits (batches of 4, one per checkpoint, sample of 6): the batch just
    # written plus all 4 earlier cases; after 40: the batch plus the 6 of the sample
    assert "(k) 8 edits applied, config case set: 8 cases probed" in out
    assert "(k) 40 edits applied, config case set: 10 cases probed" in out
    assert "(k) 40 edits applied, fixed case set: 8 cases probed" in out
    assert "(k) ratio config " in out and "(k) ratio fixed " in out
    assert "weights " in out.split("(k) 40 edits applied, config")[1].splitlines()[0]


@pytest.mark.slow
def test_bench_device_runs_every_asked_editor_and_precision():
    out = _run("bench_device.py", "--model", "tiny-llama", "--device", "cpu", "--cases", "2",
               "--methods", "rome,ft", "--dtypes", "bfloat16")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["rome"], ["ft"])}
    assert set(rows) == {"rome", "ft"} and all(r[-1] == "bit-exact" for r in rows.values())
    assert float(rows["rome"][1]) > 0 and rows["rome"][2] == "nan"  # s/edit measured; no CUDA peak on a CPU
    assert out.splitlines()[-1].startswith("bfloat16") and out.rstrip().endswith("revert bit-exact")


def test_bench_stats_reads_prints_both_ways_and_reads_equal_values():
    out = _run("bench_stats_reads.py", "--d-ff", "256", "--layers", "1,2", "--tokens", "128", "--rounds", "1")
    lines = out.splitlines()
    assert lines[-1].startswith("speedup ") and float(lines[-1].split()[1]) > 0  # values checked bit-equal inside
    assert any(line.startswith("every read verified") for line in lines)


@pytest.mark.slow
def test_gpu_check_big_part_runs_dry_and_records_the_plan_beside_the_edit(tmp_path):
    import json

    _run("gpu_check.py", "--part", "big", "--dry", "--device", "cpu", "--out", str(tmp_path), "--seconds", "1",
         "--stats-tokens", "128", "--v-steps", "1")
    rows = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in rows]
    assert kinds[:3] == ["device", "big_model", "rates"] and kinds.count("big_edit") == 1  # then out of time
    edit = next(r for r in rows if r["kind"] == "big_edit")
    assert edit["method"] == "memit" and edit["layers"] == [4, 5, 6, 7, 8] and edit["revert_bit_equal"]
    assert edit["predicted_peak_mib"] > 0 and edit["warm_s"] > 0 and edit["plain_vstar1_s"] > 0
    assert [r["method"] for r in rows if r["kind"] == "skipped"] == ["rome", "ultraedit", "alphaedit"]


@pytest.mark.slow
def test_gpu_check_lifelong_part_runs_an_editor_that_writes_no_weight(tmp_path):
    """A retrieval chain through the runner: checkpoint rows with ES/PS/NS and no weights suite (no ΔW to measure)."""
    import json

    _run("gpu_check.py", "--part", "lifelong", "--method", "retrieval", "--dry", "--device", "cpu", "--out",
         str(tmp_path), "--seconds", "45")
    config = json.loads((tmp_path / "lifelong-retrieval.yaml").read_text())
    assert config["datasets"][0]["suites"] == ["counterfact"]
    row = next(json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] == "lifelong")
    assert row["method"] == "retrieval" and row["curve"], row
    point = row["curve"][0]
    assert 0 <= point["ES"] <= 1 and point["NormGrowth"] is None and point["edit_s_last_round"] is not None


def test_bench_codebook_places_and_searches_as_the_baseline_does():
    out = _run("bench_codebook.py", "--sizes", "200", "--place", "20", "--repeats", "1")
    lines = out.splitlines()  # placements and nearest keys checked equal to the baseline's inside
    assert [line.split()[0] for line in lines] == ["place", "search"]
    assert all(float(line.rsplit("ratio ", 1)[1]) > 0 for line in lines)
