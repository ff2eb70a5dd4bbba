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

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from editscope.data.records import EditRequest
from editscope.edit.context import prompt_rows
from editscope.edit.fastpath import SharedContextForward, SuffixForward
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
    #: side batches run with ``fixed=True`` may take a fast forward whose rows are not the batch's (the shared
    #: context once, answers packed); False for a caller that reads per-row states of every forward (MEND)
    fast_side_batches: bool = True
    #: fast forwards of side batches: (id(batch), positions) -> (batch, forward or False)
    _fixed: dict = field(default_factory=dict, repr=False)

    @property
    def essence_rows(self) -> list[int]:
        return list(range(self.n_rewrite, self.batch.input_ids.shape[0]))

    def delta_hook(self, delta: torch.Tensor, positions: Sequence[int]):
        rows = torch.arange(len(positions), device=delta.device)
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

    def release(self) -> None:
        """Drop the per-request forward caches (the unedited states, the suffix forward's prefix keys/values) once
        δ is found, so an edit over many requests holds one group's caches at a time; rebuilt if asked again."""
        self.store.pop("unedited_hidden", None)
        self._fast = None
        self._fixed.clear()

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

    def run(self, batch: TokenBatch, positions: Sequence[int], delta: torch.Tensor | None, *,
            fixed: bool = False) -> torch.Tensor:
        """Final hidden states [B, L, d] of ``batch`` with δ added at ``positions`` (one per row).

        For the main batch at the subject positions (and ``engine.objective_path == "fast"``) only the blocks and
        positions δ can reach, up to each row's :attr:`last_read` position, are computed per call
        (:mod:`editscope.edit.fastpath`); the others come from one unedited forward (after :attr:`last_read`:
        the unedited states). ``fixed=True`` asks the same for another batch that the caller runs with the same
        ``positions`` at every step (the same batch object: its fast forward is built once) and reads only to
        score its continuations (APP's answers): exact up to each row's last continuation token's predecessor;
        rows that continue one context compute it once per step (:class:`~editscope.edit.fastpath.
        SharedContextForward`, also for FT's trained weights; not with ``fast_side_batches=False``). Any other
        batch takes a full forward."""
        fast = None
        if self.engine.objective_path == "fast" and (delta is None) == (self.hook_point is None):
            if batch is self.batch and list(positions) == list(self.subject_positions):
                fast = self._suffix()
            elif fixed and self.fast_side_batches:
                fast = self._fixed_forward(batch, positions)
        if fast is not None:
            return fast.hidden(delta)
        if delta is None or self.hook_point is None:
            return self.engine.batch_hidden(batch)
        with hooks(self.bundle.model, self.bundle.arch, {self.hook_point: self.delta_hook(delta, positions)}):
            return self.engine.batch_hidden(batch)

    def _fixed_forward(self, batch: TokenBatch,
                       positions: Sequence[int]) -> SharedContextForward | SuffixForward | None:
        """The fast forward of a fixed side batch (built on its first run), read up to each continuation: the
        shared-context one where its rows continue one context, else (with δ) the suffix forward."""
        key = (id(batch), tuple(int(p) for p in positions))
        held = self._fixed.get(key)
        if held is None or held[0] is not batch:  # the batch object is kept, so its id is not reused meanwhile
            last = [c + n - 2 for c, n in zip(batch.context_lengths, batch.continuation_lengths, strict=True)]
            fast = SharedContextForward.build(self.engine, batch, self.hook_point, positions, last)
            if fast is None and self.hook_point is not None:
                fast = SuffixForward.build(self.engine, batch, positions, self.hook_point, last)
            held = (batch, fast or False)
            self._fixed[key] = held
        return held[1] or None


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
        lengths = torch.tensor(step.ctx.batch.continuation_lengths[: step.ctx.n_rewrite], dtype=lp.dtype,
                               device=lp.device)
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
    delta = torch.zeros(ctx.v_init.shape[0], dtype=torch.float32, device=ctx.v_init.device, requires_grad=True)
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


# -- several independent requests optimised together (issue 13 item 2) -------------------------------------------
#: The terms that keep their per-request state in ``ctx.store`` and read only the main batch, so the δ of several
#: requests can be optimised in one batched forward per step. Plug-in terms (APP, EVK-Align) are not among them:
#: they run forwards of their own per request and step (``ctx.run``), so any plug-in makes the optimisation one
#: request at a time (:func:`optimise_deltas`), exactly as before.
BATCHED_TERMS: tuple[type, ...] = (TargetNLL, EssenceKL, NormPenalty)


def concat_batches(batches: Sequence[TokenBatch], pad_id: int) -> TokenBatch:
    """The rows of ``batches`` in order, right-padded to the widest: each row keeps its token positions."""
    width = max(b.input_ids.shape[1] for b in batches)

    def pad(t: torch.Tensor, value: int | bool) -> torch.Tensor:
        out = torch.full((t.shape[0], width), value, dtype=t.dtype, device=t.device)
        out[:, : t.shape[1]] = t
        return out

    return TokenBatch(torch.cat([pad(b.input_ids, pad_id) for b in batches]),
                      torch.cat([pad(b.attention_mask, 0) for b in batches]),
                      torch.cat([pad(b.target_mask, False) for b in batches]),
                      [n for b in batches for n in b.context_lengths],
                      [n for b in batches for n in b.continuation_lengths],
                      [e for b in batches for e in b.context_embeds])


def _select_rows(batch: TokenBatch, rows: Sequence[int]) -> TokenBatch:
    idx = torch.tensor(list(rows), dtype=torch.long, device=batch.input_ids.device)
    return TokenBatch(batch.input_ids[idx], batch.attention_mask[idx], batch.target_mask[idx],
                      [batch.context_lengths[r] for r in rows], [batch.continuation_lengths[r] for r in rows],
                      [batch.context_embeds[r] for r in rows])


def batch_groups(ctxs: Sequence[VContext], engine: ScoringEngine) -> list[list[int]]:
    """Consecutive contexts grouped so that each group's joint batch holds at most ``engine.token_budget`` tokens
    (rows × widest row, as the engine's own batching) and at most ``engine.vstar_batch`` requests (None: no cap);
    a context larger than the budget is a group of its own."""
    cap = engine.vstar_batch
    groups: list[list[int]] = []
    rows = width = 0
    for i, ctx in enumerate(ctxs):
        n, w = ctx.batch.input_ids.shape
        if groups and groups[-1] and (cap is None or len(groups[-1]) < cap) \
                and (rows + n) * max(width, w) <= engine.token_budget:
            groups[-1].append(i)
            rows, width = rows + n, max(width, w)
        else:
            groups.append([i])
            rows, width = n, w
    return groups


def optimise_deltas(ctxs: Sequence[VContext], terms: Sequence[Sequence[ObjectiveTerm]], *, lr: float, steps: int,
                    clamp_norm_factor: float, stop_loss: float) -> list[torch.Tensor]:
    """:func:`optimise_delta` for several requests whose δ are independent (each context built on the same
    model), in groups of :func:`batch_groups`: one batched forward per step for the whole group, each request its
    own δ at its own subject positions, its own Adam (elementwise, so a request's δ does not depend on the others'
    up to float rounding) and its own early stop (a finished request leaves the batch, its δ frozen). A group of
    one, or any term outside :data:`BATCHED_TERMS` (plug-ins), runs :func:`optimise_delta` itself."""
    if len(ctxs) != len(terms):
        raise ValueError(f"{len(ctxs)} contexts but {len(terms)} term lists")
    batched = bool(ctxs) and all(isinstance(t, BATCHED_TERMS) for ts in terms for t in ts)
    groups = batch_groups(ctxs, ctxs[0].engine) if batched else [[i] for i in range(len(ctxs))]
    out: list[torch.Tensor] = [torch.empty(0)] * len(ctxs)  # host: placeholders, replaced below
    for group in groups:
        if len(group) == 1:
            out[group[0]] = optimise_delta(ctxs[group[0]], terms[group[0]], lr=lr, steps=steps,
                                           clamp_norm_factor=clamp_norm_factor, stop_loss=stop_loss)
            ctxs[group[0]].release()
            continue
        found = _optimise_joint([ctxs[i] for i in group], [terms[i] for i in group], lr=lr, steps=steps,
                                clamp_norm_factor=clamp_norm_factor, stop_loss=stop_loss)
        for i, delta in zip(group, found, strict=True):
            out[i] = delta
        for i in group:
            ctxs[i].release()
    return out


def _optimise_joint(ctxs: Sequence[VContext], terms: Sequence[Sequence[ObjectiveTerm]], *, lr: float, steps: int,
                    clamp_norm_factor: float, stop_loss: float) -> list[torch.Tensor]:
    """The loop of :func:`optimise_delta` for a group of requests on one joint batch (see :func:`optimise_deltas`).

    The joint batch is the contexts' rows right-padded to the widest, so row r of request c keeps its positions and
    its final states are the joint states' rows ``[start_c, start_c + n_c)`` up to its own width. The unedited
    forward is done once for the group (it fills each context's ``unedited_hidden`` for the terms' set-up)."""
    engine, hook_point = ctxs[0].engine, ctxs[0].hook_point
    if hook_point is None or any(c.v_init is None or c.hook_point != hook_point or c.engine is not engine
                                 for c in ctxs):
        raise ValueError("optimise_deltas needs contexts of one engine and one hook point, with v₀")
    joint = concat_batches([c.batch for c in ctxs], engine.pad_id)
    sizes = [c.batch.input_ids.shape[0] for c in ctxs]
    starts = [sum(sizes[:c]) for c in range(len(ctxs) + 1)]
    positions = [p for c in ctxs for p in c.subject_positions]
    fast = None
    if engine.objective_path == "fast":
        fast = SuffixForward.build(engine, joint, positions, hook_point, [r for c in ctxs for r in c.last_read])
    with torch.no_grad():
        base = fast.base_hidden if fast is not None else engine.batch_hidden(joint).detach()
    for c, ctx in enumerate(ctxs):
        ctx.store["unedited_hidden"] = base[starts[c]:starts[c + 1], : ctx.batch.input_ids.shape[1]]
        setup_terms(ctx, terms[c])
    deltas = [torch.zeros(c.v_init.shape[0], dtype=torch.float32, device=c.v_init.device, requires_grad=True)
              for c in ctxs]
    opts = [torch.optim.Adam([d], lr=lr) for d in deltas]
    max_norms = [clamp_norm_factor * float(c.v_init.norm()) for c in ctxs]
    histories: list[list[dict[str, float]]] = [[] for _ in ctxs]
    active = list(range(len(ctxs)))
    run_fast, run_rows = fast, list(range(starts[-1]))
    for i in range(steps):
        rows = [r for c in active for r in range(starts[c], starts[c + 1])]
        if rows != run_rows:  # some requests stopped: run only the others' rows
            run_fast = fast.select(rows) if fast is not None else None
            run_rows = rows
        losses = {}
        with torch.enable_grad():
            per_row = torch.stack([deltas[c] for c in active]).repeat_interleave(
                torch.tensor([sizes[c] for c in active], device=deltas[0].device), dim=0)
            if run_fast is not None:
                hidden = run_fast.hidden(per_row)
            else:
                add = VContext.delta_hook(ctxs[0], per_row, [positions[r] for r in rows])
                with hooks(engine.model, engine.arch, {hook_point: add}):
                    hidden = engine.batch_hidden(_select_rows(joint, rows))
            offset = 0
            for c in active:
                ctx = ctxs[c]
                h = hidden[offset:offset + sizes[c], : ctx.batch.input_ids.shape[1]]
                offset += sizes[c]
                full = None
                if engine.objective_path == "plain":  # kmeng01/rome compute_v: log_softmax of all logits
                    full = engine.logits_from_hidden(h).float().log_softmax(-1)
                parts = {term.name: term(VStep(ctx, deltas[c], h, full_logprobs=full)) for term in terms[c]}
                histories[c].append({k: float(v.detach()) for k, v in parts.items()})
                losses[c] = sum(parts.values())
        active = [c for c in active if not (float(losses[c].detach()) < stop_loss or i == steps - 1)]
        if not active:
            break
        for c in active:
            opts[c].zero_grad()
        sum(losses[c] for c in active).backward()  # rows of different requests never mix: each δ gets its own grad
        for c in active:
            opts[c].step()
            with torch.no_grad():
                norm = deltas[c].norm()
                if norm > max_norms[c]:
                    deltas[c].mul_(max_norms[c] / norm)
    for ctx, history in zip(ctxs, histories, strict=True):
        ctx.store["losses"] = history
    return [d.detach().double() for d in deltas]


@dataclass(frozen=True)
class VSpec:
    """What determines δ besides the request: where it is added, the context templates, the loss and the
    optimiser settings (from a :class:`~editscope.edit.hparams.VStarHParams`)."""

    hook_point: str
    templates: tuple[str, ...]
    kl_factor: float
    v_weight_decay: float
    convention: str
    lr: float
    steps: int
    clamp_norm_factor: float
    stop_loss: float

    @classmethod
    def of(cls, hp, hook_point: str, templates: Sequence[str]) -> VSpec:
        return cls(hook_point, tuple(templates), hp.kl_factor, hp.v_weight_decay, hp.convention, hp.v_lr,
                   hp.v_steps, hp.clamp_norm_factor, hp.stop_loss)

    def terms(self) -> list[ObjectiveTerm]:
        return default_terms(self.kl_factor, self.v_weight_decay, self.convention)


@dataclass
class Solved:
    """One request's optimised δ, with v₀ and the loss history (what the editors read from the context)."""

    v_init: torch.Tensor
    delta: torch.Tensor
    losses: list[dict[str, float]]


@dataclass
class IndependentEdits:
    """Request groups the caller will edit one group at a time, each on the model as it is when the window
    opens (runner ``mode: single``: edit, evaluate, restore). An editor that computes a group's δ on that model
    (``fingerprint`` unchanged) optimises its peers' δ in the same batches and leaves them in ``solved``."""

    groups: list[tuple[EditRequest, ...]]
    fingerprint: str
    solved: dict[tuple[VSpec, EditRequest], Solved] = field(default_factory=dict)


@contextmanager
def independent_edits(engine: ScoringEngine, groups: Sequence[Sequence[EditRequest]]) -> Iterator[None]:
    """Open the window of :class:`IndependentEdits` on ``engine`` for the block (closed on exit, also on error).
    Fewer than two groups, or ``engine.vstar_batch`` unset or 1, open nothing."""
    if len(groups) < 2 or not engine.vstar_batch or engine.vstar_batch < 2:
        yield
        return
    if engine.vstar_window is not None:
        raise ValueError("a window of independent edits is already open on this engine")
    engine.vstar_window = IndependentEdits([tuple(g) for g in groups], engine.bundle.fingerprint)
    try:
        yield
    finally:
        engine.vstar_window = None


def solve_requests(engine: ScoringEngine, requests: Sequence[EditRequest], spec: VSpec,
                   extra_terms: Sequence[ObjectiveTerm] = (), *,
                   peers: Callable[[Sequence[tuple[EditRequest, ...]]], list[EditRequest]] | None = None,
                   ) -> list[Solved]:
    """δ (ROME eq. 4 / MEMIT eq. 16) of each of ``requests``, all on the model as it is now, optimised together
    (:func:`optimise_deltas`). ``peers`` maps the groups of an open :func:`independent_edits` window to the
    requests whose δ the editor would compute on the unedited model (ROME: each group's first request; MEMIT: all):
    with no plug-in terms, those are optimised in the same batches and kept for the later groups' edits."""
    window = engine.vstar_window
    if peers is None or window is None or extra_terms or window.fingerprint != engine.bundle.fingerprint:
        window = None
    todo = list(requests)
    if window is not None:
        todo = [r for r in requests if (spec, r) not in window.solved]
        todo += [r for r in dict.fromkeys(peers(window.groups)) if (spec, r) not in window.solved and r not in todo]
    ctxs = [build_context(engine, r, spec.templates, spec.hook_point) for r in todo]
    deltas = optimise_deltas(ctxs, [spec.terms() + list(extra_terms) for _ in ctxs], lr=spec.lr, steps=spec.steps,
                             clamp_norm_factor=spec.clamp_norm_factor, stop_loss=spec.stop_loss)
    found = [Solved(c.v_init, d, c.store["losses"]) for c, d in zip(ctxs, deltas, strict=True)]  # type: ignore[arg-type]
    if window is None:
        return found
    window.solved.update({(spec, r): s for r, s in zip(todo, found, strict=True)})
    return [window.solved[(spec, r)] for r in requests]
