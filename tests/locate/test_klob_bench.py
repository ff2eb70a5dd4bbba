"""The KLoB bench on a tiny model: resumable, and every number recomputed from the saved scores."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from editscope.lm.engine import ScoringEngine
from editscope.locate.klob_bench import compute_metrics, group_rsim, load_scores, run_bench
from editscope.metrics.klob import rsd, rsim, sim

# builds KLoB from the whole shared PEAK-CF / MQuAKE-hard files (seconds each) and runs the bench three times
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    from editscope.lm import load

    return ScoringEngine(load("tiny-llama"))


def test_bench_resumes_and_recomputes(engine, tmp_path):
    kwargs = dict(methods=["activation", "random"], ks=[1, 10], n=3, recall="none", recall_r="none")
    metrics = run_bench(engine, tmp_path, **kwargs)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 9  # 2 methods x 3 examples x 3 subsets
    # a rerun skips every finished (example, method) and gives the same numbers
    assert run_bench(engine, tmp_path, **kwargs) == metrics
    assert (tmp_path / "results.jsonl").read_text().splitlines() == lines
    # resuming after losing the last line recomputes only that example
    (tmp_path / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    assert run_bench(engine, tmp_path, **kwargs) == metrics
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(lines)
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert "| random |" in (tmp_path / "table.md").read_text() and (tmp_path / "figure.png").stat().st_size > 0

    # independent recomputation of RSim (consistency, k=10) and RSD for one method from the score files
    scores = load_scores(tmp_path)["activation"]
    groups = scores["c"]
    mean = np.mean([r for g in groups for r in g], axis=0)
    naive = []
    for g in groups:
        pairs = [sim(g[i], g[j], 10) for i in range(3) for j in range(i + 1, 3)]
        naive.append(rsim(np.mean(pairs), np.mean([sim(mean, r, 10) for r in g])))
    assert metrics["methods"]["activation"]["consistency"]["10"] == pytest.approx(np.mean(naive))
    assert group_rsim(groups, 10) == pytest.approx(np.mean(naive))
    factual = [r for s in "cr" for g in scores[s] for r in g]
    assert metrics["methods"]["activation"]["rsd"] == pytest.approx(rsd(factual, [g[0] for g in scores["u"]]))
    # the l1 scale by a plain loop: mean SD of each result over its L1 norm, factual vs KLoB-u
    def mean_l1_sd(results):
        return np.mean([np.std(r.ravel() / np.abs(r).sum()) for r in results])

    naive_l1 = max(1 - mean_l1_sd([g[0] for g in scores["u"]]) / mean_l1_sd(factual), 0)
    assert metrics["methods"]["activation"]["rsd_l1"] == pytest.approx(naive_l1)
    assert compute_metrics(tmp_path, [1, 10]) == metrics
    # the random baseline stays near zero
    assert metrics["methods"]["random"]["consistency"]["10"] < 0.1


def test_bench_refuses_a_folder_of_another_run(engine, tmp_path):
    from editscope.errors import EditscopeError

    kwargs = dict(methods=["random"], ks=[5], recall="none", recall_r="none")
    run_bench(engine, tmp_path, n=2, **kwargs)
    with pytest.raises(EditscopeError, match="field n"):
        run_bench(engine, tmp_path, n=3, **kwargs)
    with pytest.raises(EditscopeError, match="field recall_r"):
        run_bench(engine, tmp_path, n=2, **{**kwargs, "recall_r": "first"})
    # a folder written before recall_r existed: --recall none lifted KLoB-r's filter too, so it resumes as "none"
    config = json.loads((tmp_path / "config.json").read_text())
    del config["recall_r"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    run_bench(engine, tmp_path, n=2, **kwargs)
    assert json.loads((tmp_path / "config.json").read_text())["recall_r"] == "none"
    # ... while any other --recall kept both facts of a pair: "all" (config still lacks recall_r)
    (tmp_path / "config.json").write_text(json.dumps({**config, "recall": "any"}))
    with pytest.raises(EditscopeError, match="field recall_r: this folder holds a run with 'all'"):
        run_bench(engine, tmp_path, n=2, **{**kwargs, "recall": "any"})


def test_groups_at_the_baseline_count_as_zero(tmp_path):
    from editscope.locate.klob_bench import _npy_bytes, format_table, group_rsims

    # 10 "neurons", k = 10% selects one; two groups pick neuron 0 like the pool mean (4/6 of the mass), one picks 5
    def one_hot(i):
        return np.eye(10)[i]

    groups = [np.stack([one_hot(0), one_hot(0)]), np.stack([one_hot(0), one_hot(0)]), np.stack([one_hot(5)] * 2)]
    # by hand: groups 0-1 have Sim_all = Sim_cand = 1 (RSim 0/0); group 2 has Sim_cand 1, Sim_all 0 -> RSim 1
    assert group_rsims(groups, 10) == [None, None, 1.0]
    assert group_rsim(groups, 10) == pytest.approx(1 / 3)
    # the same groups as a bench folder's KLoB-c score files: compute_metrics counts the two groups at the baseline
    rows = []
    for i, g in enumerate(groups):
        data = _npy_bytes(g.astype(np.float32))
        (tmp_path / f"c{i}.npy").write_bytes(data)
        rows.append({"subset": "c", "example_id": f"c:{i}", "method": "m", "file": f"c{i}.npy",
                     "sha256": hashlib.sha256(data).hexdigest()})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = compute_metrics(tmp_path, [10])
    row = metrics["methods"]["m"]
    assert row["consistency"]["10"] == pytest.approx(1 / 3) and row["at_baseline"]["consistency"]["10"] == 2
    assert row["relevance"]["10"] is None and row["rsd"] is None
    table = format_table(metrics)
    assert "| m | 0.333 [2] | – | – | – | 3/0/0 |" in table and "count as RSim 0" in table
