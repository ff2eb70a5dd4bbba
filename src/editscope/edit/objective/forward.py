"""How the v*/z optimisation computes its forward: a strategy the optimiser is handed, never a branch in a loss.

Every strategy gives the same numbers to float rounding; they differ in cost. ``fast`` (the default) runs only the
blocks and positions δ can reach (:mod:`editscope.lm.partial_forward`); ``full`` runs the whole model with a hook;
``plain`` is ``full`` plus full-vocabulary log-softmax at every position, the reference code's cost structure
(kmeng01/rome ``compute_v``, kmeng01/memit ``compute_z``), kept for benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.full_forward import FullForward
from editscope.lm.partial_forward import SharedContextForward, SuffixForward


@dataclass(frozen=True)
class ForwardStrategy:
    """Which partial forward a batch gets. ``partial``: use the suffix / shared-context forwards where they are
    exact; ``full_logprobs``: the optimiser computes log-probabilities at every position of every row."""

    name: str
    partial: bool
    full_logprobs: bool = False

    def main(self, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int], hook_point: str | None,
             last_read: Sequence[int]) -> SuffixForward | FullForward:
        """The forward of an optimisation's main batch (δ at ``positions``; read up to ``last_read``)."""
        fast = None
        if self.partial and hook_point is not None:
            fast = SuffixForward.build(engine, batch, positions, hook_point, last_read)
        return fast or FullForward(engine, batch, positions, hook_point)

    def side(self, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int], hook_point: str | None,
             last_read: Sequence[int]) -> SharedContextForward | SuffixForward | FullForward:
        """The forward of a side batch a plug-in term runs at every step with the same positions (APP's answers):
        the shared context computed once where the rows continue one context, else the suffix forward."""
        fast = None
        if self.partial:
            fast = SharedContextForward.build(engine, batch, hook_point, positions, last_read)
            if fast is None and hook_point is not None:
                fast = SuffixForward.build(engine, batch, positions, hook_point, last_read)
        return fast or FullForward(engine, batch, positions, hook_point)


FORWARDS: dict[str, ForwardStrategy] = {s.name: s for s in (
    ForwardStrategy("fast", partial=True),
    ForwardStrategy("full", partial=False),
    ForwardStrategy("plain", partial=False, full_logprobs=True),
)}


def forward_strategy(name: str) -> ForwardStrategy:
    if name not in FORWARDS:
        raise EditscopeError(f"unknown forward strategy {name!r}; known: {', '.join(FORWARDS)}")
    return FORWARDS[name]
