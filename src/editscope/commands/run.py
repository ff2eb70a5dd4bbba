"""``editscope run CONFIG.yaml``: run an experiment config (edit -> evaluate -> restore per case; resumable)."""

from __future__ import annotations

import argparse

from editscope.commands._device import add_device_arguments
from editscope.commands._runtime import add_runtime_arguments, runtime_settings
from editscope.commands._trust import add_trust_argument
from editscope.ranges import option

HELP = "run an experiment config: edit, evaluate every suite, restore; resumable"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help=HELP,
        description="Run an experiment YAML (model, methods, datasets + suites, mode, seed, output). Appends one "
        "line per (case, method) to OUTPUT/results.jsonl with the raw pre/post probes and metrics, writes "
        "summary.csv / summary.md / run.json. Re-running the same command resumes where it stopped. A config with "
        "a 'models' list runs each model into OUTPUT/<model>/ and writes OUTPUT/summary.* of them all.",
    )
    parser.add_argument("config", help="experiment YAML file (see docs/running.md)")
    parser.add_argument("--output", "-o", metavar="DIR", help="output directory (default: the config's 'output')")
    parser.add_argument("--limit", type=option(int, "[1, inf)"), metavar="N",
                        help="at most N cases per dataset block (after the slice)")
    parser.add_argument("--shard", metavar="I/N", help="run only shard I of N (0-based); merge with 'editscope merge'")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--repair", action="store_true",
                        help="keep the first row of each (dataset, case, method) when results.jsonl holds duplicates "
                        "(two writers or a hand edit) and say how many were dropped")
    add_device_arguments(parser)
    add_runtime_arguments(parser)
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help="local: this process (default); ray: whole groups on Ray actors (pip install "
                        "'editscope[ray]')")
    parser.add_argument("--workers", type=option(int, "[1, 1024]"), default=2, help="Ray actors (--executor ray)")
    parser.add_argument("--address", default=None, help="Ray cluster address (default: start a local one)")
    parser.add_argument("--chat-template", action="store_true",
                        help="wrap prompts in the tokenizer's chat template (instruct models; as the config's "
                        "chat_template: true, part of the config digest)")
    add_trust_argument(parser, "chain checkpoints of a resumed lifelong run; recorded in run.json's unverified_files")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from editscope.integrity import trusting

    with trusting(args.trust_unverified):
        return _run_trusting(args)


def _run_trusting(args: argparse.Namespace) -> int:
    from editscope.run import Runner, load_config
    from editscope.run.runner import parse_shard

    config = load_config(args.config)
    import dataclasses

    if args.device is not None or args.dtype is not None:  # the flags win over the config's keys (Ray actors too)
        config = dataclasses.replace(config, device=args.device or config.device, dtype=args.dtype or config.dtype)
    if args.chat_template:
        config = dataclasses.replace(config, chat_template=True)
    given = {k: v for k, v in runtime_settings(args).items() if v is not None}
    if given:  # the flags win over the config's runtime settings
        from editscope.edit.runtime import RuntimeSettings

        RuntimeSettings.resolve(given, where="--forward/--vstar-batch")  # a bad value fails here, in one line
        merged = {**dict(config.runtime), **given}
        config = dataclasses.replace(config, runtime=tuple(merged.items()))
    from editscope.run.budget import check_fits

    check_fits(config)  # a run whose predicted peak memory exceeds what is available stops here, in one line
    kwargs = dict(out_dir=args.output, limit=args.limit, shard=parse_shard(args.shard),
                  progress=not args.no_progress, repair=args.repair)
    make = Runner
    if args.executor == "ray":
        import functools
        import shlex

        from editscope.run.ray_executor import RayExecutor

        rerun = shlex.join(["editscope", *args.argv])  # the same command resumes (see cli.main)
        executor = RayExecutor(workers=args.workers, address=args.address, rerun=rerun)
        make = functools.partial(Runner, executor=executor)
    if config.models:  # one ordinary run per model, into OUTPUT/<model>/ (editscope.run.models)
        from pathlib import Path

        from editscope.run.models import run_models

        out = Path(args.output or config.output)
        kwargs.pop("out_dir")
        runs = run_models(config, out_dir=out, shard=kwargs["shard"], limit=kwargs["limit"],
                          make_runner=lambda sub, sub_dir: make(sub, out_dir=sub_dir, **kwargs))
        for model_run in runs:
            _report(model_run.result, model_run.out_dir, model_run.model)
        print(f"summary of every model: {out / 'summary.md'}")
        return 0
    result = make(config, **kwargs).run()
    _report(result, result.out_dir)
    return 0


def _report(result, out_dir, model: str | None = None) -> None:
    """What a run wrote (``result`` None: a model's run found complete and skipped)."""
    prefix = f"{model}: " if model else ""
    if result is None:
        print(f"{prefix}complete already; {out_dir / 'results.jsonl'}")
        return
    if result.tables:
        print(result.tables)
    print(f"{prefix}{result.written} rows written, {result.skipped} already done; {result.total_rows} rows in "
          f"{result.out_dir / 'results.jsonl'}")
    print(f"{prefix}summary: {result.out_dir / 'summary.md'}")
