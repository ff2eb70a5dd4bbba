"""``editscope locate``: where a model keeps one fact (causal tracing heatmap, top neurons), or the per-layer
MLP indirect effect averaged over N CounterFact facts (the curve behind a locate-then-edit layer choice)."""

from __future__ import annotations

import argparse
import sys

from editscope.commands._device import add_device_arguments
from editscope.ranges import Range, option

HELP = "locate a fact in the model (causal tracing, knowledge neurons, ...)"


def register(sub: argparse._SubParsersAction) -> None:
    from editscope.locate import METHODS, OPTION_RANGES

    def declared(name: str):
        text, kind = OPTION_RANGES[name]
        return option(kind, text)

    def declared_range(name: str) -> Range:
        return Range.parse(OPTION_RANGES[name][0])

    parser = sub.add_parser(
        "locate",
        help=HELP,
        description="Run a knowledge-locating method on one fact and print the top layers / neurons; "
        "causal_trace can draw ROME's heatmaps (--plot). With --layer-curve N, trace the MLP states at the "
        "subject's last token for N CounterFact facts the model knows and print the mean indirect effect per layer.",
    )
    parser.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    add_device_arguments(parser)
    parser.add_argument("--prompt", help="template with one {} for the subject, e.g. '{} is located in'")
    parser.add_argument("--subject", help="the subject, e.g. 'Eiffel Tower'")
    parser.add_argument("--answer", help="the answer scored, e.g. ' Paris' (default: the model's greedy token)")
    parser.add_argument("--method", default="causal_trace", choices=list(METHODS))
    parser.add_argument("--plot", help="write the causal-tracing heatmaps to this image file")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--samples", type=declared("samples"), default=10, help="noise samples (causal_trace)")
    parser.add_argument("--noise", type=declared("noise"), default=3.0,
                        help=f"noise level in embedding stds, in {declared_range('noise')} (causal_trace)")
    parser.add_argument("--window", type=declared("window"), default=None,
                        help="MLP/attn window (default: 10 scaled to depth)")
    parser.add_argument("--steps", type=declared("steps"), default=20, help="integrated-gradient steps (kn)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top", type=option(int, "[1, inf)"), default=10,
                        help="how many top layers / neurons to print")
    parser.add_argument("--layer-curve", type=option(int, "[1, inf)"), metavar="N", default=None,
                        help="average the MLP indirect effect per layer over N CounterFact facts instead")
    parser.add_argument("--dataset", default="counterfact-1k", help="facts for --layer-curve")
    parser.add_argument("--kind", default="mlp", choices=["mlp", "attn", "residual"], help="state for --layer-curve")
    parser.add_argument("--save", metavar="FILE", help="--layer-curve: append each traced fact to this JSON-lines "
                        "file and resume from it (facts already there are not traced again)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (they go to stderr)")
    parser.set_defaults(func=run)


def _options(args: argparse.Namespace) -> dict:
    if args.method == "causal_trace":
        return {"samples": args.samples, "noise": args.noise, "window": args.window, "seed": args.seed}
    if args.method == "kn":
        return {"steps": args.steps}
    if args.method == "random":
        return {"seed": args.seed}
    return {}


def _json(value, where: str) -> str:
    """Strict JSON: untraced cells (NaN by construction) become null; editscope.finite refuses anything else."""
    from editscope.finite import nulled, strict_dumps

    return strict_dumps(nulled(value)[0], where, indent=1)


def run(args: argparse.Namespace) -> int:
    from editscope.errors import EditscopeError
    from editscope.lm import load
    from editscope.lm.engine import ScoringEngine

    if args.plot:  # an unwritable --plot fails before the model loads and the trace runs
        from pathlib import Path

        from editscope.atomic import make_dirs, write_target

        write_target(args.plot)  # a device or a folder at the path is refused, not replaced
        make_dirs(Path(args.plot).parent, "folder of --plot")
    engine = ScoringEngine(load(args.model, device=args.device, dtype=args.dtype,
                                     progress=lambda msg: print(msg, file=sys.stderr, flush=True)))
    if args.layer_curve is not None:
        return _layer_curve(args, engine)
    if not args.prompt or not args.subject:
        raise EditscopeError("locate needs --prompt and --subject (or --layer-curve N)")
    from editscope.locate import locate

    result = locate(engine, args.method, args.prompt, args.subject, args.answer, progress=not args.no_progress,
                    **_options(args))
    if args.plot:
        if not result.states:
            raise EditscopeError(f"--plot draws causal-tracing heatmaps; method {args.method!r} has none")
        from editscope.locate.plot import plot_trace

        print(f"wrote {plot_trace(result, args.plot)}", file=sys.stderr)
    from editscope.finite import fmt, require_finite

    # the probabilities are finite unless the model is broken: refused, never printed as nan
    require_finite({k: result.meta.get(k) for k in ("clean_prob", "corrupted_prob")}, "locate")
    if args.json:
        out = result.to_dict()
        out["top_neurons"] = result.top_neurons(args.top)
        print(_json(out, "locate --json"))
        return 0
    print(f"{result.prompt!r} -> {result.answer!r} (token {result.answer_token}), method {result.method}")
    if result.method == "causal_trace":
        meta = result.meta
        print(f"p(clean) {meta['clean_prob']:.4f}   p(corrupted) {meta['corrupted_prob']:.4f}   "
              f"noise {meta['noise']} x sigma {fmt(meta['sigma'], '.4f', 'locate: sigma')}, {meta['samples']} "
              f"samples, window {meta['window']}")
        effect = require_finite(meta["mlp_indirect_effect"], "locate: mlp_indirect_effect")
        order = sorted(range(len(effect)), key=lambda i: -effect[i])[: args.top]
        print("top layers by MLP indirect effect at the subject's last token:")
        for layer in order:
            print(f"  layer {layer:>3}  {effect[layer]:+.4f}")
        return 0
    print("top neurons (layer, neuron, score):")
    for layer, neuron, score in result.top_neurons(args.top):
        print(f"  L{layer:<3} n{neuron:<6} {fmt(score, '+.4g', f'locate: score of L{layer} n{neuron}')}")
    per_layer = require_finite([float(x) for x in result.layer_scores()], "locate: per-layer scores")
    order = sorted(range(len(per_layer)), key=lambda i: -per_layer[i])[: min(args.top, 5)]
    print("top layers by summed score: " + ", ".join(f"{i} ({per_layer[i]:+.3g})" for i in order))
    return 0


def _layer_curve(args: argparse.Namespace, engine) -> int:
    from editscope.data import load_cases
    from editscope.errors import EditscopeError
    from editscope.locate.layers import layer_curve

    facts = []
    for case in load_cases(args.dataset):
        request = case.requests[0]
        if request.target_true:
            facts.append((request.prompt, request.subject, request.target_true))
    done, on_fact = _saved_facts(args, engine) if args.save else ([], None)
    curve = layer_curve(engine, facts, kind=args.kind, window=args.window, samples=args.samples, seed=args.seed,
                        limit=args.layer_curve, done=done, on_fact=on_fact, progress=not args.no_progress)
    if curve.n_facts == 0:
        raise EditscopeError(f"the model knows none of the {len(facts)} {args.dataset} facts (greedy first "
                             "token = the true answer's): nothing to trace")
    if args.json:
        print(_json({"kind": curve.kind, "window": curve.window, "n_facts": curve.n_facts,
                     "effect": curve.effect.tolist(), "normalised": curve.normalised.tolist(), "facts": curve.facts},
                    "locate --layer-curve --json"))
        return 0
    print(f"{args.kind} indirect effect at the subject's last token, window {curve.window}, "
          f"{curve.n_facts} {args.dataset} facts the model knows ({len(curve.skipped)} unknown skipped)")
    from editscope.finite import require_finite

    require_finite({"effect": curve.effect, "normalised": curve.normalised}, "locate --layer-curve")
    peak = max(float(curve.effect.max()), 1e-12)
    print(f"{'layer':>5}  {'AIE':>8}  {'normalised':>10}")
    for layer, (eff, norm) in enumerate(zip(curve.effect, curve.normalised, strict=True)):
        bar = "#" * max(0, int(round(30 * eff / peak)))
        print(f"{layer:>5}  {eff:>8.4f}  {norm:>10.3f}  {bar}")
    print("top layers: " + ", ".join(str(i) for i in curve.top_layers()))
    return 0


def _saved_facts(args: argparse.Namespace, engine):
    """Rows of a --save file (checked to come from the same trace settings) and the appender for new ones. A torn
    last line (stopped mid-write) is cut off the file: that fact is traced again."""
    from functools import partial
    from pathlib import Path

    from editscope.errors import EditscopeError
    from editscope.jsonl import append_record, read_records
    from editscope.locate.causal_trace import default_window

    path = Path(args.save)
    want = {"kind": args.kind, "samples": args.samples, "seed": args.seed,
            "window": default_window(engine.bundle.n_layers) if args.window is None else args.window}
    rows = read_records(path, repair=True)
    for i, row in enumerate(rows):
        for key, value in want.items():
            if row.get(key) != value:
                raise EditscopeError(f"{path}:record {i}: field {key}: traced with {row.get(key)!r}, this run uses "
                                     f"{value!r}; use another --save file")
    return rows, partial(append_record, path)

