"""``editscope rejudge``: a run's kept wild answers judged again by another judge, written as a new run."""

from __future__ import annotations

import argparse

HELP = "judge a run's kept wild answers again with another judge; writes a new run that 'report' reads"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "rejudge",
        help=HELP,
        description="Read the answers a run's wild suite kept (results.jsonl; an archive keeps none) and write a "
        "new run folder whose config names the other judge and whose rows hold the wild metrics that judge gives "
        "to the same answers; every other number is copied. 'editscope report OUT' then shows both protocols and "
        "the paired gap under that judge. run.json records where the run came from ('rejudged_from'). "
        "'editscope judge-agreement' says how well each judge agrees with answers labelled by hand.",
    )
    parser.add_argument("run", help="the run folder (with results.jsonl)")
    parser.add_argument("-o", "--output", required=True, help="the new run folder (must not hold a run)")
    parser.add_argument("--judge", help="answer judge for Efficacy / Generalization / LocalityTrue (e.g. "
                        "first_object, contains, exact_match, model:NAME, mirage:NAME)")
    parser.add_argument("--locality-judge", help="neighbourhood judge for Locality (unchanged, same_start, "
                        "same_object)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from editscope.run.rejudge import rejudge_run

    out = rejudge_run(args.run, args.output, judge=args.judge, locality_judge=args.locality_judge)
    print(f"rejudged run written to {out}; 'editscope report {out}' shows it")
    return 0
