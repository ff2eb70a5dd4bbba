"""Whether a run config's edits fit the machine, before any model is loaded (:func:`check_fits`).

For each method of the config the edit it will make is planned (:func:`editscope.edit.budget.plan_edit`) from the
model's config alone: requests per edit from the mode (``single`` and ``sequential``: 1; ``{batch: N}``: N;
``sequential_batches``: its batch), ``vstar_batch`` from the runtime settings, hparams as the runner resolves them
(the method's ``hparams`` file and ``overrides``, else shipped, else derived), the dtype and device in force, and
whether the statistics are cached already. A plan whose peak exceeds the available memory stops the run with one
line naming the biggest term and the first thing to change. ``EDITSCOPE_PLAN_CHECK=0`` turns the check off.
"""

from __future__ import annotations

import os
from typing import Any

from editscope.edit.budget import (
    GiB,
    NoPlan,
    Plan,
    available_memory,
    converted_cached,
    model_shape,
    plan_edit,
    plan_hparams,
    stats_cached,
)
from editscope.errors import EditscopeError
from editscope.run.config import RunConfig

#: environment variable that turns the check off (``0``, ``off``, ``false``, ``no``)
ENV = "EDITSCOPE_PLAN_CHECK"


def _requests_per_edit(config: RunConfig) -> int:
    """Cases in one edit of a full group (one request per case planned): the mode's first step."""
    mode = config.mode
    return len(mode.steps(list(range(mode.group_size)))[0])


def plans_for_config(config, *, device: str | None = None, dtype: str | None = None,
                     available: int | None = None, host_available: int | None = None) -> list[Plan]:
    """One plan per method of a single-model run config (``methods: [none]`` plans nothing)."""
    from editscope.lm.device import resolve_device

    device = str(resolve_device(device or config.device))
    dtype = dtype or config.dtype or "float32"
    settings = config.settings
    shape = model_shape(config.model)
    if available is None and host_available is None:
        available, host_available = available_memory(device)
    elif host_available is None:
        host_available = available
    plans = []
    for spec in config.methods:
        if spec.name == "none":
            continue
        hp, note = plan_hparams(spec.name, shape, config.model, spec.hparams, spec.overrides)
        requests = _requests_per_edit(config)
        if config.mode.alone and settings.vstar_batch:  # a window of N cases optimised together
            requests = settings.vstar_batch
        # a chain's last edit: a memory editor's state then holds every earlier edit of the group
        held = max(0, config.mode.group_size - requests) if not config.mode.alone else 0
        try:
            plans.append(plan_edit(shape, spec.name, hp, dtype=dtype, device=device, requests=requests,
                                   vstar_batch=settings.vstar_batch,
                                   stats_cached=stats_cached(config.model, hp, dtype), hparams_note=note,
                                   converted=converted_cached(config.model, dtype),
                                   available=available, host_available=host_available, held=held))
        except NoPlan:  # a method with no memory model is not checked (never with another method's plan)
            continue
    return plans


def refusal(plan: Plan) -> str:
    """The one line a run that cannot fit stops with."""
    big = plan.biggest()
    first = plan.advice[0] if plan.advice else "a machine with more memory"
    where = "GPU" if plan.on_cuda else "memory"
    return (f"{plan.method} on {plan.model.name} ({plan.dtype}, {plan.device}) needs a predicted "
            f"{plan.peak / GiB:.1f} GiB ({plan.peak_phase}) but {plan.available / GiB:.1f} GiB of {where} is "
            f"available; biggest term: {big.name} {big.bytes / GiB:.1f} GiB ({big.how}); try {first}; details: "
            f"editscope plan --model {plan.model.name} --method {plan.method} --dtype {plan.dtype}; "
            f"{ENV}=0 skips this check")


def check_fits(config, *, device: str | None = None, dtype: str | None = None, available: int | None = None,
               host_available: int | None = None) -> list[Plan]:
    """Plan every method of ``config`` (each model of a ``models`` list) and raise a one-line
    :class:`~editscope.errors.EditscopeError` naming the biggest term when one cannot fit; the plans otherwise.
    A config whose model cannot be planned without loading it (its config unreadable here) is not refused: the run
    reports its own error. Off with ``EDITSCOPE_PLAN_CHECK=0``."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return []
    configs = [config.for_model(m) for m in config.models] if config.models else [config]
    out: list[Plan] = []
    for one in configs:
        try:
            plans = plans_for_config(one, device=device, dtype=dtype, available=available,
                                     host_available=host_available)
        except Exception:  # noqa: BLE001 (a plan that cannot be made never stops a run: e.g. an unconverted
            continue       # registry model or a model given only by name; the run reports its own error)
        for plan in plans:
            if plan.fits is False:
                raise EditscopeError(refusal(plan))
        out += plans
    return out


def summary(plans: list[Plan]) -> list[dict[str, Any]]:
    """Peak, phase and fit of each plan, as a run may log them."""
    return [{"method": p.method, "peak_bytes": p.peak, "phase": p.peak_phase, "fits": p.fits} for p in plans]
