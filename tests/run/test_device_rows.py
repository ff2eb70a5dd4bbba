"""The GPU agreement test's row comparison (tests/run/device_rows.py), on the CPU: hand-made rows with known gaps,
and two runs of one config, so the check a GPU session runs is known to work before it gets its minutes."""

from __future__ import annotations

import math

import pytest

from editscope.run import Runner, parse_config, read_results
from tests.run.device_rows import numbers, row_gaps


def row(index: int, metrics: dict) -> dict:
    return {"dataset": "counterfact", "index": index, "metrics": metrics}


def test_numeric_leaves_leave_out_timings_and_flags():
    tree = {"s": {"ES": 1.0, "edit_seconds": 3.2, "ok": True, "name": "x", "l": [0.5, {"PPL_pre": 7}]}}
    assert numbers(tree) == {"/s/ES": 1.0, "/s/l[0]": 0.5, "/s/l[1]/PPL_pre": 7.0}


def test_gaps_by_hand():
    cpu = [row(0, {"s": {"ES_pre": 0.5, "PPL_pre": 11882.309, "ES": 1.0, "PPL": 100.0, "NaN": math.nan}}),
           row(1, {"s": {"ES_pre": 0.25, "PPL_pre": 20.0, "ES": 0.0, "PPL": 50.0, "NaN": math.nan}})]
    gpu = [row(0, {"s": {"ES_pre": 0.5, "PPL_pre": 11882.312, "ES": 0.9, "PPL": 110.0, "NaN": math.nan}}),
           row(1, {"s": {"ES_pre": 0.252, "PPL_pre": 20.0, "ES": 0.0, "PPL": 50.0, "NaN": math.nan}})]
    gaps = row_gaps(cpu, gpu, pre_tol=1e-3)
    # a perplexity of ~1e4 may move by 3e-3 (relative 2.5e-7); a share may not move by 2e-3
    assert gaps.pre_misses == [("counterfact#1/s/ES_pre", 0.25, 0.252)]
    assert gaps.pre_worst == pytest.approx(0.002)
    # post: ES 0.1 (absolute, below 1), PPL 10/100 = 0.1 (relative), then two zeros
    assert sorted(gaps.post_gaps) == pytest.approx([0.0, 0.0, 0.1, 0.1])
    assert gaps.post_mean == pytest.approx(0.05)
    assert gaps.worst == pytest.approx(0.1)


def test_nan_against_a_number_and_other_keys_fail():
    with pytest.raises(AssertionError):
        row_gaps([row(0, {"ES": math.nan})], [row(0, {"ES": 1.0})], 1e-3)
    with pytest.raises(AssertionError):
        row_gaps([row(0, {"ES": 1.0})], [row(0, {"PS": 1.0})], 1e-3)
    with pytest.raises(AssertionError):
        row_gaps([row(0, {"ES": 1.0})], [row(1, {"ES": 1.0})], 1e-3)


def test_two_runs_of_one_config_have_no_gaps(tiny_bundles, tmp_path):
    config = {"model": "tiny-llama", "seed": 0, "output": "unused", "mode": "single",
              "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
              "datasets": [{"dataset": "counterfact", "slice": {"offset": 0, "limit": 1}, "suites": ["counterfact"]},
                           {"dataset": "zsre", "slice": {"offset": 0, "limit": 1}, "suites": ["zsre"]}]}
    rows = []
    for name in ("a", "b"):
        Runner(parse_config(config), out_dir=tmp_path / name, bundle=tiny_bundles["llama"], progress=False,
               log=lambda _m: None).run()
        rows.append(read_results(tmp_path / name / "results.jsonl"))
    assert any(key.endswith("_pre") for r in rows[0] for key in numbers(r["metrics"]))
    gaps = row_gaps(rows[0], rows[1], pre_tol=1e-3)
    assert not gaps.pre_misses and gaps.post_gaps and gaps.post_mean == 0.0
