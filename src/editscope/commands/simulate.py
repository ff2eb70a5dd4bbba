"""``editscope simulate``: the 1-to-N metric simulation of paper 000 (section 4.2, Table 2, Figure 3)."""

from __future__ import annotations

import argparse
from typing import Any

from editscope.finite import cell, strict_dumps, with_reasons
from editscope.ranges import option

HELP = "simulate how NKL, MaxAcc, Precision@K and PPL follow coverage and alignment (NKL paper)"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate",
        help=HELP,
        description="Run the simulation experiment of 'Beyond 1-to-1' (NKL paper, section 4.2): answer "
        "masking for criterion 1 (coverage) and linear interpolation for criterion 2 (alignment) on "
        "Gaussian-score distributions, and print the Pearson correlation of each metric with each "
        "criterion (signed so that higher = follows the criterion) beside the paper's Table 2.",
    )
    parser.add_argument("--answers", type=option(int, "[1, 10000]"), nargs="+", default=[2, 4, 8, 16], metavar="N",
                        help="numbers of valid answers per query (default: 2 4 8 16)")
    parser.add_argument("--trials", type=option(int, "[1, 1000000]"), default=200,
                        help="simulated queries per answer count, 1 to 10^6 (default: 200)")
    parser.add_argument("--seed", type=option(int, "[0, inf)"), default=0, help="random seed (default: 0)")
    parser.add_argument("--json", action="store_true",
                        help="print only the result as one JSON object (NaN as null)")
    parser.add_argument("--plot", metavar="OUT.png", help="also draw the Figure-3-shaped curves to a PNG")
    parser.set_defaults(func=_run)


def _fmt(x: float) -> str:
    return cell(x, ".3f", "undefined")


def format_table(result: dict[str, Any]) -> str:
    """Table 2 of paper 000 (metric x criterion) with the paper's numbers beside, then the per-answer-count
    correlations (the data of Figure 3)."""
    from editscope.simulate import METRICS, PAPER_TABLE2

    labels = {"NKL": "NKL", "MaxAcc": "MaxAcc", "PrecisionK": "Precision@K", "PPL": "Perplexity"}
    lines = [
        "Pearson correlation with each criterion (higher = the metric follows it)",
        f"{'metric':<12} {'criterion 1':>11} {'criterion 2':>11}   {'paper c1':>8} {'paper c2':>8}",
    ]
    for name in METRICS:
        lines.append(
            f"{labels[name]:<12} {_fmt(result['criterion1'][name]):>11} {_fmt(result['criterion2'][name]):>11}"
            f"   {PAPER_TABLE2['criterion1'][name]:>8.3f} {PAPER_TABLE2['criterion2'][name]:>8.3f}"
        )
    lines.append("")
    lines.append("by number of valid answers (criterion 1 | criterion 2)")
    lines.append(f"{'answers':>7}  " + " ".join(f"{labels[m]:>11}" for m in METRICS) + "  | "
                 + " ".join(f"{labels[m]:>11}" for m in METRICS))
    for n, per in sorted(result["by_answers"].items(), key=lambda kv: int(kv[0])):
        c1 = " ".join(f"{_fmt(per['criterion1'][m]):>11}" for m in METRICS)
        c2 = " ".join(f"{_fmt(per['criterion2'][m]):>11}" for m in METRICS)
        lines.append(f"{n:>7}  {c1}  | {c2}")
    if "undefined" in "\n".join(lines):
        lines += ["", "undefined: a correlation over values that do not vary (e.g. one valid answer)"]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from editscope.simulate import plot_simulation, run_simulation

    result = run_simulation(answers=tuple(args.answers), trials=args.trials, seed=args.seed)
    plot = None
    if args.plot:
        from editscope.errors import EditscopeError

        try:  # the file written; an unknown extension, a folder or a device at the path: one line naming it
            plot = plot_simulation(result, args.plot)
        except OSError as exc:
            raise EditscopeError(f"{args.plot}: cannot write the plot: {exc.strerror or exc}") from None
    if args.json:
        # an undefined correlation is null, with the reason under "non_finite"
        print(strict_dumps(with_reasons(result), "simulate --json"))
    else:
        print(format_table(result))
        print(f"\n{args.trials} queries per answer count, seed {args.seed}.")
        if plot is not None:
            print(f"plot written to {plot}")
    return 0
