"""``editscope bench``: benchmarks of the model itself, before any edit. ``bench klob`` scores knowledge-locating
methods on KLoB (paper 001): RSim (consistency, relevance) per k and RSD."""

from __future__ import annotations

import argparse
import sys

from editscope.commands._device import add_device_arguments
from editscope.ranges import Range, option

HELP = "benchmarks of the unedited model (klob: locating methods)"


def register(sub: argparse._SubParsersAction) -> None:
    from editscope.locate import METHODS, OPTION_RANGES
    from editscope.locate.klob_bench import RANGES

    parser = sub.add_parser("bench", help=HELP)
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    klob = benches.add_parser(
        "klob",
        help="score locating methods on KLoB (RSim consistency/relevance, RSD)",
        description="Build KLoB-c/-r/-u from the shared data, keep n examples per subset the model recalls, "
        "locate every sentence with each method and score RSim (consistency on KLoB-c, relevance on KLoB-r) per "
        "k and RSD. Resumable: rerun with the same -o to finish; every number is recomputed from the saved "
        "scores (OUT/results.jsonl + OUT/scores/).",
    )
    klob.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    add_device_arguments(klob)
    klob.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    klob.add_argument("--k", nargs="+", type=option(float, RANGES["ks"]), default=[1, 5, 10],
                      help=f"selected shares in percent, each in {Range.parse(RANGES['ks'])}")
    klob.add_argument("--n", type=option(int, RANGES["n"]), default=50, help="examples per subset (>= 1)")
    klob.add_argument("--seed", type=int, default=0, help="order in which candidate examples are tried")
    klob.add_argument("--recall", default="any", choices=["any", "all", "first", "none"],
                      help="KLoB-c facts kept when the model recalls the answer in any/all/the first template "
                      "(none: no KLoB-c filter; --recall-r none lifts KLoB-r's)")
    klob.add_argument("--recall-r", default="all", choices=["all", "first", "any", "none"],
                      help="KLoB-r pairs kept when the model recalls both facts (all, default), the single fact "
                      "(first: the pair's entity is one the model knows), either (any), or no filter (none)")
    klob.add_argument("--shots", type=option(int, RANGES["shots"]), default=0,
                      help="in-context demonstrations for the recall filter")
    klob.add_argument("--samples", type=option(int, OPTION_RANGES["samples"][0]), default=None,
                      help="causal-tracing noise samples (bench default 5)")
    klob.add_argument("--steps", type=option(int, OPTION_RANGES["steps"][0]), default=None,
                      help="integrated-gradient steps (bench default 10)")
    klob.add_argument("-o", "--out", required=True, help="output folder (resumed when it exists)")
    klob.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")
    klob.set_defaults(func=run_klob)


def run_klob(args: argparse.Namespace) -> int:
    from editscope.lm import load
    from editscope.lm.engine import ScoringEngine
    from editscope.locate.klob_bench import format_table, run_bench

    options: dict = {}
    if args.samples is not None:
        options["causal_trace"] = {"samples": args.samples}
    if args.steps is not None:
        options["kn"] = {"steps": args.steps}
    engine = ScoringEngine(load(args.model, device=args.device, dtype=args.dtype,
                                     progress=lambda msg: print(msg, file=sys.stderr, flush=True)))
    metrics = run_bench(engine, args.out, methods=args.methods, ks=args.k, n=args.n, seed=args.seed,
                        recall=args.recall, recall_r=args.recall_r, shots=args.shots, options=options,
                        progress=not args.no_progress, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_table(metrics), end="")
    print(f"(metrics.json, table.md, figure.png in {args.out})")
    return 0
