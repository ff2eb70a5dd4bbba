"""MEND's editor networks (Mitchell et al. 2022, "Fast Model Editing at Scale", ICLR; §3.1, eq. 3; the MEND baseline
of paper 003, ../shared/papers/003 App. B.1).

For an edited weight W_ℓ (out × in) the fine-tuning gradient on one example is a sum of rank-one terms,
∇W_ℓ = Σ_i δ_i u_iᵀ (u_i: the layer's input at position i, δ_i: the loss gradient w.r.t. its output). MEND maps
each pair through a low-rank MLP g on z_i = [ū_i; δ̄_i] (each factor normalised to zero mean and unit variance by
running statistics gathered during training, as the reference code does):

    h = z + ReLU(s¹_ℓ ⊙ (U₁ V₁ z + b) + o¹_ℓ)          (eq. 3a)
    g(z) = h + ReLU(s²_ℓ ⊙ U₂ V₂ h + o²_ℓ)             (eq. 3b)

with U zero-initialised (g is the identity at init), per-layer scale s and shift o (networks shared across the
layers, MEND's default, or one per layer), and splits g(z_i) = [ũ_i; δ̃_i]. The update is
ΔW_ℓ = −α_ℓ Σ_i δ̃_i ũ_iᵀ with a learned per-layer step size α_ℓ (eq. 2 and §3.2).
"""

from __future__ import annotations

import torch
from torch import nn


class Normaliser(nn.Module):
    """Running mean and variance of the rows it sees (Chan et al.'s parallel update), frozen at edit time."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("m2", torch.zeros(dim, dtype=torch.float64))

    @torch.no_grad()
    def update(self, rows: torch.Tensor) -> None:
        rows = rows.detach().double()
        n, mean = rows.shape[0], rows.mean(0)
        m2 = ((rows - mean) ** 2).sum(0)
        total = self.count + n
        delta = mean - self.mean
        self.m2 += m2 + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.count.fill_(float(total))

    def std(self) -> torch.Tensor:
        var = self.m2 / (self.count - 1) if float(self.count) > 1 else torch.zeros_like(self.m2)
        return var.sqrt()

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        if float(self.count) < 2:  # no statistics yet (an untrained editor): pass the rows through
            return rows
        return (rows - self.mean.to(rows.dtype)) / (self.std().to(rows.dtype) + 1e-7)


class LowRankMLP(nn.Module):
    """The two residual low-rank layers of eq. 3 (scale and shift are passed in per layer)."""

    def __init__(self, dim: int, rank: int, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.v1 = nn.Parameter(torch.empty(rank, dim).uniform_(-1, 1, generator=gen) * (6 / (rank + dim)) ** 0.5)
        self.u1 = nn.Parameter(torch.zeros(dim, rank))
        self.b1 = nn.Parameter(torch.zeros(dim))
        self.v2 = nn.Parameter(torch.empty(rank, dim).uniform_(-1, 1, generator=gen) * (6 / (rank + dim)) ** 0.5)
        self.u2 = nn.Parameter(torch.zeros(dim, rank))

    def forward(self, z: torch.Tensor, s1: torch.Tensor, o1: torch.Tensor, s2: torch.Tensor,
                o2: torch.Tensor) -> torch.Tensor:
        h = z + torch.relu(s1 * (z @ self.v1.T @ self.u1.T + self.b1) + o1)
        return h + torch.relu(s2 * (h @ self.v2.T @ self.u2.T) + o2)


class MendNets(nn.Module):
    """Editor networks for ``n_layers`` edited weights of shape (d_out, d_in): per-layer normalisers, scales,
    shifts and step sizes; one shared :class:`LowRankMLP` or one per layer."""

    def __init__(self, n_layers: int, d_in: int, d_out: int, rank: int, edit_lr: float, shared: bool = True,
                 seed: int = 0) -> None:
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        dim = d_in + d_out
        self.mlps = nn.ModuleList([LowRankMLP(dim, rank, seed + i) for i in range(1 if shared else n_layers)])
        self.u_norm = nn.ModuleList([Normaliser(d_in) for _ in range(n_layers)])
        self.d_norm = nn.ModuleList([Normaliser(d_out) for _ in range(n_layers)])
        self.s1 = nn.Parameter(torch.ones(n_layers, dim))
        self.o1 = nn.Parameter(torch.zeros(n_layers, dim))
        self.s2 = nn.Parameter(torch.ones(n_layers, dim))
        self.o2 = nn.Parameter(torch.zeros(n_layers, dim))
        self.lrs = nn.Parameter(torch.full((n_layers,), float(edit_lr)))

    def mlp(self, j: int) -> LowRankMLP:
        return self.mlps[0 if len(self.mlps) == 1 else j]

    def factors(self, j: int, u: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ũ, δ̃) = g([ū; δ̄]) split, for rows u [n, d_in], δ [n, d_out] of the j-th edited layer."""
        z = torch.cat([self.u_norm[j](u), self.d_norm[j](delta)], dim=-1)
        g = self.mlp(j)(z, self.s1[j], self.o1[j], self.s2[j], self.o2[j])
        return g[:, : self.d_in], g[:, self.d_in:]

    def update(self, j: int, u: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """ΔW_j = −α_j Σ_i δ̃_i ũ_iᵀ, (d_out, d_in)."""
        u_t, d_t = self.factors(j, u, delta)
        return -self.lrs[j] * (d_t.T @ u_t)
