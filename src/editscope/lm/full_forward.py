"""The exact forward the partial forwards are measured against: the whole model, with a vector δ added by a hook at
one position per row. Read it first; :mod:`editscope.lm.partial_forward` computes the same states faster where δ
cannot act (positions before it, blocks below it) and says, per forward, which test holds it equal to this one.

It is also the path for batches the partial forwards cannot take (rows beyond a sliding attention window, a hook
point outside the blocks) and for editors that train weights instead of δ (FT: ``hook_point=None``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.hooks import hooks


def select_rows(batch: TokenBatch, rows: Sequence[int]) -> TokenBatch:
    """The batch restricted to ``rows``, in that order."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=batch.input_ids.device)
    return TokenBatch(batch.input_ids[idx], batch.attention_mask[idx], batch.target_mask[idx],
                      [batch.context_lengths[r] for r in rows], [batch.continuation_lengths[r] for r in rows],
                      [batch.context_embeds[r] for r in rows])


def add_at(delta: torch.Tensor, positions: Sequence[int]):
    """A hook function adding δ (a vector [d], or one per row [B, d]) at ``positions[r]`` of each row r."""
    cols = torch.tensor([int(p) for p in positions])

    def add(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        rows = torch.arange(len(positions), device=x.device)
        x[rows, cols.to(x.device)] = x[rows, cols.to(x.device)] + delta.to(x)
        return x

    return add


class FullForward:
    """The whole model's forward of ``batch``, with δ added at ``positions`` by a hook at ``hook_point`` (None:
    no δ; the trainable weights are what changes, as FT's). Exact at every position: the baseline the partial
    forwards are tested against (:mod:`editscope.lm.partial_forward` names the tests), and the path for batches
    they cannot take."""

    def __init__(self, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int],
                 hook_point: str | None) -> None:
        self.engine, self.batch, self.positions, self.hook_point = engine, batch, list(positions), hook_point
        self._base_hidden: torch.Tensor | None = None

    @property
    def base_hidden(self) -> torch.Tensor:
        """Final states [B, T, d] without δ (computed on first use)."""
        if self._base_hidden is None:
            with torch.no_grad():
                self._base_hidden = self.engine.batch_hidden(self.batch).detach()
        return self._base_hidden

    def hidden(self, delta: torch.Tensor | None) -> torch.Tensor:
        if delta is None or self.hook_point is None:
            return self.engine.batch_hidden(self.batch)
        with hooks(self.engine.model, self.engine.arch, {self.hook_point: add_at(delta, self.positions)}):
            return self.engine.batch_hidden(self.batch)

    def select(self, rows: Sequence[int]) -> FullForward:
        return FullForward(self.engine, select_rows(self.batch, rows), [self.positions[r] for r in rows],
                           self.hook_point)
