"""The v* / z optimisation's forward, computed only where δ can act (issue 13 item 1).

δ enters the residual stream at one position per row: the subject's last token p_r (ROME: output of layer L's
MLP; MEMIT: after block L). Under causal attention no position before p_r attends to it, so at every layer the
states at positions < p_r equal the unedited model's. One unedited forward per edit (with a key/value cache)
records them; every optimisation step then runs the model only on the suffix p_r .. end of each row, its
queries attending to the cached prefix keys/values of the same row (the prefix sharing of DESIGN.md: a
``DynamicCache`` filled by one forward, then a forward of the continuations under a mask covering
prefix + continuation). The final hidden states of the prefix positions come from that same unedited forward,
so :meth:`SuffixForward.hidden` returns the same [B, L, d] tensor as a full forward with δ installed (to float
rounding), at a fraction of the cost: typically 4-7 of 15-20 tokens per row.

Weights stay frozen (``Bundle`` loads them with ``requires_grad=False``): the backward pass computes δ's
gradient only. The LM head runs where the objective reads (:class:`editscope.edit.objectives.VStep`).

Rows longer than a sliding attention window (Gemma 3's local layers) take the full forward: a custom mask would
bypass the window (as :meth:`editscope.lm.engine.ScoringEngine.score` refuses such rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.hooks import hooks


class SuffixForward:
    """The fixed part of one batch's forward (prefix keys/values, unedited final states) and the per-step
    forward of the suffixes. Build with :meth:`build`; ``None`` there means: use the full forward."""

    def __init__(self, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int], hook_point: str) -> None:
        self.engine = engine
        self.hook_point = hook_point
        lengths = batch.attention_mask.sum(-1).tolist()
        starts = [int(p) for p in positions]
        counts = [int(n) - p for n, p in zip(lengths, starts, strict=True)]
        n_rows, width = len(starts), max(counts)
        self.prefix = max(starts)  # cached key/value length (row r uses the first starts[r] of them)

        # One unedited forward: the prefix keys/values at every layer and the final states of all positions.
        cache = DynamicCache() if self.prefix else None  # full (non-sliding) layers: the mask sets the window
        with torch.no_grad():
            self.base_hidden = engine.batch_hidden(batch, cache=cache).detach()
        self.prefix_kv = [(k[..., : self.prefix, :], v[..., : self.prefix, :])
                          for k, v, *_ in cache] if cache is not None else []

        # Suffix tokens right-padded to ``width``; their absolute positions continue each row's prefix.
        ids = torch.full((n_rows, width), engine.pad_id, dtype=torch.long)
        pos = torch.zeros((n_rows, width), dtype=torch.long)
        valid = torch.zeros((n_rows, width), dtype=torch.bool)
        for r, (p, n) in enumerate(zip(starts, counts, strict=True)):
            ids[r, :n] = batch.input_ids[r, p:p + n]
            pos[r, :n] = torch.arange(p, p + n)
            pos[r, n:] = p + n  # padding: never read
            valid[r, :n] = True
        self.ids, self.position_ids, self.valid = ids, pos, valid
        self.embeds = None
        if any(e is not None for e in batch.context_embeds):
            with torch.no_grad():
                full = engine.model.get_input_embeddings()(batch.input_ids).clone()
                for r, e in enumerate(batch.context_embeds):
                    if e is not None:
                        full[r, : e.shape[0]] = e.to(full.dtype)
                self.embeds = torch.stack([full[r, pos[r].clamp(max=full.shape[1] - 1)] for r in range(n_rows)])

        # Mask [B, 1, width, prefix + width]: row r's cached keys before its own p_r, then causal suffix keys.
        allowed = torch.zeros((n_rows, width, self.prefix + width), dtype=torch.bool)
        causal = torch.ones((width, width), dtype=torch.bool).tril()
        for r, (p, n) in enumerate(zip(starts, counts, strict=True)):
            allowed[r, :n, :p] = True
            allowed[r, :n, self.prefix:self.prefix + n] = causal[:n, :n]
            allowed[r, n:, self.prefix + n:] = torch.eye(width - n, dtype=torch.bool)  # padding sees itself
        dtype = engine.model.dtype
        self.mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
        self.rows, self.cols = valid.nonzero(as_tuple=True)
        self.targets = (self.rows, self.position_ids[self.rows, self.cols])

    @classmethod
    def build(cls, engine: ScoringEngine, batch: TokenBatch, positions: Sequence[int],
              hook_point: str) -> SuffixForward | None:
        """The suffix forward of ``batch`` with δ at ``positions``, or None where only the full forward is exact
        (a row longer than the sliding window)."""
        window = engine.arch.sliding_window(engine.model.config)
        if window is not None and int(batch.attention_mask.sum(-1).max()) > window:
            return None
        return cls(engine, batch, positions, hook_point)

    def hidden(self, delta: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, L, d] of the batch with δ added at each row's subject position: the suffix
        computed now (differentiable in δ), the prefix from the unedited forward."""
        n_rows = self.ids.shape[0]
        rows = torch.arange(n_rows)

        def add(x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            x[rows, 0] = x[rows, 0] + delta.to(x.dtype)  # the subject's last token is each suffix's first
            return x

        cache = DynamicCache(ddp_cache_data=self.prefix_kv) if self.prefix else None
        with hooks(self.engine.model, self.engine.arch, {self.hook_point: add}):
            out = self.engine._base(
                input_ids=None if self.embeds is not None else self.ids,
                inputs_embeds=self.embeds,
                attention_mask=self.mask,
                position_ids=self.position_ids,
                past_key_values=cache,
                use_cache=cache is not None,
            ).last_hidden_state
        return self.base_hidden.index_put(self.targets, out[self.rows, self.cols])
