"""Partial forwards: the final hidden states of a batch with a vector δ added at one position per row, computed
only where δ can act. The v* / z optimisation of the locate-then-edit editors runs one of these per step
(:mod:`editscope.edit.objective.forward` chooses which); this module is forward surgery on the model and knows
nothing of losses.

δ enters the residual stream at one position per row: the subject's last token p_r (ROME: output of layer L's
MLP; MEMIT: after block L). Two parts of every step's forward cannot change and are computed once per edit, in
one unedited forward of the batch (with a key/value cache):

- **positions before p_r**: under causal attention no position before p_r attends to it, so at every layer their
  states equal the unedited model's. Each step runs the model only on the suffix p_r .. ``last_read[r]`` of each
  row, its queries attending to the cached prefix keys/values of the same row (the prefix sharing of DESIGN.md: a
  ``DynamicCache`` filled by one forward, then a forward of the continuations under a mask covering prefix +
  continuation). ``last_read[r]`` is the last position whose final state the caller reads (the last target
  token's predecessor, the KL position): later positions are not computed at all.
- **blocks below the start block S**: the input of block S is fixed for the suffix positions too. S = L where δ
  enters inside block L (``mlp_out``: block L runs from its input, its attention over the cached layer-L
  prefix keys/values — that attention half-layer is recomputed, it is exact and costs ~1/(2(n−L)) of a step),
  S = L + 1 where δ is added to block L's output (``resid_post``: δ is added to block S's fixed input). Blocks
  0..S−1 are replaced, during a step, by a pass-through and block S's input by the recorded one, so each step
  runs blocks S..n−1 only.

Both forwards here share the interface of the exact one, :class:`~editscope.lm.full_forward.FullForward` (read it
first: the whole model with a hook adding δ; ``base_hidden``: the unedited final states [B, T, d]; ``hidden(delta)``:
the states with δ, a vector [d] for every row or one per row [B, d]; ``select(rows)``: the same forward on a subset
of rows, where supported), and equal it to float rounding at every position they compute:

- :class:`SuffixForward`: the suffix of each row from block S (equal to the full forward at positions ≤
  ``last_read[r]``; later positions hold the unedited states), its rows run in lanes of similar suffix length
  (:func:`lanes_of`), each padded only to its own longest suffix. Tested by
  ``tests/edit/test_fastpath.py::test_suffix_forward_equals_full_forward`` and
  ``::test_lanes_of_a_batched_group_equal_the_full_forward`` (states and δ-gradient to 1e-5 relative).
- :class:`SharedContextForward`: rows that continue one shared context, the context computed once per step.
  Tested by ``tests/edit/test_app.py::test_side_batch_on_the_fast_path_equals_the_full_forward`` and
  ``::test_ft_side_batch_on_the_shared_context_path_equals_the_full_forward`` (loss and gradient to 1e-5/1e-4).

Weights stay frozen (``Bundle`` loads them with ``requires_grad=False``): the backward pass computes δ's gradient
only. Rows longer than a sliding attention window (Gemma 3's local layers) and δ at a hook point outside the blocks
take the full forward (``build`` returns None): a custom mask would bypass the window (as
:meth:`editscope.lm.engine.ScoringEngine.score` refuses such rows).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from transformers import DynamicCache

from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.full_forward import select_rows
from editscope.lm.hooks import capture, hooks
from editscope.lm.kv_cache import cache_kwargs

_BLOCK_POINT = re.compile(r"^blocks\.(\d+)\.([a-z_]+)$")

SuffixEdit = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""An intervention on a lane of suffixes: (states at the hook point [b, width, d], the lane's batch rows) -> states."""


class _PassThrough(nn.Module):
    """Stands in for a block below the start block during a step: returns its residual input unchanged (in the
    block's own output form), which block S's input hook then replaces by the recorded state."""

    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.as_tuple = as_tuple

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        return (hidden_states,) if self.as_tuple else hidden_states


@contextmanager
def _skip_blocks(blocks: nn.ModuleList, below: int, as_tuple: bool) -> Iterator[None]:
    """Blocks 0..below−1 replaced by pass-throughs for the duration (restored on exit, also on error)."""
    originals = [blocks[i] for i in range(below)]
    try:
        for i in range(below):
            blocks[i] = _PassThrough(as_tuple)
        yield
    finally:
        for i, block in enumerate(originals):
            blocks[i] = block


def start_block(hook_point: str, n_layers: int) -> tuple[int, bool] | None:
    """(S, δ folded into block S's input) for δ added at ``hook_point``; None for a point outside the blocks."""
    match = _BLOCK_POINT.match(hook_point)
    if match is None:
        return None
    layer, kind = int(match.group(1)), match.group(2)
    if kind == "resid_post" and layer + 1 < n_layers:
        return layer + 1, True
    if kind == "resid_pre":
        return layer, True
    return layer, False


def _unedited_forward(engine: ScoringEngine, batch: TokenBatch, entries: Sequence[str],
                      cache: DynamicCache | None) -> tuple[torch.Tensor, bool, dict]:
    """One no-grad forward of ``batch`` without δ: its final states, whether blocks return tuples (the form a
    pass-through must mimic) and the states captured at ``entries``; ``cache`` is filled with every layer's
    keys/values."""
    blocks = engine.model.get_submodule(engine.arch.blocks)
    outputs: list[bool] = []
    recorder = blocks[0].register_forward_hook(lambda _m, _a, out: outputs.append(isinstance(out, tuple)))
    try:
        with torch.no_grad(), capture(engine.model, engine.arch, list(entries)) as store:
            hidden = engine.batch_hidden(batch, cache=cache).detach()
    finally:
        recorder.remove()
    return hidden, outputs[0], dict(store)


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean [B, Q, K] attention pattern as the additive [B, 1, Q, K] mask the models take."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)[:, None]


LANE_OVERHEAD_TOKENS = 24
"""What one more forward call per step costs, in padded suffix tokens (the launch and hook overhead of a call through
the blocks, and the lower efficiency of a smaller matmul), as :func:`lanes_of` weighs it against the padding a
lane saves; measured on SmolLM2 on one thread (benchmarks/bench_lifelong.py part (b))."""


def lanes_of(counts: Sequence[int], overhead: int = LANE_OVERHEAD_TOKENS) -> list[list[int]]:
    """Rows (indices into ``counts``, each row's suffix length) cut into lanes, each run as one forward padded to its
    longest row: the partition of the rows sorted by length that minimises Σ_lanes (rows × width + ``overhead``)
    (a dynamic programme over the sorted lengths; rows of equal length never split). Right-padding every row to the
    batch's longest suffix wastes ~40% of a step's tokens on CounterFact requests, whose short essence rows
    ("{subject} is a") and long rewrite rows share a batch."""
    order = sorted(range(len(counts)), key=lambda r: (counts[r], r))
    c = [counts[r] for r in order]
    n = len(c)
    best, cut = [0] + [0] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        best[j], cut[j] = min((best[i] + (j - i) * c[j - 1] + overhead, i) for i in range(j)
                              if i == 0 or c[i - 1] != c[i])
    lanes, j = [], n
    while j > 0:
        lanes.append(order[cut[j]:j])
        j = cut[j]
    return lanes[::-1]


class _Lane:
    """Rows of a :class:`SuffixForward` that run as one forward per step, padded to their own longest suffix, their
    queries attending to their own prefix keys/values (the first ``prefix`` cached positions)."""

    def __init__(self, fwd: SuffixForward, rows: Sequence[int]) -> None:
        idx = torch.tensor(list(rows), dtype=torch.long, device=fwd.ids.device)
        starts, counts = [fwd.starts[r] for r in rows], [fwd.counts[r] for r in rows]
        width, self.prefix = max(counts), max(starts)
        self.rows = idx
        self.ids, self.position_ids = fwd.ids[idx, :width], fwd.position_ids[idx, :width]
        self.entry = fwd.entry[idx, :width]
        self.prefix_kv = [(k[idx, :, : self.prefix], v[idx, :, : self.prefix]) for k, v in fwd.prefix_kv]
        # Mask [b, 1, width, prefix + width]: row r's cached keys before its own p_r, then causal suffix keys.
        device = idx.device
        allowed = torch.zeros((len(rows), width, self.prefix + width), dtype=torch.bool, device=device)
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
        for i, (p, n) in enumerate(zip(starts, counts, strict=True)):
            allowed[i, :n, :p] = True
            allowed[i, :n, self.prefix:self.prefix + n] = causal[:n, :n]
            allowed[i, n:, self.prefix + n:] = torch.eye(width - n, dtype=torch.bool, device=device)  # sees itself
        self.mask = _additive_mask(allowed, fwd.engine.model.dtype)
        self.read = fwd.valid[idx, :width].nonzero(as_tuple=True)  # (lane row, column) of each computed state
        self.targets = (idx[self.read[0]], self.position_ids[self.read])  # (batch row, position) of each


class SuffixForward:
    """The fixed part of one batch's forward (prefix keys/values, block S's input at the suffix, unedited final
    states) and the per-step forward of the suffixes through blocks S..n−1, in lanes of rows of similar suffix
    length (:func:`lanes_of`). Build with :meth:`build`; ``None`` there means: use the full forward. Equal to
    :class:`~editscope.lm.full_forward.FullForward` to float rounding at positions ≤ ``last_read[r]`` (states and
    δ-gradient: ``tests/edit/test_fastpath.py::test_suffix_forward_equals_full_forward``)."""

    def __init__(self, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int], hook_point: str,
                 last_read: Sequence[int], *, lane_overhead: int = LANE_OVERHEAD_TOKENS) -> None:
        self.engine = engine
        self.hook_point = hook_point
        self.lane_overhead = lane_overhead
        self.start, self.fold = start_block(hook_point, engine.n_layers)  # type: ignore[misc]
        self.starts = [int(p) for p in positions]
        self.counts = [int(e) - p + 1 for e, p in zip(last_read, self.starts, strict=True)]
        if min(self.counts) < 1:
            raise ValueError(f"last read positions {list(last_read)} before the subject positions {self.starts}")
        n_rows, width = len(self.starts), max(self.counts)
        prefix = max(self.starts)  # cached key/value length (row r uses the first starts[r] of them)

        # One unedited forward: prefix keys/values at every layer, block S's input, final states of all positions.
        cache = DynamicCache() if prefix else None  # full (non-sliding) layers: the mask sets the window
        entry = f"blocks.{self.start}.resid_pre"
        self.base_hidden, self.as_tuple, store = _unedited_forward(engine, batch, [entry], cache)
        self.prefix_kv = [(k[..., :prefix, :], v[..., :prefix, :]) for k, v, *_ in cache] if cache is not None else []

        # Suffix tokens right-padded to ``width``; their absolute positions continue each row's prefix.
        device = batch.input_ids.device
        ids = torch.full((n_rows, width), engine.pad_id, dtype=torch.long, device=device)
        pos = torch.zeros((n_rows, width), dtype=torch.long, device=device)
        valid = torch.zeros((n_rows, width), dtype=torch.bool, device=device)
        for r, (p, n) in enumerate(zip(self.starts, self.counts, strict=True)):
            ids[r, :n] = batch.input_ids[r, p:p + n]
            pos[r, :n] = torch.arange(p, p + n, device=device)
            pos[r, n:] = p + n  # padding: never read
            valid[r, :n] = True
        self.ids, self.position_ids, self.valid = ids, pos, valid
        entry_states = store[entry]
        self.entry = torch.stack([entry_states[r, pos[r].clamp(max=entry_states.shape[1] - 1)]
                                  for r in range(n_rows)])  # block S's fixed input at the suffix [B, width, d]
        self._layout()

    def _layout(self) -> None:
        """The lanes of the current rows and where their computed states go in [B, T, d]."""
        self.lanes = [_Lane(self, rows) for rows in lanes_of(self.counts, self.lane_overhead)]
        self.targets = (torch.cat([lane.targets[0] for lane in self.lanes]),
                        torch.cat([lane.targets[1] for lane in self.lanes]))

    @classmethod
    def build(cls, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int], hook_point: str,
              last_read: Sequence[int] | None = None) -> SuffixForward | None:
        """The suffix forward of ``batch`` with δ at ``positions``, computing each row up to ``last_read[r]``
        (default: its last token); None where only the full forward is exact (a row longer than the sliding
        window, a hook point outside the blocks)."""
        window = engine.arch.sliding_window(engine.model.config)
        if window is not None and int(batch.attention_mask.sum(-1).max()) > window:
            return None
        if start_block(hook_point, engine.n_layers) is None:
            return None
        if last_read is None:
            last_read = [int(n) - 1 for n in batch.attention_mask.sum(-1).tolist()]
        return cls(engine, batch, positions, hook_point, last_read)

    def select(self, rows: Sequence[int]) -> SuffixForward:
        """The same suffix forward restricted to ``rows`` (in that order), in lanes of its own: what a batched
        optimisation keeps running once some of its requests have stopped early."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.ids.device)
        out = copy.copy(self)
        out.starts, out.counts = [self.starts[r] for r in rows], [self.counts[r] for r in rows]
        out.ids, out.position_ids, out.valid = self.ids[idx], self.position_ids[idx], self.valid[idx]
        out.entry, out.base_hidden = self.entry[idx], self.base_hidden[idx]
        out.prefix_kv = [(k[idx], v[idx]) for k, v in self.prefix_kv]
        out._layout()
        return out

    def _run_lane(self, lane: _Lane, edit: SuffixEdit) -> torch.Tensor:
        """The lane's suffix states [b, width, d] with ``edit`` applied at the hook point."""

        def enter(_x: torch.Tensor) -> torch.Tensor:
            return edit(lane.entry, lane.rows) if self.fold else lane.entry

        fns = {f"blocks.{self.start}.resid_pre": enter}
        if not self.fold:
            fns[self.hook_point] = lambda x: edit(x, lane.rows)
        cache = DynamicCache(ddp_cache_data=lane.prefix_kv) if lane.prefix else None
        model, arch = self.engine.model, self.engine.arch
        with hooks(model, arch, fns), _skip_blocks(model.get_submodule(arch.blocks), self.start, self.as_tuple):
            return self.engine.base_forward(
                input_ids=lane.ids,  # embedded, then replaced by block S's recorded input
                attention_mask=lane.mask,
                position_ids=lane.position_ids,
                **cache_kwargs(self.engine.base_module, cache),
            ).last_hidden_state

    def hidden(self, delta: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, T, d] of the batch with δ added at each row's subject position: positions up
        to each row's last read one computed now, lane by lane (differentiable in δ), the others from the unedited
        forward. ``delta`` is one vector [d] for every row or one per row [B, d] (several requests optimised
        together)."""

        def add(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            x[:, 0] = x[:, 0] + (delta if delta.dim() == 1 else delta[rows]).to(x)  # each suffix opens at p_r
            return x

        return self.hidden_with(add)

    def hidden_with(self, edit: SuffixEdit) -> torch.Tensor:
        """:meth:`hidden` with any intervention at the hook point: ``edit(x, rows)`` maps the states there [b, width,
        d] of a lane's rows (``rows``: their indices in the batch; column j is position p_r + j, padding past each
        row's count) to the edited states, e.g. a value written at every computed position (GRACE)."""
        computed = [self._run_lane(lane, edit)[lane.read] for lane in self.lanes]
        return self.base_hidden.index_put(self.targets, torch.cat(computed))


class SharedContextForward:
    """The forward of a batch whose rows all continue one context (APP: the edit prompt followed by each answer),
    with the context computed once per step instead of once per row, read up to ``last_read[r]`` of each row.

    Per step, two forwards replace the batch's: the context's tail (positions p .. m−1, one row; δ at p) through
    blocks S..n−1 over the fixed prefix keys/values (as :class:`SuffixForward`), then the rows' continuation tokens
    (positions m .. ``last_read[r]``), packed into one sequence without padding, through blocks S..n−1, attending
    to the tail's keys/values under a block-causal mask (so δ's gradient flows through them once). Block S's input
    at the continuation positions is the unedited one: δ enters at p < m only. Without a hook point (FT trains weights,
    no δ) p = S = 0: the whole context runs once per step, then the continuations.

    :meth:`hidden` returns [B, T, d]: exact (to float rounding) at positions p .. ``last_read[r]``, the unedited
    states elsewhere. Build with :meth:`build`; None there means the rows do not share their context (or carry
    ``context_embeds``), δ is not at one position inside the context, or only the full forward is exact (sliding
    window, hook point outside the blocks). Equal to :class:`~editscope.lm.full_forward.FullForward` to float
    rounding there (``tests/edit/test_app.py::test_side_batch_on_the_fast_path_equals_the_full_forward``)."""

    def __init__(self, engine: ScoringEngine, batch: TokenBatch, hook_point: str | None, position: int,
                 last_read: Sequence[int]) -> None:
        self.engine = engine
        self.hook_point = hook_point
        m = batch.context_lengths[0]
        if hook_point is None:
            self.start, self.fold, p = 0, False, 0
        else:
            self.start, self.fold = start_block(hook_point, engine.n_layers)  # type: ignore[misc]
            p = int(position)
        counts = [int(e) - m + 1 for e in last_read]  # continuation positions each row runs (0: none)
        if min(counts) < 0:
            raise ValueError(f"last read positions {list(last_read)} before the context's end {m - 1}")
        n_rows = len(counts)

        # One unedited forward of the batch: its final states, every layer's keys/values, block S's input.
        cache = DynamicCache()
        entry = f"blocks.{self.start}.resid_pre"
        self.base_hidden, self.as_tuple, store = _unedited_forward(engine, batch, [entry] if hook_point else [], cache)
        kv = [(k[:1], v[:1]) for k, v, *_ in cache]  # row 0's: the context is every row's
        # copies, not views, so the whole batch's cache is freed after this
        self.prefix_kv = [(k[..., :p, :].clone(), v[..., :p, :].clone()) for k, v in kv]
        self.below_kv = [(k[..., :m, :].clone(), v[..., :m, :].clone())
                         for k, v in kv[: self.start]]  # never read: lengths only
        # block S's unedited input (with a hook point; FT runs from the embeddings): the tail's (a copy, as a view
        # would keep every row's states alive) and, below, the continuation tokens'
        states = store[entry] if hook_point is not None else None
        self.tail_entry = states[:1, p:m].clone() if states is not None else None
        device = batch.input_ids.device
        self.tail_ids = batch.input_ids[:1, p:m]
        self.tail_pos = torch.arange(p, m, device=device)[None]
        dtype = engine.model.dtype
        tail_allowed = torch.ones((m - p, m), dtype=torch.bool, device=device).tril(diagonal=p)
        self.tail_mask = _additive_mask(tail_allowed[None], dtype)

        # Every row's continuation tokens packed into one sequence (no padding): token j of row r sits at position
        # m + j and attends to the whole context and to row r's tokens up to j.
        total = sum(counts)
        rows = torch.tensor([r for r, n in enumerate(counts) for _ in range(n)], dtype=torch.long, device=device)
        cols = torch.tensor([m + j for n in counts for j in range(n)], dtype=torch.long, device=device)
        allowed = torch.zeros((total, m + total), dtype=torch.bool, device=device)
        allowed[:, :m] = True
        offset = 0
        for n in counts:
            allowed[offset:offset + n, m + offset:m + offset + n] = torch.ones((n, n), dtype=torch.bool,
                                                                                device=device).tril()
            offset += n
        self.ids, self.position_ids = batch.input_ids[rows, cols][None], cols[None]
        self.entry = states[rows, cols][None] if states is not None else None  # [1, total, d]
        self.mask = _additive_mask(allowed[None], dtype)
        self.targets = (rows, cols)
        self.tail_targets = (torch.arange(n_rows, device=device).repeat_interleave(m - p),
                             torch.arange(p, m, device=device).repeat(n_rows))
        self.n_rows = n_rows

    @classmethod
    def build(cls, engine: ScoringEngine, batch: TokenBatch, hook_point: str | None, positions: Sequence[int],
              last_read: Sequence[int]) -> SharedContextForward | None:
        """The shared-context forward of ``batch`` (δ at ``positions``, the same in every row), or None."""
        m = batch.context_lengths[0]
        if any(c != m for c in batch.context_lengths) or not bool((batch.input_ids[:, :m] == batch.input_ids[:1, :m])
                                                                 .all()):
            return None
        if any(e is not None for e in batch.context_embeds):
            return None
        window = engine.arch.sliding_window(engine.model.config)
        if window is not None and int(batch.attention_mask.sum(-1).max()) > window:
            return None
        if hook_point is not None and (start_block(hook_point, engine.n_layers) is None
                                       or len(set(positions)) != 1 or int(positions[0]) >= m):
            return None
        return cls(engine, batch, hook_point, int(positions[0]) if hook_point is not None else 0, last_read)

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, cache: DynamicCache,
             fns: dict) -> torch.Tensor:
        model, arch = self.engine.model, self.engine.arch
        with hooks(model, arch, fns), _skip_blocks(model.get_submodule(arch.blocks), self.start, self.as_tuple):
            return self.engine.base_forward(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                                     **cache_kwargs(self.engine.base_module, cache)).last_hidden_state

    def hidden(self, delta: torch.Tensor | None) -> torch.Tensor:
        """Final hidden states [B, T, d] with δ (a vector [d], or None without a hook point) at the context's p."""
        entry = f"blocks.{self.start}.resid_pre"

        def add(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            x[:, 0] = x[:, 0] + delta.to(x)
            return x

        fns: dict = {}
        if self.hook_point is not None:
            fns[entry] = (lambda _x: add(self.tail_entry)) if self.fold else (lambda _x: self.tail_entry)
            if not self.fold:
                fns[self.hook_point] = add
        cache = DynamicCache(ddp_cache_data=self.prefix_kv)  # every layer, p long (0: empty)
        tail = self._run(self.tail_ids, self.tail_mask, self.tail_pos, cache, fns)
        out = self.base_hidden.index_put(self.tail_targets, tail[0].repeat(self.n_rows, 1))
        if not self.ids.shape[1]:
            return out
        kv = [*self.below_kv, *[(k, v) for k, v, *_ in cache][self.start:]]
        fns = {entry: lambda _x: self.entry} if self.hook_point is not None else {}
        cont = self._run(self.ids, self.mask, self.position_ids, DynamicCache(ddp_cache_data=kv), fns)
        return out.index_put(self.targets, cont[0])


class BlockForward:
    """The final hidden states of a batch when only blocks S..n−1 can change between calls (a weight inside block S
    or above trained step by step, as WISE's side memory): block S's input at every position is recorded by one
    no-grad forward, and each call runs blocks S..n−1 only, with blocks 0..S−1 passed through. Equal to
    ``engine.batch_hidden(batch)`` to float rounding (``tests/edit/test_wise.py``). Rows longer than a sliding
    attention window are not special: every position is computed, under the model's own mask."""

    def __init__(self, engine: ScoringEngine, batch: TokenBatch, start: int, also: Sequence[str] = ()) -> None:
        self.engine, self.batch, self.start = engine, batch, int(start)
        entry = f"blocks.{self.start}.resid_pre"
        _, self.as_tuple, store = _unedited_forward(engine, batch, [entry, *also], None)
        self.entry = store[entry]
        #: the unedited states at the hook points ``also`` names (e.g. a module's input the caller needs too)
        self.recorded = {name: store[name] for name in also}

    def select(self, rows: Sequence[int]) -> BlockForward:
        """The same forward restricted to ``rows`` (in that order), without another unedited forward: what a batched
        optimisation keeps running once some of its rows have stopped."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.entry.device)
        out = copy.copy(self)
        out.batch, out.entry = select_rows(self.batch, rows), self.entry[idx]
        out.recorded = {name: states[idx] for name, states in self.recorded.items()}
        return out

    def hidden(self, shift: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [B, T, d], differentiable in whatever blocks S..n−1 read, and in ``shift`` [B, T, d]
        added to block S's recorded input when given (a change made below block S, e.g. to block S − 1's MLP
        output)."""
        model, arch = self.engine.model, self.engine.arch
        entry = self.entry if shift is None else self.entry + shift
        with hooks(model, arch, {f"blocks.{self.start}.resid_pre": lambda _x: entry}), \
                _skip_blocks(model.get_submodule(arch.blocks), self.start, self.as_tuple):
            return self.engine.batch_hidden(self.batch)


def continuation_nll(engine: ScoringEngine, batch: TokenBatch, hidden: torch.Tensor) -> torch.Tensor:
    """[B]: each row's mean negative log-likelihood of its continuation tokens given the final states ``hidden`` [B,
    T, d] (position t predicts token t + 1), the LM head applied at those positions only."""
    read = batch.target_mask[:, 1:].bool()
    tokens, row_of = batch.input_ids[:, 1:][read], read.nonzero()[:, 0]
    lp = engine.logits_from_hidden(hidden[:, :-1][read]).float().log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    total = torch.zeros(read.shape[0], dtype=lp.dtype, device=lp.device).index_add(0, row_of, lp)
    return -total / read.sum(1).clamp(min=1)
