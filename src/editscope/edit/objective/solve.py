"""δ of edit requests: a request's optimisation problem built, its terms assembled, the optimiser run; and the
window of independent edits in which requests edited one at a time on the same model are optimised together."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from editscope.data.records import EditRequest
from editscope.edit.objective.optimise import AdamSettings, optimise
from editscope.edit.objective.problem import build_context
from editscope.edit.objective.terms import ObjectiveTerm, default_terms

if TYPE_CHECKING:
    from editscope.edit.runtime import EditRuntime
from editscope.lm.engine import ScoringEngine


@dataclass(frozen=True)
class VSpec:
    """What determines δ besides the request: where it is added, the context templates, the loss and the
    optimiser settings (from a :class:`~editscope.edit.hparams.VStarHParams`)."""

    hook_point: str
    templates: tuple[str, ...]
    kl_factor: float
    v_weight_decay: float
    kl_at: str
    adam: AdamSettings

    @classmethod
    def of(cls, hp, hook_point: str, templates: Sequence[str]) -> VSpec:
        adam = AdamSettings(hp.v_lr, hp.v_steps, hp.clamp_norm_factor, hp.stop_loss)
        return cls(hook_point, tuple(templates), hp.kl_factor, hp.v_weight_decay, hp.switches()["kl_at"], adam)

    def terms(self) -> list[ObjectiveTerm]:
        return default_terms(self.kl_factor, self.v_weight_decay, self.kl_at)


@dataclass
class Solved:
    """One request's optimised δ, with v₀ and the loss history (what the editors read)."""

    v_init: torch.Tensor
    delta: torch.Tensor
    losses: list[dict[str, float]]


def optimisation_summary(solved: Sequence[Solved], adam: AdamSettings) -> dict[str, float]:
    """Scalars of how the optimisation of ``solved`` went, for the rows' ``edit_info`` (what a choice of
    ``v_steps`` / ``stop_loss`` turns on): the mean number of loss evaluations per request (a request that stops
    early evaluates its loss once more than it updates δ, as the reference loop), the share of requests that
    used every step without reaching ``stop_loss``, and the mean and largest final loss."""
    if not solved:
        return {}
    final = [sum(s.losses[-1].values()) for s in solved]
    capped = [len(s.losses) >= adam.steps and f >= adam.stop_loss for s, f in zip(solved, final, strict=True)]
    return {"v_steps_mean": sum(len(s.losses) for s in solved) / len(solved),
            "v_step_capped": sum(capped) / len(solved),
            "v_loss_final_mean": sum(final) / len(final),
            "v_loss_final_max": max(final)}


@dataclass
class IndependentEdits:
    """Request groups the caller will edit one group at a time, each on the model as it is when the window
    opens (runner ``mode: single``: edit, evaluate, restore). An editor that computes a group's δ on that model
    (``fingerprint`` unchanged) optimises its peers' δ in the same batches and leaves them in ``solved``, keyed by
    what determines a δ: the :class:`VSpec`, the plug-in terms (equal terms compare equal: EVK-Align's by its
    settings; others by identity) and the request."""

    groups: list[tuple[EditRequest, ...]]
    fingerprint: str
    solved: dict[tuple[VSpec, tuple[ObjectiveTerm, ...], EditRequest], Solved] = field(default_factory=dict)


@contextmanager
def independent_edits(runtime: EditRuntime, fingerprint: str,
                      groups: Sequence[Sequence[EditRequest]]) -> Iterator[None]:
    """Open the window of :class:`IndependentEdits` on ``runtime`` for the block (closed on exit, also on error),
    for the model of ``fingerprint``. Fewer than two groups, or ``runtime.settings.vstar_batch`` unset or 1, open
    nothing."""
    if len(groups) < 2 or not runtime.settings.vstar_batch or runtime.settings.vstar_batch < 2:
        yield
        return
    if runtime.window is not None:
        raise ValueError("a window of independent edits is already open on this runtime")
    runtime.window = IndependentEdits([tuple(g) for g in groups], fingerprint)
    try:
        yield
    finally:
        runtime.window = None


def solve_requests(engine: ScoringEngine, runtime: EditRuntime, requests: Sequence[EditRequest], spec: VSpec,
                   extra_terms: Sequence[ObjectiveTerm] = (), *,
                   peers: Callable[[Sequence[tuple[EditRequest, ...]]], list[EditRequest]] | None = None,
                   ) -> list[Solved]:
    """δ (ROME eq. 4 / MEMIT eq. 16) of each of ``requests``, all on the model as it is now, optimised together.
    ``peers`` maps the groups of an open :func:`independent_edits` window to the requests whose δ the editor would
    compute on the unedited model (ROME: each group's first request; MEMIT: all): those are
    optimised in the same batches and kept for the later groups' edits. Plug-in terms join a window when every one
    is declared ``batched`` (it reads only the main batch, so a peer's δ under it is the δ it would get alone)."""
    window = runtime.window
    if (peers is None or window is None or not all(t.batched for t in extra_terms)
            or window.fingerprint != engine.bundle.fingerprint):
        window = None
    key = (spec, tuple(extra_terms))
    todo = list(requests)
    if window is not None:
        todo = [r for r in requests if (*key, r) not in window.solved]
        todo += [r for r in dict.fromkeys(peers(window.groups)) if (*key, r) not in window.solved and r not in todo]
    terms = [spec.terms() + list(extra_terms) for _ in todo]
    ctxs = [build_context(engine, r, spec.templates, spec.hook_point, forward=runtime.settings.strategy, terms=ts)
            for r, ts in zip(todo, terms, strict=True)]
    deltas = optimise(ctxs, terms, spec.adam, token_budget=engine.token_budget,
                      max_requests=runtime.settings.vstar_batch)
    found = [Solved(c.v_init, d, c.store["losses"]) for c, d in zip(ctxs, deltas, strict=True)]  # type: ignore[arg-type]
    if window is None:
        return found
    window.solved.update({(*key, r): s for r, s in zip(todo, found, strict=True)})
    return [window.solved[(*key, r)] for r in requests]
