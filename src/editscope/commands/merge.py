"""``editscope merge OUT_DIR SHARD_DIR...``: merge the output directories of a sharded run."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "merge the output directories of 'editscope run --shard i/n' into one"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "merge",
        help=HELP,
        description="Merge shard outputs: checks that all ran the same config on the same model, drops duplicate "
        "rows, orders them as an unsharded run, and writes results.jsonl, summaries and run.json to OUT_DIR.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR",
                        help="output directory (must not hold results yet, unless an incomplete merge)")
    parser.add_argument("shards", metavar="SHARD_DIR", nargs="+", help="shard output directories")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import sys

    from editscope.run import merge_runs
    from editscope.run.store import RUN_JSON, read_json

    n, _ = merge_runs(args.out_dir, args.shards, log=lambda line: print(f"editscope: warning: {line}",
                                                                        file=sys.stderr))
    status = read_json(Path(args.out_dir) / RUN_JSON).get("status")
    print(f"merged {len(args.shards)} shard(s): {n} rows in {args.out_dir}/results.jsonl, {status}")
    return 0
