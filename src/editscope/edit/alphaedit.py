"""AlphaEdit — null-space constrained knowledge editing (Fang et al. 2025, ICLR).

Preserved knowledge K₀ spans the directions of C = E[k kᵀ] with large singular values; the projector onto
the (approximate) null space is P = Û Ûᵀ for the singular vectors of C whose singular value is below
``nullspace_threshold`` (2e-2 in the original configs; eq. 9-10). With MEMIT's targets and residual spread,
the per-layer update (eq. 14, reference code) is

    Δᵀ = (P (K₁K₁ᵀ + K_p K_pᵀ) + L2·I)⁻¹ P K₁ Rᵀ

where K_p K_pᵀ accumulates the keys of earlier edits (sequential editing; held in :class:`AlphaEditState`,
which the caller owns). Δᵀ lies in the range of P, so Δ k = 0 for every k with P k = 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from editscope.data.records import EditRequest
from editscope.edit.hparams import VStarHParams
from editscope.edit.memit import spread_over_layers
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.runtime import EditRuntime
from editscope.edit.state import EditState, expect_keys, meta_field
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.stats import second_moments


@dataclass
class AlphaEditHParams(VStarHParams):
    LAYER_RULE = "window"  # derived layers follow MEMIT's window (hparams.derived_layers)
    method = "alphaedit"
    clamp_norm_factor: float = 0.75
    nullspace_threshold: float = 2e-2
    L2: float = 10.0

    #: nullspace_threshold: P keeps C's singular directions with singular value below it (eq. 10), so at or below
    #: 0 it keeps none and the edit changes nothing; L2: the ridge term of the solve (> 0 keeps it invertible).
    RANGES = {"nullspace_threshold": "(0, inf)", "L2": "(0, 1e12]"}
    TUNABLE = {"L2": (1.0, 10.0)}


@dataclass
class AlphaEditState(EditState):
    """Sequential-editing state: per layer the projector P and the accumulated K_p K_pᵀ (float64)."""

    projections: dict[int, torch.Tensor] = field(default_factory=dict)
    cache_c: dict[int, torch.Tensor] = field(default_factory=dict)
    null_dims: dict[int, int] = field(default_factory=dict)
    n_edits: int = 0

    def without_edits(self) -> AlphaEditState:
        """A state sharing the (expensive, read-only) projectors but with no accumulated keys: for independent
        single edits without recomputing the SVDs."""
        return AlphaEditState(dict(self.projections), {la: torch.zeros_like(c) for la, c in self.cache_c.items()},
                              dict(self.null_dims), 0)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Per layer P (``projection.L``) and K_p K_pᵀ (``cache_c.L``); metadata: null-space sizes, edits so far.
        P is saved rather than recomputed so a resumed chain uses the very same projector."""
        tensors = {f"projection.{la}": p for la, p in self.projections.items()}
        tensors |= {f"cache_c.{la}": c for la, c in self.cache_c.items()}
        return tensors, {"null_dims": {str(la): n for la, n in self.null_dims.items()}, "n_edits": self.n_edits}

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any],
                        where: str) -> AlphaEditState:
        dims = meta_field(meta, "null_dims", dict, where)
        try:
            layers = sorted(int(la) for la in dims)
        except ValueError:
            raise EditscopeError(f"{where}: editor state: metadata key 'null_dims': keys must be layer numbers") \
                from None
        expect_keys(tensors, {f"{kind}.{la}" for la in layers for kind in ("projection", "cache_c")}, where)
        return cls({la: tensors[f"projection.{la}"] for la in layers}, {la: tensors[f"cache_c.{la}"] for la in layers},
                   {la: int(dims[str(la)]) for la in layers}, meta_field(meta, "n_edits", int, where))


def null_space(cov: torch.Tensor, threshold: float) -> tuple[torch.Tensor, int]:
    """P = Û Ûᵀ over singular vectors of C with singular value < threshold (AlphaEdit eq. 10), and the number of
    those vectors (the null space's dimension), from one SVD."""
    u, s, _ = torch.linalg.svd(cov.double())
    small = u[:, s < threshold]
    return small @ small.T, int(small.shape[1])


def null_space_projector(cov: torch.Tensor, threshold: float) -> torch.Tensor:
    """P of :func:`null_space`."""
    return null_space(cov, threshold)[0]


def alphaedit_system(keys: torch.Tensor, proj: torch.Tensor, cache_c: torch.Tensor, l2: float) -> torch.Tensor:
    """P(K₁K₁ᵀ + K_pK_pᵀ) + L2·I (in, in), float64: the matrix AlphaEdit eq. 14 inverts (not symmetric)."""
    keys = keys.double()
    eye = torch.eye(keys.shape[0], dtype=torch.float64, device=keys.device)
    return proj @ (keys @ keys.T + cache_c) + l2 * eye


def alphaedit_update(keys: torch.Tensor, resid: torch.Tensor, proj: torch.Tensor, cache_c: torch.Tensor,
                     l2: float) -> torch.Tensor:
    """ΔW (out, in) = [(P(K₁K₁ᵀ + K_pK_pᵀ) + L2·I)⁻¹ P K₁ Rᵀ]ᵀ (AlphaEdit eq. 14, reference code), float64."""
    keys = keys.double()
    return torch.linalg.solve(alphaedit_system(keys, proj, cache_c, l2), proj @ keys @ resid.double().T).T


@dataclass(frozen=True)
class AlphaEditSolve:
    """The per-layer solve of eq. 14 (a :data:`~editscope.edit.memit.Solver`) on ``state``'s P and K_p K_pᵀ, and
    :meth:`remember`, which adds this edit's keys of every edit layer to K_p K_pᵀ once all updates are in place."""

    state: AlphaEditState
    l2: float
    layers: tuple[int, ...]

    def __call__(self, _i: int, layer: int, keys: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        return alphaedit_update(keys, resid, self.state.projections[layer], self.state.cache_c[layer], self.l2)

    def condition(self, layer: int, keys: torch.Tensor) -> float:
        """κ₂ = σ_max / σ_min of the (non-symmetric) matrix the solve inverts."""
        lhs = alphaedit_system(keys, self.state.projections[layer], self.state.cache_c[layer], self.l2)
        return float(torch.linalg.cond(lhs))

    def remember(self, keys_at: Callable[[int], torch.Tensor]) -> None:
        for layer in self.layers:
            keys = keys_at(layer)
            self.state.cache_c[layer] = self.state.cache_c[layer] + keys @ keys.T


def presolve(bundle, hp: AlphaEditHParams, state: AlphaEditState | None = None
             ) -> dict[int, tuple[torch.Tensor, int]]:
    """(P, null-space dimension) per edit layer: the state's when it holds them (they come from the unedited model,
    computed once per chain), else from C (eq. 10)."""
    have = state.projections if state is not None else {}
    missing = [layer for layer in hp.layers if layer not in have]
    covs = second_moments(bundle, missing, token_budget=hp.mom2_tokens, weights="base",
                          stats_dtype=hp.mom2_dtype) if missing else {}
    return {layer: (have[layer], state.null_dims[layer]) if layer in have
            else null_space(covs[layer].to(bundle.device), hp.nullspace_threshold) for layer in hp.layers}


def compute(bundle, requests: Sequence[EditRequest], hp: AlphaEditHParams, state: AlphaEditState | None = None, *,
            engine: ScoringEngine, runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = (),
            presolved: dict[int, tuple[torch.Tensor, int]] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """ΔW per edit layer; ``state`` records the projectors (``presolved``: :func:`presolve`) and gains the keys."""
    state = state if state is not None else AlphaEditState()
    presolved = presolved if presolved is not None else presolve(bundle, hp, state)
    for layer, (proj, dim) in presolved.items():
        if layer not in state.projections:
            state.projections[layer], state.null_dims[layer] = proj, dim
            state.cache_c[layer] = torch.zeros_like(proj)
    solve = AlphaEditSolve(state, hp.L2, tuple(hp.layers))
    deltas, info = spread_over_layers(bundle, engine, runtime, requests, hp, solve, extra_terms=extra_terms,
                                      after=solve.remember)
    state.n_edits += len(requests)
    info["null_space_dims"] = {layer: state.null_dims[layer] for layer in hp.layers}
    return deltas, info
