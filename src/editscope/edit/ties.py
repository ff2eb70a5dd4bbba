"""TIES merging of task vectors (Yadav et al., "TIES-Merging: Resolving Interference When Merging Models",
NeurIPS 2023, §3, Algorithm 1), as WISE merges its knowledge shards (Wang et al., NeurIPS 2024, §2.3.2).

For task vectors τ_i = W_i − W_0 with weights λ_i:

1. *trim*: keep the ``density`` share of each τ_i's entries of largest magnitude, zero the rest;
2. *elect*: the sign of Σ_i λ_i τ̂_i per entry (a zero sum elects +);
3. *disjoint merge*: per entry, the λ-weighted sum of the trimmed values whose sign agrees with the elected one,
   divided by the sum of their weights (an entry no vector agrees on stays W_0's).

With ``normalize`` off the agreeing values are summed without the division (the reference code's
``magnitude``/``sum`` switch; WISE's ``ties`` merges with it on).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from editscope.errors import EditscopeError


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """``delta`` with all but its ``density`` share of largest-magnitude entries zeroed (k = ⌊density · n⌋)."""
    if density >= 1:
        return delta
    k = int(density * delta.numel())
    if k < 1:
        raise EditscopeError(f"ties: density {density} keeps no entry of a tensor of {delta.numel()}")
    flat = delta.reshape(-1)
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[flat.abs().float().topk(k).indices] = True
    return (flat * keep).reshape(delta.shape)


def ties_merge(base: torch.Tensor, tensors: Sequence[torch.Tensor], weights: Sequence[float], density: float,
               normalize: bool = True) -> torch.Tensor:
    """W_0 + the TIES merge of ``tensors`` (each a full weight like ``base``), see the module docstring."""
    if len(tensors) != len(weights) or not tensors:
        raise EditscopeError(f"ties: {len(tensors)} tensor(s) and {len(weights)} weight(s): one weight per tensor, "
                             "at least one")
    if not 0 < density <= 1:
        raise EditscopeError(f"ties: density must be in (0, 1], got {density}")
    deltas = torch.stack([trim(t - base, density) for t in tensors])
    lam = torch.tensor(list(weights), dtype=deltas.dtype, device=deltas.device).reshape(-1, *[1] * base.dim())
    weighted = deltas * lam
    elected = torch.where(weighted.sum(0) >= 0, 1.0, -1.0).to(deltas.dtype)
    agree = (deltas.sign() == elected).to(deltas.dtype)
    mixed = (weighted * agree).sum(0)
    if normalize:
        divisor = (lam * agree).sum(0)
        mixed = mixed / torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    return (base + mixed).to(base.dtype)
