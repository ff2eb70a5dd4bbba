"""``editscope plan``: predicted peak memory (term by term) and time per edit, before any weights are read."""

from __future__ import annotations

import argparse
import sys

from editscope.commands._device import DTYPE_NAMES
from editscope.ranges import option

HELP = "predict an edit's peak memory and time from the model's config (no weights read)"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan",
        help=HELP,
        description="Predict the peak memory of an edit, split into weights, layer-statistics accumulation, C (and "
        "AlphaEdit's projector), the z/v* batch, KN's integrated gradients and MEND's networks, and the time per "
        "edit from a FLOP count and the device's matmul rate (measured in about a second, or --tflops). The model "
        "is built on the meta device from its config.json: a registry name, a folder holding config.json, or a "
        "hub id whose config.json is in the local hub cache. With CONFIG.yaml (--config) the run config's model, "
        "methods, mode, hparams, dtype, device and runtime settings are planned as 'editscope run' checks them.",
    )
    parser.add_argument("--model", help="registry name, folder with config.json, or hub id (cached config.json)")
    parser.add_argument("--method", action="append", metavar="NAME",
                        help="edit method (repeatable; default rome)")
    parser.add_argument("--config", metavar="CONFIG.yaml", help="plan a run config's methods instead")
    parser.add_argument("--hparams", metavar="FILE", help="hparams file (default: shipped, else derived)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one hparam (repeatable)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="model weights' precision (default float32)")
    parser.add_argument("--device", default=None, help="cpu | cuda | cuda:N | auto (default auto)")
    parser.add_argument("--requests", type=option(int, "[1, 1000000]"), default=1, metavar="N",
                        help="requests edited together (a MEMIT-family batch; default 1)")
    parser.add_argument("--held", type=option(int, "[0, 100000000]"), default=0, metavar="N",
                        help="edits already in a memory editor's state before this edit (GRACE's codebook, WISE's "
                             "side memories grow with them; default 0)")
    parser.add_argument("--vstar-batch", default=None, metavar="auto|N",
                        help="requests per batched v*/z forward (default $EDITSCOPE_VSTAR_BATCH, else auto)")
    parser.add_argument("--stats-cached", action="store_true",
                        help="plan as if the layer statistics were cached (default: whether they are cached here)")
    parser.add_argument("--available-gib", type=option(float, "(0, 1e9]"), default=None, metavar="GIB",
                        help="memory to plan against (default: free memory of the device now)")
    parser.add_argument("--tflops", type=option(float, "[1e-6, 1e6]"), default=None, metavar="T",
                        help="matmul rate in TFLOP/s in the model's dtype (default: measured now)")
    parser.add_argument("--fp64-tflops", type=option(float, "[1e-6, 1e6]"), default=None, metavar="T",
                        help="float64 matmul rate in TFLOP/s for the solves (default: measured now, or --tflops / 2)")
    parser.add_argument("--no-time", action="store_true", help="memory only: no matmul benchmark, no time")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    import json

    from editscope.edit.budget import GiB, render

    available = None if args.available_gib is None else int(args.available_gib * GiB)
    plans = _config_plans(args, available) if args.config else _model_plans(args, available)
    if not args.no_time and plans:
        rates = _rates(args, plans[0])
        for p in plans:
            p.rates = rates
    if args.json:
        print(json.dumps([p.to_dict() for p in plans], indent=2))
    else:
        print("\n\n".join(render(p) for p in plans))
    return 0


def _config_plans(args: argparse.Namespace, available: int | None) -> list:
    """One plan per method of a run config (one model)."""
    from editscope.errors import EditscopeError
    from editscope.run import load_config
    from editscope.run.budget import plans_for_config

    config = load_config(args.config)
    if config.models:
        raise EditscopeError(f"{args.config}: plan one model at a time (its 'models' list has "
                             f"{len(config.models)}); pass --model with the methods instead")
    return plans_for_config(config, device=args.device, dtype=args.dtype, available=available)


def _model_plans(args: argparse.Namespace, available: int | None) -> list:
    """One plan per ``--method`` for ``--model`` (ROME when none is named)."""
    from editscope.edit.budget import (
        NoPlan,
        available_memory,
        converted_cached,
        model_shape,
        plan_edit,
        plan_hparams,
        stats_cached,
    )
    from editscope.edit.hparams import parse_overrides
    from editscope.edit.runtime import RuntimeSettings
    from editscope.errors import EditscopeError
    from editscope.lm.device import resolve_device

    if not args.model:
        raise EditscopeError("--model or --config is required")
    device = str(resolve_device(args.device))
    dtype = args.dtype or "float32"
    settings = RuntimeSettings.resolve({"vstar_batch": args.vstar_batch}, where="--vstar-batch")
    shape = model_shape(args.model)
    if available is None:
        available, host = available_memory(device)
    else:
        host = available
    overrides = parse_overrides(args.set)
    plans, failed = [], []
    methods = args.method or ["rome"]
    for method in methods:
        try:  # one method without hparams (or refused by this model) costs its own plan, not the others'
            hp, note = plan_hparams(method, shape, args.model, args.hparams, overrides)
        except EditscopeError as exc:
            failed.append(f"no plan for {method}: {exc}")
            continue
        try:
            plans.append(plan_edit(shape, method, hp, dtype=dtype, device=device, requests=args.requests,
                                   held=args.held,
                                   vstar_batch=settings.vstar_batch,
                                   stats_cached=args.stats_cached or stats_cached(args.model, hp, dtype),
                                   converted=converted_cached(args.model, dtype),
                                   hparams_note=note, available=available, host_available=host))
        except NoPlan as exc:
            failed.append(str(exc))
    if failed and not plans:
        raise EditscopeError("; ".join(failed))
    for line in failed:
        print(f"editscope plan: {line}", file=sys.stderr, flush=True)
    return plans


def _rates(args: argparse.Namespace, first):
    """The matmul rates of the time estimate: given (--tflops, --fp64-tflops) or measured on the first plan's
    device and dtype."""
    from editscope.edit.budget import Rates, measure_rates

    if args.tflops is not None:
        fp64 = args.fp64_tflops if args.fp64_tflops is not None else args.tflops / 2
        return Rates(args.tflops * 1e12, fp64 * 1e12, "given")
    rates = measure_rates(first.device, first.dtype, first.model, rows=max(16, first.batch_tokens))
    if args.fp64_tflops is not None:
        rates = Rates(rates.matmul, args.fp64_tflops * 1e12, rates.how + " (float64 given)")
    return rates
