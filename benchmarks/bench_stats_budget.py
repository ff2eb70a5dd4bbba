"""Statistics budget against edit quality (the FastMEMIT question) on SmolLM2-135M.

MEMIT's reference code estimates C from 100,000 Wikipedia samples (~44M tokens); FastMEMIT argues that <= 0.3 % of
that suffices. For each token budget (default: 20,480; 131,072 ≈ 0.3 % of 44M; the shipped 100,000 as the
baseline), over the shipped corpus (wikitext-2 test then valid):

1. the statistics pass of the MEMIT layers of the shipped hparams (one early-stopped pass, no cache), timed;
   ``time ratio`` = seconds / seconds of the baseline budget, measured in the same process;
2. ``editscope run`` of MEMIT (shipped hparams, ``mom2_tokens`` overridden per budget) on CounterFact records
   ``--offset``..``--offset + --cases - 1`` in one batch edit (``mode: {batch: N}``), suite ``counterfact``; the
   table prints ES/PS/NS/Score (post-edit, CounterFact probability-comparison convention, ×100) with their 95 %
   intervals (t over cases; Score: bootstrap), summarised from the run's rows as ``editscope report`` does.

``--runs DIR...`` reads finished run directories instead of running step 2 (e.g. the runs of docs/scale.md);
``--no-timing`` skips step 1. Usage:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_stats_budget.py [--cases 50] [--offset 1500] \\
        [--budgets 20480 131072 100000] [--out runs/stats-budget]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from editscope.cli import main as cli
from editscope.edit import get_editor
from editscope.lm import load
from editscope.stats import second_moments

METRICS = ("ES", "PS", "NS", "Score")


def label(budget: int) -> str:
    """The method label of a budget's rows (the runs of docs/scale.md: memit-b20k, memit-b131k, memit-b100k)."""
    return f"memit-b{round(budget / 1000)}k"


def stats_seconds(model: str, budgets: list[int]) -> tuple[dict[int, float], list[int], int]:
    """Seconds of one uncached statistics pass per budget (the MEMIT layers of the shipped hparams)."""
    bundle = load(model)
    hp = get_editor("memit").load_hparams(bundle)
    out = {}
    for budget in budgets:
        t0 = time.perf_counter()
        second_moments(bundle, hp.layers, token_budget=budget, use_cache=False, progress=False)
        out[budget] = time.perf_counter() - t0
        print(f"statistics, {budget} tokens, layers {hp.layers}: {out[budget]:.1f} s", flush=True)
    return out, list(hp.layers), hp.mom2_tokens


def run_config(model: str, budgets: list[int], cases: int, offset: int, out: Path) -> Path:
    config = {"model": model, "seed": 0, "output": str(out), "mode": {"batch": cases},
              "methods": [{"name": "memit", "label": label(b), "overrides": {"mom2_tokens": b}} for b in budgets],
              "datasets": [{"dataset": "counterfact", "slice": {"offset": offset, "limit": cases},
                            "suites": ["counterfact"]}]}
    path = Path(tempfile.mkdtemp()) / "stats-budget.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    if cli(["run", str(path)]) != 0:
        raise SystemExit("editscope run failed")
    return out


def read_summaries(runs: list[Path]) -> dict[str, dict[str, tuple[float, float, float, int]]]:
    """method label -> metric -> (mean, ci low, ci high, n) of the post-edit CounterFact metrics, summarised from
    each run's results.jsonl with its declared metrics (so an interrupted run's finished methods count too)."""
    from editscope.report.build import load_runs
    from editscope.run.suites import declared_metrics
    from editscope.run.summary import summarize

    out: dict[str, dict[str, tuple[float, float, float, int]]] = {}
    for run in load_runs([str(r) for r in runs]):
        for row in summarize(run.rows, specs=declared_metrics(run.meta, None)):
            metric, _, when = row.metric.rpartition("_")
            if row.suite != "counterfact" or metric not in METRICS:
                continue
            method = row.method if when == "post" else "unedited"  # every method's pre-edit values are the same
            out.setdefault(method, {})[metric] = (row.mean, row.ci95_low, row.ci95_high, row.n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--budgets", type=int, nargs="+", default=[20480, 131072, 100000])
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--offset", type=int, default=1500)
    parser.add_argument("--out", default="runs/stats-budget")
    parser.add_argument("--runs", nargs="*", help="finished run directories to read instead of running")
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args()
    seconds, layers, default = ({}, [], None) if args.no_timing else stats_seconds(args.model, args.budgets)
    runs = [Path(r) for r in args.runs] if args.runs else [run_config(args.model, args.budgets, args.cases,
                                                                     args.offset, Path(args.out))]
    summary = read_summaries(runs)
    base = seconds.get(default) if default in seconds else None
    print(f"\nMEMIT on {args.model}, CounterFact {args.offset}-{args.offset + args.cases - 1}, one batch edit; "
          f"statistics of layers {layers or 'of the shipped hparams'} over wikitext-2")
    print(f"{'budget':>8} {'stats s':>8} {'time ratio':>10} " + " ".join(f"{m:>16}" for m in METRICS) + "   n")
    for budget in ["unedited", *args.budgets]:
        cells = summary.get(label(budget) if budget != "unedited" else budget, {})
        ratio = f"{seconds[budget] / base:.2f}" if base and budget in seconds else "-"
        sec = f"{seconds[budget]:.1f}" if budget in seconds else "-"
        values = " ".join(f"{100 * c[0]:6.1f} [{100 * c[1]:4.1f},{100 * c[2]:5.1f}]" if (c := cells.get(m)) else
                          f"{'-':>16}" for m in METRICS)
        n = next(iter(cells.values()))[3] if cells else 0
        print(f"{budget:>8} {sec:>8} {ratio:>10} {values}   {n}")
    print(json.dumps({"seconds": seconds, "baseline_budget": default}))


if __name__ == "__main__":
    main()
