"""Scoring under a context edit: the engine's shared opening against the previous threshold, same process.

A retrieval edit (BM25, k facts before each prompt, EasyEdit's PROMPT layout) over the first 1,000 CounterFact-stream
facts is put in force on SmolLM2, and the counterfact suite probes N stream cases, as a lifelong chain's checkpoint
does. (a) the engine as it is (:attr:`ScoringEngine.share_prefix_min` 12: every prompt's context opens with the
same instruction, forwarded once per tree row); (b) the same engine with the threshold at 32 tokens, its earlier
value (the instruction alone is too short to share; contexts share a row only when they state the same first fact).
Both read the LM head only where a continuation token is read. The rows are checked to agree to 1e-4 (relative; the
engine's tolerance against a plain forward), each variant is timed twice, alternating, and the last line printed is
``speedup X.XX`` = time(b) / time(a) (their best times). Measured (SmolLM2, one thread beside two other jobs, 30
cases): k 1 1.58, k 4 0.99.

    python benchmarks/bench_context.py --cases 30 --k 1 [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from editscope.data import load_cases
from editscope.edit.context_edit import ContextStore, fact_text
from editscope.edit.retrieval import RetrievalHParams, edit_of
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.suites.counterfact import CounterFactSuite


def numbers(rows: list[dict]) -> list[float]:
    """Every number in the suite's rows, in order (nested lists and dicts walked)."""
    out: list[float] = []

    def walk(value) -> None:
        if isinstance(value, int | float):  # bool too
            out.append(float(value))
        elif isinstance(value, dict):
            for key in sorted(value):
                walk(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load("smollm2-135m")
    stream = load_cases("counterfact-stream", limit=1000)
    store = ContextStore()
    store.add([fact_text(c.requests[0]) for c in stream])
    bundle.add_context(edit_of(bundle, [stream[0].requests[0]], RetrievalHParams(k=args.k), store))
    cases = stream[:: max(1, 1000 // args.cases)][: args.cases]
    suite = CounterFactSuite()
    now = ScoringEngine.share_prefix_min
    times: dict[int, list[float]] = {now: [], 32: []}
    rows: dict[int, list[dict]] = {}
    for _ in range(2):
        for threshold in (now, 32):
            engine = ScoringEngine(bundle)
            engine.share_prefix_min = threshold
            start = time.perf_counter()
            rows[threshold] = suite.probe_many(engine, cases)
            times[threshold].append(time.perf_counter() - start)
            print(f"share_prefix_min {threshold}: {times[threshold][-1]:.1f} s", flush=True)
    a, b = numbers(rows[now]), numbers(rows[32])
    assert len(a) == len(b) and a, "the two variants gave different rows"
    worst, at = max((abs(x - y) / max(1.0, abs(x)), i) for i, (x, y) in enumerate(zip(a, b, strict=True)))
    print(f"largest difference at number {at} of {len(a)}: {a[at]!r} against {b[at]!r}")
    assert worst <= 1e-4, f"rows differ by {worst} (relative)"
    print(f"{args.cases} cases, retrieval k {args.k}, {args.threads} thread(s); rows agree within {worst:.1e} "
          "(relative, float rounding of other forward shapes)")
    print(f"speedup {min(times[32]) / min(times[now]):.2f}")


if __name__ == "__main__":
    main()
