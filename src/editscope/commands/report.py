"""``editscope report RUN_DIR [RUN_DIR ...] [--out DIR]``: HTML + Markdown report of one or more runs."""

from __future__ import annotations

import argparse

from editscope.ranges import option


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="write report.html (self-contained) and report.md for one or more run directories",
        description="Summaries per suite and method (mean with 95%% CI), a bar chart per metric, the 1-to-N answer "
        "distribution of a sampled case against its gold distribution, and the probability shift of correct vs "
        "false answers (PEAK).",
    )
    parser.add_argument("runs", metavar="RUN_DIR", nargs="+", help="run output directories")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default: the first RUN_DIR)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled case study (default: 0)")
    parser.add_argument("--cards", type=option(int, "[1, inf)"), metavar="N", default=None,
                        help="also write the edit cards (editscope inspect) of N cases of the first RUN_DIR sampled "
                        "with --seed, for each of its methods, under OUT/cards/, and link them from the report")
    parser.add_argument("--cards-for", nargs="+", default=[], metavar="CASE_ID",
                        help="the same for these case ids (with or without --cards)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from editscope.report import build_report

    cards = None
    if args.cards is not None or args.cards_for:
        import sys

        from editscope.report.card import make_cards

        cards = make_cards(args.runs[0], Path(args.out or args.runs[0]), n=args.cards, ids=args.cards_for,
                           seed=args.seed, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    html_path, md_path = build_report(args.runs, args.out, seed=args.seed, cards=cards)
    print(f"report: {html_path}")
    print(f"markdown: {md_path}")
    return 0
