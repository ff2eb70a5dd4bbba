"""``editscope report RUN_DIR [RUN_DIR ...] [--out DIR] [--baseline METHOD]``: HTML + Markdown report of one or
more runs, with ``tables.tex`` (booktabs tabulars of the pivot and every compact table) beside it;
``editscope report --reproduction PAGE [--runs-root DIR]``: the measured blocks of a reproduction page
regenerated from the runs they name; ``editscope report --findings PAGE``: a findings page regenerated from the
verdicts and measured blocks of the pages it quotes."""

from __future__ import annotations

import argparse

from editscope.commands._trust import add_trust_argument
from editscope.ranges import option

HELP = "write report.html (self-contained), report.md and tables.tex for one or more run directories"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help=HELP,
        description="A pivot of every method against every headline metric (best bold; paired differences against a "
        "baseline with 95% intervals, † where the interval excludes 0), summaries per suite and method (mean with "
        "95% CI), a bar chart per metric, the 1-to-N answer distribution of a sampled case against its gold "
        "distribution, and the probability shift of correct vs "
        "false answers (PEAK). With --reproduction: rewrite the measured blocks of a page such as "
        "docs/reproduction.md from the runs each block names (marked '<!-- editscope:measured RUN_DIR... "
        "[baseline=METHOD[,METHOD...]] [figures=none] -->' ... '<!-- editscope:end -->'; see docs/reproduction.md). "
        "With --findings: rewrite a findings page such as docs/findings.md from the verdicts and measured blocks of "
        "the pages its markers quote ('<!-- editscope:finding SOURCE.md claim=\"...\" [block=NAME rows=A,B "
        "columns=\"X;Y\"] -->' ... '<!-- editscope:end -->').",
    )
    parser.add_argument("runs", metavar="RUN_DIR", nargs="*",
                        help="run output directories (the OUTPUT of a 'models' list: each model's run, keyed by model)")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default: the first RUN_DIR)")
    parser.add_argument("--baseline", metavar="METHOD[,METHOD...]",
                        help="method the pivot table's paired differences are taken against (default: the unedited "
                        "model, i.e. each metric's value before the edit); several, one per editor (e.g. "
                        "rome+app,memit+app), pair each method with its own editor's")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled case study (default: 0)")
    parser.add_argument("--cards", type=option(int, "[1, inf)"), metavar="N", default=None,
                        help="also write the edit cards (editscope inspect) of N cases of the first RUN_DIR sampled "
                        "with --seed, for each of its methods, under OUT/cards/, and link them from the report")
    parser.add_argument("--cards-for", nargs="+", default=[], metavar="CASE_ID",
                        help="the same for these case ids (with or without --cards)")
    parser.add_argument("--reproduction", metavar="PAGE",
                        help="regenerate the measured blocks of this Markdown page from the runs they name, in place "
                        "(figures go beside the page under reproduction/BLOCK/, and an archive of each run, its rows "
                        "without raw probes, under reproduction/BLOCK/runs/: a run no longer on disk is read from "
                        "there; a block with neither keeps its text); takes no RUN_DIR")
    parser.add_argument("--findings", metavar="PAGE",
                        help="regenerate the findings of this Markdown page, in place, from the pages beside it that "
                        "each finding quotes (run --reproduction on those pages first); takes no RUN_DIR")
    parser.add_argument("--runs-root", metavar="DIR", default=".",
                        help="with --reproduction: the folder the blocks' run paths are relative to (default: .)")
    add_trust_argument(parser, "archived runs (reproduction archives); a block made from one says so")
    parser.set_defaults(func=_run)


def _reproduction(args: argparse.Namespace) -> int:
    import sys

    from editscope.errors import EditscopeError
    from editscope.report.reproduction import regenerate

    if args.runs:
        print("editscope report: error: --reproduction takes no RUN_DIR (each block names its runs; see "
              "--runs-root)", file=sys.stderr)
        return 2
    try:
        outcomes = regenerate(args.reproduction, args.runs_root,
                              log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except EditscopeError as exc:
        print(f"editscope report: error: {exc}", file=sys.stderr)
        return 2
    for o in outcomes:
        print(o.describe(args.reproduction))
    kept = sum(not o.runs for o in outcomes)
    print(f"{len(outcomes) - kept} of {len(outcomes)} measured blocks regenerated; {kept} kept")
    return 0


def _findings(args: argparse.Namespace) -> int:
    import sys

    from editscope.errors import EditscopeError
    from editscope.report.findings import regenerate

    if args.runs or args.reproduction:
        print("editscope report: error: --findings takes no RUN_DIR and no --reproduction (regenerate the pages it "
              "quotes first)", file=sys.stderr)
        return 2
    try:
        n = regenerate(args.findings)
    except EditscopeError as exc:
        print(f"editscope report: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.findings}: {n} findings regenerated from the pages they quote")
    return 0


def _run(args: argparse.Namespace) -> int:
    from editscope.integrity import trusting

    with trusting(args.trust_unverified):
        return _report(args)


def _report(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    if args.findings:
        return _findings(args)
    if args.reproduction:
        return _reproduction(args)
    if not args.runs:
        print("editscope report: error: give one or more RUN_DIR (or --reproduction PAGE)", file=sys.stderr)
        return 2

    from editscope.report import build_report
    from editscope.report.build import TABLES_TEX
    from editscope.report.pivot import BaselineError

    cards = None
    if args.cards is not None or args.cards_for:
        from editscope.report.card import make_cards
        from editscope.run.models import expand_run_dirs

        first = expand_run_dirs(args.runs[:1])[0]  # a models list's folder: its first model's run
        cards = make_cards(first, Path(args.out or args.runs[0]), n=args.cards, ids=args.cards_for, seed=args.seed,
                           log=lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        html_path, md_path = build_report(args.runs, args.out, seed=args.seed, baseline=args.baseline, cards=cards,
                                          log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except BaselineError as exc:  # a bad argument, as argparse's own errors: status 2
        print(f"editscope report: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {html_path}")
    print(f"markdown: {md_path}")
    print(f"latex: {html_path.parent / TABLES_TEX}")
    print(f"baseline of the paired differences: {args.baseline or 'unedited (each metric before the edit)'}")
    return 0
