"""``editscope tune``: choose an editor's (and plug-ins') hyperparameters for a model on validation cases, with
the evidence recorded (editscope.tune)."""

from __future__ import annotations

import argparse

from editscope.commands._runtime import add_runtime_arguments, runtime_settings
from editscope.commands._trust import add_trust_argument
from editscope.ranges import option

HELP = "choose hyperparameters for a model on validation cases (successive halving); resumable"


def register(sub: argparse._SubParsersAction) -> None:
    from editscope.edit.registry import EDITORS
    from editscope.tune.driver import TARGETS

    parser = sub.add_parser(
        "tune",
        help=HELP,
        description="Search the knobs an editor (and its plug-ins) declares: candidate layers from the causal-trace "
        "layer curve of facts the model knows, the published relative depth and a neighbourhood; the other knobs' "
        "declared grids. Candidates run as ordinary run directories on records of --dataset no shipped experiment "
        "config reports on, by successive halving. The choice maximises the lower 95% bootstrap CI bound of an "
        "objective behind a guard, per dataset: counterfact: Score = harmonic mean of ES, PS, NS, refusing a "
        "candidate whose NS falls below the unedited model's by more than its 95% CI half-width (a share with no "
        "spread: below its Wilson interval); zsre: the same with "
        "Efficacy, Paraphrase, Specificity; peak-cf (PEAK suite, for APP): harmonic mean of ES, 1-AFF_hard and "
        "1-ANF_hard, refusing a candidate whose ES falls below the editor alone's (base hparams, no plug-ins; run "
        "once as OUT/reference) by more than that mean's 95% CI half-width; counterfact-evk (CounterFact and "
        "EVK-Bench suites, for EVK-Align): harmonic mean of ES, EVK_ES and EVK_TS, with the same ES guard. With "
        "--sequential, each candidate edits a rung's cases as one chain and KnownFacts joins the mean. Writes "
        "OUT/tuned.yaml (loads with --hparams) with a provenance block, and OUT/report.md. Rerunning the same "
        "command resumes.",
    )
    parser.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    parser.add_argument("--method", required=True, choices=sorted(EDITORS), help="editing method")
    parser.add_argument("--plugin", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                        help="attach a plug-in; its declared knobs are searched (the editor's are not, unless named "
                        "in --knobs)")
    parser.add_argument("--budget", type=option(float, "(0, 1e6]"), required=True, metavar="MINUTES",
                        help="wall-clock minutes; checked before each candidate evaluation (a rerun with a larger "
                        "budget goes on)")
    parser.add_argument("--out", "-o", default=None, metavar="DIR", help="output directory (default: "
                        "runs/tune-METHOD-MODEL)")
    parser.add_argument("--hparams", default=None, help="base hparams YAML (default: the shipped file)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="fixed overrides of the base hparams (repeatable)")
    parser.add_argument("--knobs", default=None, metavar="K1,K2", help="search only these declared knobs "
                        "(plug-in knobs as NAME.KEY)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="replace a knob's declared grid (layers: 'layers=[3];[4]'); repeatable")
    parser.add_argument("--dataset", default="counterfact", choices=list(TARGETS),
                        help="validation dataset and objective: counterfact/zsre: the paper's Score, guarded by "
                        "locality (NS/Specificity) against the unedited model; peak-cf: hmean(ES, 1-AFF_hard, "
                        "1-ANF_hard) of the PEAK suite, guarded by ES against the editor without plug-ins (tune APP "
                        "with --plugin app); counterfact-evk: hmean(ES, EVK_ES, EVK_TS) of CounterFact edits, the "
                        "same ES guard (tune EVK-Align with --plugin evk_align)")
    parser.add_argument("--first", type=option(int, "[2, 10000]"), default=8, help="cases of the first rung")
    parser.add_argument("--eta", type=option(int, "[2, 100]"), default=3, help="keep 1/ETA per rung, ETA× the cases")
    parser.add_argument("--max-cases", type=option(int, "[2, 100000]"), default=24, help="cases of the last rung")
    parser.add_argument("--sequential", type=option(int, "[1, 100000]"), default=0, metavar="BATCH",
                        help="tune for sequential editing: on a rung of N cases each candidate edits the N cases as "
                        "one chain in batches of BATCH (the editor's state carried through; --first/--max-cases "
                        "count the chain's edits), scored after the last batch on every edited case; the objective's "
                        "harmonic mean gains the general suite's KnownFacts (facts the unedited model answers that "
                        "the edited model still answers). counterfact and zsre only")
    parser.add_argument("--validation-offset", type=option(int, "[0, 10000000]"), default=None, metavar="N",
                        help="start the validation slice at record N of the dataset instead of the first run of "
                        "--max-cases records no shipped experiment config reports on (there may be none that long); "
                        "the records of it that a shipped config reports on are counted in the log and the "
                        "provenance")
    parser.add_argument("--trace-facts", type=option(int, "[1, 10000]"), default=16,
                        help="known facts traced for the layer curve")
    parser.add_argument("--trace-samples", type=option(int, "[1, 1000]"), default=10, help="noise samples per fact")
    parser.add_argument("--neighbourhood", type=option(int, "[0, 100]"), default=1,
                        help="layers either side of each anchor layer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_runtime_arguments(parser)
    add_trust_argument(parser, "OUT/tune.json and OUT/state.json on a rerun; recorded in tuned.yaml's provenance")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from editscope.edit import parse_overrides
    from editscope.edit.plugins import parse_plugin_arg
    from editscope.tune import Tuner, TuneSettings
    from editscope.tune.space import parse_grid

    out = args.out or f"runs/tune-{args.method}-{args.model.replace('/', '_')}"
    settings = TuneSettings(
        model=args.model, method=args.method, out=out, budget_minutes=args.budget,
        plugins=[parse_plugin_arg(p) for p in args.plugin], hparams=args.hparams,
        overrides=parse_overrides(args.set), knobs=[k.strip() for k in args.knobs.split(",")] if args.knobs else None,
        grid=parse_grid(args.grid), dataset=args.dataset, first=args.first, eta=args.eta, max_cases=args.max_cases,
        trace_facts=args.trace_facts, trace_samples=args.trace_samples, neighbourhood=args.neighbourhood,
        seed=args.seed, runtime={k: v for k, v in runtime_settings(args).items() if v is not None},
        sequential=args.sequential, validation_offset=args.validation_offset)
    result = Tuner(settings, progress=not args.no_progress, trust_unverified=args.trust_unverified).run()
    print(f"wall time {result.wall_seconds / 60:.1f} min; {result.evaluated} candidate evaluation(s) computed now")
    if result.chosen is None:
        print(f"no candidate chosen (see {result.out / 'report.md'})")
        return 1
    print(f"chosen: {result.chosen.label()}")
    print(f"hparams: {result.yaml_path}  (editscope edit --hparams {result.yaml_path} ...)")
    print(f"report: {result.out / 'report.md'}")
    return 0
