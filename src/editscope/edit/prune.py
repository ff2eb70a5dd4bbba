"""PRUNE — perturbation-restrained sequential editing (Ma et al. 2025, ICLR; "Perturbation-Restrained
Sequential Model Editing").

Sequential edits accumulate ΔW = Σ_t Δ_t on top of W₀; the condition number of W₀ + ΔW grows with the large
singular values of ΔW. PRUNE restrains every singular value σ of the accumulated ΔW that exceeds the largest
singular value σ̄ of W₀ with a log rescale (eq. 7, base e):

    F(σ) = σ̄ + ln(σ / σ̄)      for σ > σ̄;   F(σ) = σ otherwise,

and edits with ΔW_restrained = U F(Σ) Vᵀ. The per-edit update Δ_t is MEMIT's (same hparams plus none new).
After every call the model holds W₀ + F(Σ_t Δ_t); the returned patch is the change from the previous state.
The accumulated raw ΔW and σ̄ live in :class:`PruneState`, owned by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from editscope.data.records import EditRequest
from editscope.edit.memit import MemitHParams, memit_update, spread_over_layers
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.runtime import EditRuntime
from editscope.edit.state import EditState, expect_keys, meta_field
from editscope.lm.engine import ScoringEngine
from editscope.stats import second_moments


@dataclass
class PruneHParams(MemitHParams):
    method = "prune"


@dataclass
class PruneState(EditState):
    """Per parameter: the accumulated raw ΔW (float64), the restrained ΔW currently applied, σ̄(W₀)."""

    accumulated: dict[str, torch.Tensor] = field(default_factory=dict)
    applied: dict[str, torch.Tensor] = field(default_factory=dict)
    sigma_max: dict[str, float] = field(default_factory=dict)

    def without_edits(self) -> PruneState:
        """No accumulated ΔW; σ̄ is re-read from W₀ at the next first edit (cheap)."""
        return PruneState()

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``accumulated.NAME`` and ``applied.NAME`` per parameter; metadata: σ̄ per parameter."""
        tensors = {f"accumulated.{n}": t for n, t in self.accumulated.items()}
        tensors |= {f"applied.{n}": t for n, t in self.applied.items()}
        return tensors, {"sigma_max": dict(self.sigma_max)}

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], where: str) -> PruneState:
        sigma = meta_field(meta, "sigma_max", dict, where)
        expect_keys(tensors, {f"{kind}.{n}" for n in sigma for kind in ("accumulated", "applied")}, where)
        return cls({n: tensors[f"accumulated.{n}"] for n in sigma}, {n: tensors[f"applied.{n}"] for n in sigma},
                   {n: float(v) for n, v in sigma.items()})


def restrain(delta: torch.Tensor, sigma_max: float) -> torch.Tensor:
    """U F(Σ) Vᵀ with F(σ) = σ̄ + ln(σ/σ̄) for σ > σ̄ (PRUNE eq. 7), float64."""
    u, s, vh = torch.linalg.svd(delta.double(), full_matrices=False)
    big = s > sigma_max
    s = torch.where(big, sigma_max + torch.log(s.clamp(min=1e-300) / sigma_max), s)
    return (u * s) @ vh


def compute(bundle, requests: Sequence[EditRequest], hp: PruneHParams, state: PruneState | None = None, *,
            engine: ScoringEngine, runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()
            ) -> tuple[dict[str, torch.Tensor], dict]:
    state = state if state is not None else PruneState()
    params = dict(bundle.model.named_parameters())
    covs = second_moments(bundle, hp.layers, token_budget=hp.mom2_tokens, weights="base", stats_dtype=hp.mom2_dtype)

    def solver(_i: int, layer: int, keys: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        return memit_update(keys, resid, covs[layer], hp.mom2_update_weight)

    raw, info = spread_over_layers(bundle, engine, runtime, requests, hp, solver, extra_terms=extra_terms)
    out = {}
    info["restrained"] = {}
    ratio = 0.0
    for name, delta in raw.items():
        if name not in state.sigma_max:  # first edit of this parameter: W₀ is the current weight
            state.sigma_max[name] = float(torch.linalg.matrix_norm(params[name].detach().double(), ord=2))
            state.accumulated[name] = torch.zeros_like(delta, dtype=torch.float64)
            state.applied[name] = torch.zeros_like(delta, dtype=torch.float64)
        state.accumulated[name] = state.accumulated[name] + delta.double()
        restrained = restrain(state.accumulated[name], state.sigma_max[name])
        out[name] = (restrained - state.applied[name]).float().contiguous()
        state.applied[name] = restrained
        sv = torch.linalg.svdvals(state.accumulated[name])
        info["restrained"][name] = int((sv > state.sigma_max[name]).sum())
        ratio = max(ratio, float(sv[0]) / state.sigma_max[name])
    # scalars, kept in every result row: whether the restraint acts yet (it does once the ratio exceeds 1)
    info["restrained_total"] = sum(info["restrained"].values())
    info["top_sv_ratio"] = ratio  # max over layers of σ₁(accumulated ΔW) / σ₁(W₀)
    return out, info
