"""The loss terms of the v* objective, each citing its equation. Read this file beside the paper.

ROME (Meng et al. 2022, eq. 4; reproduced in PEAK, Ma et al., eq. 12) finds the value the edited layer should
output at the subject's last token:

    v* = v₀ + argmin_δ  (1/N) Σ_j −log P_{G(m := v₀+δ)}[o* | x_j + p]                  (TargetNLL)
                      + D_KL(P_{G(m := v₀+δ)}[x | p′] ‖ P_G[x | p′])                   (EssenceKL, p′ = "{s} is a")
                      + w · ‖δ‖ / ‖v₀‖²                                                 (NormPenalty, ref. code)

with ‖δ‖ clamped to ``clamp_norm_factor · ‖v₀‖`` after each step (:mod:`editscope.edit.objective.optimise`).
MEMIT (Meng et al. 2023, eq. 16) optimises the same loss on the residual stream after the last edit layer;
AlphaEdit, PRUNE, RECT and EVK-Edit reuse MEMIT's.

**Term protocol** (:class:`ObjectiveTerm`; subclass :class:`Term` for the no-op set-up and no rows of its own).
A term has ``name: str``; ``batched: bool`` (declared: True if it reads only the main batch, so the δ of many
requests can share one forward per step); ``rows(engine, request)`` — the rows it adds to the main batch (or
None), prepared with the request's own rows so they run in the same forward; ``setup(ctx) -> None`` — called
once per edited request before optimisation, with the unedited model, to record pre-edit quantities in
``ctx.store[name]`` — and ``__call__(step: VStep) -> Tensor`` (a weighted scalar loss). The optimiser runs ONE
forward of the main batch per step and hands the same :class:`VStep` to every term: ``step.hidden`` holds the
final hidden states of the main batch with δ (or the trained weights) installed;
``step.logprobs_at(rows, cols)`` gives full-vocabulary log-probabilities at chosen positions; ``ctx.run(batch,
positions, delta)`` runs any other batch prepared by ``ctx.engine.prepare`` with the same δ (APP: other answers,
one request at a time). A term's own rows (EVK-Align: perturbed embeddings) are ``ctx.term_rows[name]`` of the main
batch. Plug-ins are registered in :mod:`editscope.edit.plugins`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from editscope.data.records import EditRequest
from editscope.lm.engine import ScoringEngine
from editscope.lm.scorer import ScoreRequest

if TYPE_CHECKING:
    from editscope.edit.objective.problem import VContext

#: where the essence KL reads its distributions (:class:`EssenceKL`)
KL_POSITIONS = ("next", "subject")


@dataclass
class VStep:
    """One optimisation step: δ and the main batch's final hidden states with δ installed."""

    ctx: VContext
    delta: torch.Tensor | None
    #: final hidden states [B, T, d] of the main batch with δ installed, exact at positions <= ctx.last_read[r]
    #: of each row (what the terms read); a partial forward leaves the unedited states at later positions
    hidden: torch.Tensor
    _cache: dict = field(default_factory=dict)
    #: [B, T, V] log-probabilities at every position (the ``plain`` forward strategy computes them, as the
    #: reference code does); None: the LM head runs only where read
    full_logprobs: torch.Tensor | None = None

    def logprobs_at(self, rows: Sequence[int], cols: Sequence[int]) -> torch.Tensor:
        """Log-probabilities [n, V] of the next token at (row, col) positions of the main batch."""
        if self.full_logprobs is not None:
            return self.full_logprobs[torch.tensor(list(rows)), torch.tensor(list(cols))]
        logits = self.ctx.engine.logits_from_hidden(self.hidden[torch.tensor(list(rows)), torch.tensor(list(cols))])
        return logits.float().log_softmax(-1)

    def target_logprobs(self) -> torch.Tensor:
        """Per-token log-probs [n_rewrite, max_target_len] of target_new in the rewrite rows (0 = padding)."""
        if "target" not in self._cache:
            b = self.ctx.batch
            rows, cols, slots = [], [], []
            for r in range(self.ctx.n_rewrite):
                start, n = b.context_lengths[r], b.continuation_lengths[r]
                rows += [r] * n
                cols += list(range(start - 1, start + n - 1))
                slots += list(range(n))
            lp = self.logprobs_at(rows, cols)
            targets = b.input_ids[torch.tensor(rows), torch.tensor(cols) + 1]
            token_lp = lp.gather(1, targets[:, None])[:, 0]
            out = torch.zeros(self.ctx.n_rewrite, max(b.continuation_lengths[: self.ctx.n_rewrite]),
                              device=token_lp.device)
            out = out.index_put((torch.tensor(rows), torch.tensor(slots)), token_lp)
            self._cache["target"] = out
        return self._cache["target"]

    def essence_logprobs(self) -> torch.Tensor:
        """Next-token log-probs [n_essence, V] after each essence prompt."""
        if "essence" not in self._cache:
            rows = self.ctx.essence_rows
            cols = [self.ctx.batch.context_lengths[r] - 1 for r in rows]
            self._cache["essence"] = self.logprobs_at(rows, cols)
        return self._cache["essence"]


@runtime_checkable
class ObjectiveTerm(Protocol):
    """A weighted scalar loss term of the v* (or weight) objective; see the module docstring."""

    name: str
    batched: bool

    def rows(self, engine: ScoringEngine, request: EditRequest) -> TermRows | None: ...

    def setup(self, ctx: VContext) -> None: ...

    def __call__(self, step: VStep) -> torch.Tensor: ...


@dataclass(frozen=True)
class TermRows:
    """Rows a term adds to the main batch: one scored pair per row (its continuation is a filler where only the
    context is read) and where δ is added in each."""

    pairs: list[ScoreRequest]
    positions: list[int]


class Term:
    """Base for terms that read only the main batch's own rows and need no pre-edit quantities."""

    batched = True

    def rows(self, engine: ScoringEngine, request: EditRequest) -> TermRows | None:
        return None

    def setup(self, ctx: VContext) -> None:
        return None


def setup_terms(ctx: VContext, terms: Sequence[ObjectiveTerm]) -> None:
    """Each term's set-up, once per request context, with the unedited model and no gradient."""
    with torch.no_grad():
        for term in terms:
            term.setup(ctx)


@dataclass
class TargetNLL(Term):
    """(1/N) Σ_j mean-token NLL of o* after prefix x_j (ROME eq. 4, first term; MEMIT eq. 16)."""

    weight: float = 1.0
    name: str = "nll"

    def __call__(self, step: VStep) -> torch.Tensor:
        lp = step.target_logprobs()
        lengths = torch.tensor(step.ctx.batch.continuation_lengths[: step.ctx.n_rewrite], dtype=lp.dtype,
                               device=lp.device)
        return self.weight * (-(lp.sum(1) / lengths)).mean()


@dataclass
class EssenceKL(Term):
    """kl_factor · D_KL(P_edited[· | p′] ‖ P_pre[· | p′]) for p′ = "{subject} is a" (ROME eq. 4, second term;
    the reference code's ``kl_div(pre, post, log_target=True)`` with batchmean).

    ``at`` is where the distribution is read (hparams key ``kl_at``). ``"next"`` (convention ``paper``): the
    next token after the whole prompt p′, the distribution P[x | p′] that eq. 4 writes. ``"subject"`` (convention
    ``reference``): the logits at the subject's last token of p′, as ``lookup_idxs`` of kmeng01/rome ``compute_v``
    and kmeng01/memit ``compute_z`` pick them for the KL prompt (the position δ is added at, before " is a" is
    read).
    """

    weight: float = 0.0625
    name: str = "essence_kl"
    at: str = "next"

    def __post_init__(self) -> None:
        if self.at not in KL_POSITIONS:
            raise ValueError(f"EssenceKL.at must be one of {KL_POSITIONS}, not {self.at!r}")

    def logprobs(self, step: VStep) -> torch.Tensor:
        """Log-probs [n_essence, V] at the read position ``at`` of each essence row."""
        if self.at == "next":
            return step.essence_logprobs()
        key = "essence_subject"
        if key not in step._cache:
            rows = step.ctx.essence_rows
            step._cache[key] = step.logprobs_at(rows, [step.ctx.subject_positions[r] for r in rows])
        return step._cache[key]

    def setup(self, ctx: VContext) -> None:
        with torch.no_grad():  # read from the unedited forward the partial forward records its prefix from
            step = VStep(ctx, None, ctx.unedited_hidden())
            ctx.store[self.name] = self.logprobs(step).detach()

    def __call__(self, step: VStep) -> torch.Tensor:
        if not step.ctx.essence_rows or self.weight == 0:
            return step.hidden.new_zeros(())
        post = self.logprobs(step)
        pre = step.ctx.store[self.name]
        kl = (post.exp() * (post - pre)).sum(-1).mean()
        return self.weight * kl


@dataclass
class NormPenalty(Term):
    """w · ‖δ‖ / ‖v₀‖² (ROME/MEMIT reference code's ``v_weight_decay`` term; the paper states the constraint
    as the clamp ‖δ‖ ≤ c·‖v₀‖, applied by the optimiser)."""

    weight: float = 0.5
    name: str = "norm"

    def __call__(self, step: VStep) -> torch.Tensor:
        if step.delta is None or step.ctx.v_init is None:
            return step.hidden.new_zeros(())
        return self.weight * step.delta.norm() / step.ctx.v_init.norm() ** 2


def default_terms(kl_factor: float, v_weight_decay: float, kl_at: str = "next") -> list[ObjectiveTerm]:
    """NLL + essence KL + norm penalty: the loss of ROME eq. 4 / MEMIT eq. 16, the KL read at ``kl_at``."""
    return [TargetNLL(), EssenceKL(kl_factor, at=kl_at), NormPenalty(v_weight_decay)]


