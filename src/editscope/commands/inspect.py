"""``editscope inspect``: the edit card of one edit -- a case of a run directory, or an edit given as on
``editscope edit`` -- as one self-contained HTML page (and JSON)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from editscope.commands._device import add_device_arguments
from editscope.commands._runtime import add_runtime_arguments, runtime_settings
from editscope.ranges import option

HELP = "write the edit card of one edit (HTML page with everything it did; --json too)"


def register(sub: argparse._SubParsersAction) -> None:
    from editscope.edit.registry import EDITORS

    parser = sub.add_parser(
        "inspect",
        help=HELP,
        description="Replay one edit and write its card: the request; log-probs of target and true answer on the "
        "edit prompt, paraphrases and neighbours before/after; greedy generations; 1-to-N siblings and PEAK answers "
        "where the case has them; EVK stability against σ; ΔW (norms, rank, singular values); the collateral scan "
        "(facts the unedited model knew that the edit flipped); with --trace the causal trace before and after. "
        "Either RUN_DIR --case ID (the run's model, method, hparams and seeds: the card's metrics equal the run's "
        "row) or --prompt/--subject/--target as on `editscope edit`.",
    )
    parser.add_argument("run", nargs="?", metavar="RUN_DIR", help="a run directory (with --case)")
    parser.add_argument("--case", help="case id in RUN_DIR")
    parser.add_argument("--dataset", help="the run's dataset label, when the case id is in several")
    parser.add_argument("--method", default=None, help=f"method: the run's label (default: its first) or, without "
                        f"RUN_DIR, an editing method ({', '.join(sorted(EDITORS))}; default rome)")
    parser.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder (without RUN_DIR)")
    parser.add_argument("--prompt", help="template with {} for the subject (without RUN_DIR)")
    parser.add_argument("--subject")
    parser.add_argument("--target", help="the new answer")
    parser.add_argument("--target-true", default=None, help="the current (true) answer")
    parser.add_argument("--paraphrase", nargs="*", default=[], metavar="PROMPT",
                        help="paraphrases of the edit prompt ({} is filled with the subject)")
    parser.add_argument("--neighbour", nargs="*", default=[], metavar="PROMPT=ANSWER",
                        help="neighbourhood facts the edit should leave alone")
    parser.add_argument("--correct", nargs="+", default=[], metavar="ANSWER",
                        help="other correct answers (1-to-N siblings, PEAK's correct list)")
    parser.add_argument("--hard-false", nargs="+", default=[], metavar="ANSWER", help="hard false answers (PEAK)")
    parser.add_argument("--hparams", default=None, help="hparams YAML (without RUN_DIR)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override hparams (without RUN_DIR)")
    parser.add_argument("--out", default=".", metavar="DIR", help="folder for the card (default: .)")
    parser.add_argument("--name", default=None, help="file name stem (default: card-DATASET-CASE-METHOD)")
    parser.add_argument("--json", action="store_true", help="also write the card's numbers as JSON beside the page")
    parser.add_argument("--trace", action="store_true", help="add the causal trace before and after (slow)")
    parser.add_argument("--trace-samples", type=option(int, "[1, 1000]"), default=10, help="noise samples (--trace)")
    parser.add_argument("--generate", type=option(int, "[0, 1000]"), default=20, metavar="N",
                        help="greedy tokens generated before and after (0: none)")
    parser.add_argument("--facts", type=option(int, "[1, inf)"), default=500,
                        help="size of the collateral probe set (known facts)")
    parser.add_argument("--facts-from", nargs="+", default=None, metavar="DATASET",
                        help="datasets (names or files) the collateral probe set is drawn from, in order (default: "
                        "counterfact-train zsre peak-cf counterfact; without a dataset folder, the packaged samples); "
                        "a run whose suites include collateral uses its own")
    parser.add_argument("--top", type=option(int, "[1, inf)"), default=25, help="largest log-prob drops listed")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines (they go to stderr)")
    add_device_arguments(parser)
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)


def _job(args: argparse.Namespace, log):
    from editscope.errors import EditscopeError
    from editscope.run.inspect import job_from_request, job_from_run

    if args.run:
        if not args.case:
            raise EditscopeError("inspect RUN_DIR needs --case ID")
        for flag in ("prompt", "subject", "target"):
            if getattr(args, flag):
                raise EditscopeError(f"inspect: --{flag} describes an edit of its own; with RUN_DIR give --case only")
        return job_from_run(args.run, args.case, method=args.method, dataset=args.dataset,
                            collateral_facts=args.facts, collateral_sources=args.facts_from, log=log)
    missing = [f"--{f.replace('_', '-')}" for f in ("prompt", "subject", "target") if not getattr(args, f)]
    if missing:
        raise EditscopeError(f"inspect needs RUN_DIR --case ID, or {', '.join(missing)} (an edit as on "
                             "`editscope edit`)")
    from editscope.data.records import EditRequest
    from editscope.edit import parse_overrides
    from editscope.edit.runtime import EditRuntime
    from editscope.lm import load
    from editscope.paths import missing_data

    neighbours = []
    for text in args.neighbour:
        prompt, sep, answer = text.rpartition("=")
        if not sep or not prompt.strip() or not answer.strip():
            raise EditscopeError(f"--neighbour {text!r}: expected PROMPT=ANSWER")
        neighbours.append((prompt.replace("{}", args.subject), answer.strip()))
    try:
        request = EditRequest(args.prompt, args.subject, args.target, args.target_true,
                              correct_answers=tuple(args.correct), hard_false=tuple(args.hard_false))
    except ValueError as exc:
        raise EditscopeError(str(exc)) from exc
    sources = args.facts_from
    if sources is None and (problem := missing_data()):
        from editscope.suites.collateral import SAMPLE_SOURCES

        sources = list(SAMPLE_SOURCES)
        print(f"inspect: {problem}: the collateral scan draws its known facts from the packaged sample "
              f"({', '.join(sources)}); set EDITSCOPE_DATA (or --facts-from) for the full pool", file=sys.stderr)
    bundle = load(args.model, device=args.device, dtype=args.dtype, progress=log)
    runtime = EditRuntime.from_settings(runtime_settings(args), where="--forward/--vstar-batch")
    return job_from_request(bundle, args.method or "rome", request,
                            paraphrases=[p.replace("{}", args.subject) for p in args.paraphrase],
                            neighbours=neighbours, hparams=args.hparams, overrides=parse_overrides(args.set),
                            runtime=runtime, collateral_facts=args.facts, collateral_sources=sources)


def run(args: argparse.Namespace) -> int:
    from editscope.report.card import card_stem, write_card
    from editscope.run.inspect import compute_card

    def log(msg: str) -> None:
        if not args.no_progress:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    job = _job(args, log)
    card = compute_card(job, generate_tokens=args.generate, trace=args.trace, trace_samples=args.trace_samples,
                        top=args.top, progress=not args.no_progress, log=log)
    out = Path(args.out)
    stem = args.name or card_stem(job.trial.dataset, job.case.case_id, job.method.label)
    page = write_card(card, out / f"{stem}.html", out / f"{stem}.json" if args.json else None)
    col = card.get("collateral_scan")
    if col:
        print(f"collateral: {col['flipped']} of {col['counted']} known facts flipped")
    print(f"card: {page} ({time.perf_counter() - t0:.1f} s)")
    if args.json:
        print(f"json: {out / f'{stem}.json'}")
    return 0
