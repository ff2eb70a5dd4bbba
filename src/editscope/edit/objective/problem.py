"""One request's optimisation problem: its token batch, where δ is added, v₀, and the forwards that run it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from editscope.data.records import EditRequest
from editscope.edit.context import prompt_rows
from editscope.edit.objective.forward import FORWARDS, ForwardStrategy
from editscope.edit.objective.terms import ObjectiveTerm
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.full_forward import FullForward
from editscope.lm.hooks import capture
from editscope.lm.loading import Bundle
from editscope.lm.partial_forward import SuffixForward

ESSENCE_TEMPLATE = "{} is a"


@dataclass
class VContext:
    """What stays fixed during one v* optimisation.

    Rows ``0..n_rewrite-1`` of ``batch`` are (template ∘ prompt, target_new); the rest are essence prompts
    "{subject} is a" (their continuation is a filler; only the next-token distribution after the context is
    read). ``hook_point`` is where δ is added (``blocks.L.mlp_out`` for ROME, ``blocks.L.resid_post`` for
    MEMIT) at ``subject_positions[row]``. ``v_init`` is that state at the bare prompt before the edit.
    ``forward`` is the strategy every forward of this problem takes (:mod:`editscope.edit.objective.forward`).
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
    forward: ForwardStrategy = FORWARDS["fast"]
    #: rows of the main batch each term added (:meth:`ObjectiveTerm.rows`), by term name: neither rewrite nor essence
    term_rows: dict[str, list[int]] = field(default_factory=dict)
    #: side batches run with ``fixed=True`` may take a partial forward whose rows are not the batch's (the shared
    #: context once, answers packed); False for a caller that reads per-row states of every forward (MEND)
    fast_side_batches: bool = True
    _main: SuffixForward | FullForward | None = field(default=None, repr=False)
    #: forwards of fixed side batches: (id(batch), positions) -> (batch, forward)
    _side: dict = field(default_factory=dict, repr=False)

    @property
    def essence_rows(self) -> list[int]:
        added = {r for rows in self.term_rows.values() for r in rows}
        return [r for r in range(self.n_rewrite, self.batch.input_ids.shape[0]) if r not in added]

    @property
    def last_read(self) -> list[int]:
        """Per row of the main batch, the last position whose final state the objective reads: the prediction of
        the last target token (rewrite rows) or the end of the prompt (essence rows and terms' rows: the KL is
        read there or at the subject, before it). :attr:`VStep.hidden` is exact up to these positions only."""
        b = self.batch
        return [b.context_lengths[r] + (b.continuation_lengths[r] - 2 if r < self.n_rewrite else -1)
                for r in range(b.input_ids.shape[0])]

    def main_forward(self) -> SuffixForward | FullForward:
        """The main batch's forward with δ at the subject positions (built once)."""
        if self._main is None:
            self._main = self.forward.main(self.engine, self.batch, self.subject_positions, self.hook_point,
                                           self.last_read)
        return self._main

    def release(self) -> None:
        """Drop the per-request forward caches (the unedited states, the prefix keys/values) once δ is found, so an
        edit over many requests holds one group's caches at a time; rebuilt if asked again."""
        self.store.pop("unedited_hidden", None)
        self._main = None
        self._side.clear()

    def unedited_hidden(self) -> torch.Tensor:
        """Final hidden states [B, T, d] of the main batch without δ, computed once per context (by the forward
        that records the prefix keys/values, on a partial forward; terms' ``setup`` reads it)."""
        if "unedited_hidden" not in self.store:
            self.store["unedited_hidden"] = self.main_forward().base_hidden
        return self.store["unedited_hidden"]

    def run(self, batch: TokenBatch, positions: Sequence[int], delta: torch.Tensor | None, *,
            fixed: bool = False) -> torch.Tensor:
        """Final hidden states [B, L, d] of ``batch`` with δ added at ``positions`` (one per row).

        The main batch at the subject positions takes :meth:`main_forward`. ``fixed=True`` says the caller runs
        this same batch object with the same ``positions`` at every step and reads only its continuations (APP's
        answers): its forward is built once (:meth:`ForwardStrategy.side`), exact up to each row's last
        continuation token's predecessor. Any other batch takes a full forward."""
        matches = (delta is None) == (self.hook_point is None)
        if matches and batch is self.batch and list(positions) == list(self.subject_positions):
            return self.main_forward().hidden(delta)
        if matches and fixed and self.fast_side_batches:
            return self._side_forward(batch, positions).hidden(delta)
        return FullForward(self.engine, batch, positions, self.hook_point).hidden(delta)

    def _side_forward(self, batch: TokenBatch, positions: Sequence[int]):
        key = (id(batch), tuple(int(p) for p in positions))
        held = self._side.get(key)
        if held is None or held[0] is not batch:  # the batch object is kept, so its id is not reused meanwhile
            last = [c + n - 2 for c, n in zip(batch.context_lengths, batch.continuation_lengths, strict=True)]
            held = (batch, self.forward.side(self.engine, batch, positions, self.hook_point, last))
            self._side[key] = held
        return held[1]


def _with_term_rows(engine: ScoringEngine, request: EditRequest, pairs: list, positions: list[int],
                    terms: Sequence[ObjectiveTerm]) -> tuple[TokenBatch, list[int], dict[str, list[int]]]:
    """The main batch: ``pairs`` then each term's own rows (:meth:`ObjectiveTerm.rows`), so every row the loss
    reads runs in the one forward per step; the δ positions and each term's row indices with it."""
    pairs, positions, term_rows = list(pairs), list(positions), {}
    for term in terms:
        added = term.rows(engine, request)
        if added is not None:
            term_rows[term.name] = list(range(len(pairs), len(pairs) + len(added.pairs)))
            pairs += added.pairs
            positions += added.positions
    return engine.prepare(pairs), positions, term_rows


def build_context(engine: ScoringEngine, request: EditRequest, templates: Sequence[str],
                  hook_point: str | None, *, essence: bool = True,
                  forward: ForwardStrategy = FORWARDS["fast"], terms: Sequence[ObjectiveTerm] = ()) -> VContext:
    """Prepare the batch (rewrite rows, the essence row, then the rows of ``terms`` that add their own) and record
    v₀ at the bare prompt."""
    texts, positions = prompt_rows(engine, request, templates)
    pairs = [(t, request.target_new) for t in texts]
    n_rewrite = len(pairs)
    if essence:
        ess_texts, ess_pos = prompt_rows(engine, EditRequest(ESSENCE_TEMPLATE, request.subject, request.target_new),
                                         ["{}"])
        pairs += [(t, request.target_new) for t in ess_texts]
        positions += ess_pos
    batch, positions, term_rows = _with_term_rows(engine, request, pairs, positions, terms)
    ctx = VContext(engine, engine.bundle, request, hook_point, batch, positions, n_rewrite, forward=forward,
                   term_rows=term_rows)
    if hook_point is not None:
        # the forward stops after the hook point's block (capture's stop_after): nothing later is read
        with torch.no_grad(), capture(engine.model, engine.arch, [hook_point], stop_after=True) as store:
            engine.batch_hidden(engine.prepare(pairs[:1]))
        ctx.v_init = store[hook_point][0, positions[0]].detach().double()
    return ctx


def weights_context(engine: ScoringEngine, request: EditRequest, terms: Sequence[ObjectiveTerm], *,
                    forward: ForwardStrategy = FORWARDS["fast"], fast_side_batches: bool = True) -> VContext:
    """The problem of an editor that trains weights (FT, MEND's loss): no δ, one rewrite row (the bare prompt and
    target_new), then the rows of ``terms`` that add their own."""
    batch, _, term_rows = _with_term_rows(engine, request, [(request.text, request.target_new)], [], terms)
    return VContext(engine, engine.bundle, request, None, batch, [], 1, forward=forward,
                    fast_side_batches=fast_side_batches, term_rows=term_rows)
