"""The v* objective as a sum of terms, and its optimiser.

ROME (Meng et al. 2022, eq. 4; reproduced in PEAK, Ma et al., eq. 12) finds the value the edited layer should
output at the subject's last token:

    v* = v₀ + argmin_δ  (1/N) Σ_j −log P_{G(m := v₀+δ)}[o* | x_j + p]                  (target NLL)
                      + D_KL(P_{G(m := v₀+δ)}[x | p′] ‖ P_G[x | p′])                   (essence, p′ = "{s} is a")
                      + w · ‖δ‖ / ‖v₀‖²                                                 (norm constraint, ref. code)

with ‖δ‖ clamped to ``clamp_norm_factor · ‖v₀‖`` after each step. MEMIT (Meng et al. 2023, eq. 16) optimises
the same loss on the residual stream after the last edit layer; AlphaEdit, PRUNE and RECT reuse MEMIT's.

**Term protocol** (:class:`ObjectiveTerm`; subclass :class:`Term` for the no-op set-up). A term has
``name: str``, ``setup(ctx: VContext) -> None`` — called once per edited request before optimisation, with the
unedited model, to record pre-edit quantities in ``ctx.store[name]`` — and ``__call__(step: VStep) -> Tensor``
(a weighted scalar loss). Every optimising editor runs ONE forward of the main batch per step and hands the
same :class:`VStep` to every term: ``step.hidden`` holds the final hidden states of the main batch with δ
(or the trained weights) installed; ``step.logprobs_at(rows, cols)`` gives full-vocabulary log-probabilities
at chosen positions; ``ctx.run(batch, positions, delta)`` runs any other batch prepared by
``ctx.engine.prepare`` (or with ``context_embeds``) with the same δ hook, for plug-ins (APP: other answers;
EVK-Align: perturbed embeddings). Plug-ins are registered in :mod:`editscope.edit.plugins`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from editscope.data.records import EditRequest
from editscope.edit.context import prompt_rows
from editscope.edit.fastpath import SuffixForward
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.hooks import capture, hooks
from editscope.lm.loading import Bundle

ESSENCE_TEMPLATE = "{} is a"


@dataclass
class VContext:
    """What stays fixed during one v* optimisation.

    Rows ``0..n_rewrite-1`` of ``batch`` are (template ∘ prompt, target_new); the rest are essence prompts
    "{subject} is a" (their continuation is a filler; only the next-token distribution after the context is
    read). ``hook_point`` is where δ is added (``blocks.L.mlp_out`` for ROME, ``blocks.L.resid_post`` for
    MEMIT) at ``subject_positions[row]``. ``v_init`` is that state at the bare prompt before the edit.
    """

    engine: ScoringEngine
    bundle: Bundle
    request: EditRequest
    hook_point: str | None
    batch: TokenBatch
    subject_positions: list[int]
    n_rewrite: int
    v_init: torch.Tensor | None = None
    store: dict = field(default_factory=dict)
    #: the main batch's suffix forward (edit.fastpath), built on its first run with δ; False: full forward only
    _fast: SuffixForward | bool | None = field(default=None, repr=False)

    @property
    def essence_rows(self) -> list[int]:
        return list(range(self.n_rewrite, self.batch.input_ids.shape[0]))

    def delta_hook(self, delta: torch.Tensor, positions: Sequence[int]):
        rows = torch.arange(len(positions))
        cols = torch.tensor(list(positions))

        def add(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            x[rows, cols] = x[rows, cols] + delta.to(x.dtype)
            return x

        return add

    @property
    def last_read(self) -> list[int]:
        """Per row of the main batch, the last position whose final state the objective reads: the prediction of
        the last target token (rewrite rows) or the end of the prompt (essence rows: the KL is read there or at
        the subject, before it). :attr:`VStep.hidden` is exact up to these positions only."""
        b = self.batch
        return [b.context_lengths[r] + (b.continuation_lengths[r] - 2 if r < self.n_rewrite else -1)
                for r in range(b.input_ids.shape[0])]

    def _suffix(self) -> SuffixForward | None:
        """The main batch's suffix forward (built once, with the unedited forward), or None: full forward only."""
        if self._fast is None:
            ok = self.hook_point is not None and self.engine.objective_path == "fast"
            self._fast = ok and SuffixForward.build(self.engine, self.batch, self.subject_positions,
                                                    self.hook_point, self.last_read) or False
        return self._fast or None

    def unedited_hidden(self) -> torch.Tensor:
        """Final hidden states [B, T, d] of the main batch without δ, computed once per context (on the fast path
        by the same forward that records the prefix keys/values; terms' ``setup`` reads it)."""
        if "unedited_hidden" not in self.store:
            fast = self._suffix()
            if fast is not None:
                hidden = fast.base_hidden
            else:
                with torch.no_grad():
                    hidden = self.engine.batch_hidden(self.batch).detach()
            self.store["unedited_hidden"] = hidden
        return self.store["unedited_hidden"]

    def run(self, batch: TokenBatch, positions: Sequence[int], delta: torch.Tensor | None) -> torch.Tensor:
        """Final hidden states [B, L, d] of ``batch`` with δ added at ``positions`` (one per row).

        For the main batch at the subject positions (and ``engine.objective_path == "fast"``) only the blocks and
        positions δ can reach, up to each row's :attr:`last_read` position, are computed per call
        (:mod:`editscope.edit.fastpath`); the others come from one unedited forward (after :attr:`last_read`:
        the unedited states). Any other batch takes a full forward."""
        if delta is None or self.hook_point is None:
            return self.engine.batch_hidden(batch)
        if (batch is self.batch and self.engine.objective_path == "fast"
                and list(positions) == list(self.subject_positions)):
            fast = self._suffix()
            if fast is not None:
                return fast.hidden(delta)
        with hooks(self.bundle.model, self.bundle.arch, {self.hook_point: self.delta_hook(delta, positions)}):
            return self.engine.batch_hidden(batch)


@dataclass
class VStep:
    """One optimisation step: δ and the main batch's final hidden states with δ installed."""

    ctx: VContext
    delta: torch.Tensor | None
    #: final hidden states [B, T, d] of the main batch with δ installed, exact at positions <= ctx.last_read[r]
    #: of each row (what the terms read); on the fast path later positions hold the unedited states
    hidden: torch.Tensor
    _cache: dict = field(default_factory=dict)
    #: [B, L, V] log-probabilities at every position (the "plain" objective path computes them, as the
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
            out = torch.zeros(self.ctx.n_rewrite, max(b.continuation_lengths[: self.ctx.n_rewrite]))
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

    def setup(self, ctx: VContext) -> None: ...

    def __call__(self, step: VStep) -> torch.Tensor: ...


class Term:
    """Base for terms that need no pre-edit quantities: ``setup`` does nothing."""

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
        lengths = torch.tensor(step.ctx.batch.continuation_lengths[: step.ctx.n_rewrite], dtype=lp.dtype)
        return self.weight * (-(lp.sum(1) / lengths)).mean()


@dataclass
class EssenceKL(Term):
    """kl_factor · D_KL(P_edited[· | p′] ‖ P_pre[· | p′]) for p′ = "{subject} is a" (ROME eq. 4, second term;
    the reference code's ``kl_div(pre, post, log_target=True)`` with batchmean).

    ``at`` is where the distribution is read. ``"next"`` (convention ``paper``): the next token after the whole
    prompt p′, the distribution P[x | p′] that eq. 4 writes. ``"subject"`` (convention ``reference``): the
    logits at the subject's last token of p′, as ``lookup_idxs`` of kmeng01/rome ``compute_v`` and kmeng01/memit
    ``compute_z`` pick them for the KL prompt (the position δ is added at, before " is a" is read).
    """

    weight: float = 0.0625
    name: str = "essence_kl"
    at: str = "next"

    def __post_init__(self) -> None:
        if self.at not in ("next", "subject"):
            raise ValueError(f"EssenceKL.at must be 'next' or 'subject', not {self.at!r}")

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
        with torch.no_grad():  # the unedited forward the fast path records its prefix from: no second forward
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
    as the clamp ‖δ‖ ≤ c·‖v₀‖, applied by :func:`optimise_delta`)."""

    weight: float = 0.5
    name: str = "norm"

    def __call__(self, step: VStep) -> torch.Tensor:
        if step.delta is None or step.ctx.v_init is None:
            return step.hidden.new_zeros(())
        return self.weight * step.delta.norm() / step.ctx.v_init.norm() ** 2


def build_context(engine: ScoringEngine, request: EditRequest, templates: Sequence[str],
                  hook_point: str | None, *, essence: bool = True) -> VContext:
    """Prepare the batch (rewrite rows, then the essence row) and record v₀ at the bare prompt."""
    texts, positions = prompt_rows(engine, request, templates)
    pairs = [(t, request.target_new) for t in texts]
    n_rewrite = len(pairs)
    if essence:
        ess_texts, ess_pos = prompt_rows(engine, EditRequest(ESSENCE_TEMPLATE, request.subject, request.target_new),
                                         ["{}"])
        pairs += [(t, request.target_new) for t in ess_texts]
        positions += ess_pos
    batch = engine.prepare(pairs)
    ctx = VContext(engine, engine.bundle, request, hook_point, batch, positions, n_rewrite)
    if hook_point is not None:
        # the forward stops after the hook point's block (capture's stop_after): nothing later is read
        with torch.no_grad(), capture(engine.model, engine.arch, [hook_point], stop_after=True) as store:
            engine.batch_hidden(engine.prepare(pairs[:1]))
        ctx.v_init = store[hook_point][0, positions[0]].detach().double()
    return ctx


def default_terms(kl_factor: float, v_weight_decay: float, convention: str = "paper") -> list[ObjectiveTerm]:
    """NLL + essence KL + norm penalty: the loss of ROME eq. 4 / MEMIT eq. 16; ``convention`` picks where the
    essence distribution is read (:class:`EssenceKL`: ``paper`` -> after the prompt, ``reference`` -> subject)."""
    at = {"paper": "next", "reference": "subject"}.get(convention)
    if at is None:
        raise ValueError(f"unknown convention {convention!r} (known: paper, reference)")
    return [TargetNLL(), EssenceKL(kl_factor, at=at), NormPenalty(v_weight_decay)]


def optimise_delta(ctx: VContext, terms: Sequence[ObjectiveTerm], *, lr: float, steps: int,
                   clamp_norm_factor: float, stop_loss: float) -> torch.Tensor:
    """Adam on δ (starting at 0) for ``steps`` steps or until the total loss < ``stop_loss``; after each step
    ‖δ‖ is clamped to ``clamp_norm_factor·‖v₀‖`` (ROME/MEMIT reference). Returns δ (float64); the loss
    history goes to ``ctx.store["losses"]``."""
    if ctx.v_init is None:
        raise ValueError("optimise_delta needs a context with a hook point")
    setup_terms(ctx, terms)
    delta = torch.zeros(ctx.v_init.shape[0], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    max_norm = clamp_norm_factor * float(ctx.v_init.norm())
    history = []
    for i in range(steps):
        opt.zero_grad()
        with torch.enable_grad():  # also when the caller runs under no_grad
            hidden = ctx.run(ctx.batch, ctx.subject_positions, delta)
            full = None
            if ctx.engine.objective_path == "plain":  # kmeng01/rome compute_v: log_softmax of all logits
                full = ctx.engine.logits_from_hidden(hidden).float().log_softmax(-1)
            step = VStep(ctx, delta, hidden, full_logprobs=full)
            parts = {term.name: term(step) for term in terms}
            loss = sum(parts.values())
        history.append({k: float(v.detach()) for k, v in parts.items()})
        if float(loss.detach()) < stop_loss or i == steps - 1:
            break
        loss.backward()
        opt.step()
        with torch.no_grad():
            norm = delta.norm()
            if norm > max_norm:
                delta.mul_(max_norm / norm)
    ctx.store["losses"] = history
    return delta.detach().double()
