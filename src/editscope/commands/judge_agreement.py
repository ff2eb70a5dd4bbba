"""``editscope judge-agreement``: each wild-suite judge against answers labelled by hand."""

from __future__ import annotations

import argparse
import sys

HELP = "measure each answer judge of the wild suite against hand-labelled answers (accuracy, Cohen's κ, FP/FN)"

_FORMATS = ("text", "markdown", "latex")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "judge-agreement",
        help=HELP,
        description="Judge every hand-labelled answer (default: the set packaged with editscope, "
        "sample/judge-labels, whose README gives the labelling rule) with each answer judge (rewrite and "
        "paraphrase answers: is the answer the edit target?) and each neighbourhood judge (neighbour answers: is "
        "the answer after the edit the same object as before?), and print accuracy, Cohen's kappa, and the "
        "false-positive and false-negative rates, with 95% intervals, per dataset and role. The wild suite's "
        "default judges are the ones this table ranks first. Model judges (model:NAME, mirage:NAME) load NAME "
        "once and read one prompt per answer.",
    )
    parser.add_argument("--labels", metavar="FILE.jsonl", help="labelled answers (JSON Lines; default: packaged)")
    parser.add_argument("--judges", nargs="+", metavar="JUDGE",
                        help="answer judges (default: every binary string judge: exact_match, contains, first_object, "
                        "first_object_fluent and any a plug-in registered; model:NAME and mirage:NAME add a judge "
                        "model)")
    parser.add_argument("--locality-judges", nargs="+", metavar="JUDGE",
                        help="neighbourhood judges (default: all registered: unchanged, same_start, same_object)")
    parser.add_argument("--split", choices=("all", "dev", "test"), default="all",
                        help="which labelled answers: all (default), or the dev / test half (README)")
    parser.add_argument("--format", choices=_FORMATS, default="text", help="table format (default: text)")
    parser.set_defaults(func=_run)


def _default_answer_judges() -> list[str]:
    from editscope.metrics.answers import JUDGES

    return [name for name in JUDGES if JUDGES[name].binary and ":" not in name]


def _run(args: argparse.Namespace) -> int:
    from editscope.data.judge_labels import load_judge_labels
    from editscope.errors import EditscopeError
    from editscope.metrics.answers import JUDGES, NEIGHBOUR_JUDGES
    from editscope.suites.judge_agreement import agreement_table, judge_agreement
    from editscope.suites.model_judge import ensure_model_judge

    items = load_judge_labels(args.labels)
    if args.split != "all":
        items = [i for i in items if i.split == args.split]
        if not items:
            raise EditscopeError(f"no labelled answer is in the {args.split} split")
    answer_judges = args.judges or _default_answer_judges()
    for name in answer_judges:
        ensure_model_judge(name)
        if not JUDGES.get(name).binary:
            raise EditscopeError(f"judge {name!r} is graded, not binary: agreement with 0/1 labels needs a binary "
                                 "judge")
    neighbour_judges = args.locality_judges or list(NEIGHBOUR_JUDGES)
    for name in neighbour_judges:
        NEIGHBOUR_JUDGES.get(name)

    import time

    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:  # a line every 5 s at most: a judge model reads seconds per answer
        if done == total or time.monotonic() - last[0] >= 5:
            last[0] = time.monotonic()
            print(f"judged {done}/{total} answer-judge pairs", file=sys.stderr, flush=True)

    rows = judge_agreement(items, answer_judges, neighbour_judges, progress=progress)
    caption = f"Judges against {len(items)} hand-labelled answers ({args.split})"
    table = agreement_table(rows, caption=caption)
    print({"text": table.plain, "markdown": table.markdown, "latex": table.latex}[args.format]())
    return 0
