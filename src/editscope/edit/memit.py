"""MEMIT — Mass-Editing Memory in a Transformer (Meng et al. 2023).

1. For each request i, z_i = h_i^L + δ_i where h^L is the residual stream after the last edit layer L at the
   subject's last token and δ_i minimises the v* objective at that hook point (eq. 16).
2. For each edit layer l (in order), with the earlier layers' updates already in place:
   K = keys k_i^l averaged over context prefixes (eq. 18) as columns, R = (Z − H^L) / (number of remaining
   layers) (residual spread, eq. 19-20), and

       Δ^l = R Kᵀ (λ·C^l + K Kᵀ)⁻¹                                                      (eq. 14)

   where C^l = E[k kᵀ] is the *mean* key second moment and λ = ``mom2_update_weight`` (the reference code
   multiplies its mean ``mom2`` by this weight; it stands for the sample count of eq. 14's K₀K₀ᵀ).

The per-layer solve is a parameter (``solver``) so AlphaEdit, PRUNE and RECT reuse steps 1-2.

``convention: paper`` (default) averages each k_i^l uniformly over all templates (eq. 18) and reads the
essence KL after "{subject} is a" (eq. 16). ``convention: reference`` computes as kmeng01/memit: keys averaged
within each template group, then over groups (``compute_ks``; the bare prompt is its own group, weighing ½ with
one group of prefixes), and the essence KL read at the subject's last token (``compute_z``'s ``lookup_idxs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from editscope.data.records import EditRequest
from editscope.edit.context import (
    context_templates,
    key_statistics,
    subject_keys,
    subject_states,
    template_weights,
    temporarily_added,
)
from editscope.edit.hparams import VStarHParams
from editscope.edit.objective import ObjectiveTerm, VSpec, optimisation_summary, solve_requests
from editscope.edit.runtime import EditRuntime
from editscope.lm.engine import ScoringEngine

#: solver(layer index in hp.layers, layer, K [in, n] float64, R [out, n] float64) -> ΔW (out, in) float64; a solver
#: may also have ``condition(layer, K) -> float``, κ₂ of the matrix it inverts (reported under runtime.diagnostics)
Solver = Callable[[int, int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class MemitHParams(VStarHParams):
    LAYER_RULE = "window"  # derived layers follow MEMIT's window (hparams.derived_layers)
    method = "memit"
    clamp_norm_factor: float = 0.75
    mom2_update_weight: float = 15000.0

    #: mom2_update_weight: λ of (λ·C + K Kᵀ) (1.5e4-2e4 in the originals; 0 = no statistics term).
    RANGES = {"mom2_update_weight": "[0, 1e12]"}
    #: λ spreads the update against the statistics: the original's 1.5e4 was set for GPT-J's key scale
    TUNABLE = {"mom2_update_weight": (1500.0, 15000.0)}


def memit_system(keys: torch.Tensor, cov: torch.Tensor, lam: float) -> torch.Tensor:
    """λC + K Kᵀ (in, in), float64: the matrix MEMIT eq. 14 inverts, for keys K [in, n]."""
    keys = keys.double()
    return lam * cov.to(device=keys.device, dtype=torch.float64) + keys @ keys.T


def memit_update(keys: torch.Tensor, resid: torch.Tensor, cov: torch.Tensor, lam: float) -> torch.Tensor:
    """ΔW (out, in) = R Kᵀ (λC + K Kᵀ)⁻¹ (MEMIT eq. 14), keys K [in, n], residuals R [out, n], float64.
    For one key and λ → 0 this tends to ROME's r (C⁻¹k)ᵀ / (kᵀC⁻¹k) (Sherman–Morrison)."""
    adj = torch.linalg.solve(memit_system(keys, cov, lam), keys.double())
    return resid.double() @ adj.T


def symmetric_condition(a: torch.Tensor) -> float:
    """κ₂ = λ_max / λ_min of a symmetric positive definite matrix (float64 eigenvalues; inf when λ_min ≤ 0): a
    diagnostic of how close a solve is to singular (not in the papers; NAS-style collapse analyses watch it)."""
    eig = torch.linalg.eigvalsh(a.double())
    return float(eig[-1] / eig[0]) if eig[0] > 0 else float("inf")


def every_request(groups: Sequence[tuple[EditRequest, ...]]) -> list[EditRequest]:
    """The peers whose z MEMIT solves together with an edit of a window: every request of every case."""
    return [r for g in groups for r in g]


def compute_targets(bundle, engine: ScoringEngine, runtime: EditRuntime, requests: Sequence[EditRequest],
                    hp: VStarHParams, templates: Sequence[str], extra_terms: Sequence[ObjectiveTerm],
                    info: dict) -> torch.Tensor:
    """z_i = h_i + δ_i at ``blocks.{last layer}.resid_post`` (MEMIT eq. 16), [n, hidden] float64.

    The δ_i of one edit are independent (each on the unedited model): they are optimised together, several
    requests per batched forward (:func:`~editscope.edit.objective.solve_requests`; ``runtime.settings.vstar_batch``),
    and in runner ``mode: single`` with the other cases' requests of the open window of independent edits."""
    spec = VSpec.of(hp, f"blocks.{hp.layers[-1]}.resid_post", templates)
    solved = solve_requests(engine, runtime, requests, spec, extra_terms, peers=every_request)
    for s in solved:
        info.setdefault("requests", []).append({"losses": s.losses, "delta_norm": float(s.delta.norm()),
                                                "v_init_norm": float(s.v_init.norm())})
    info.update(optimisation_summary(solved, spec.adam))
    return torch.stack([s.v_init + s.delta for s in solved])


def spread_over_layers(bundle, engine: ScoringEngine, runtime: EditRuntime, requests: Sequence[EditRequest],
                       hp: VStarHParams, solver: Solver, *, extra_terms: Sequence[ObjectiveTerm] = (),
                       after: Callable[[Callable[[int], torch.Tensor]], None] | None = None,
                       ) -> tuple[dict[str, torch.Tensor], dict]:
    """Steps 1-2 of the module docstring with a pluggable per-layer solve. ``after(keys_at)`` is called with
    the updates of all layers in place (``keys_at(layer)`` -> K [in, n]) before the model is restored."""
    templates = context_templates(engine, hp.context_templates, hp.template_seed, hp.template_start,
                                  runtime.templates)
    weights = template_weights(hp.context_templates, hp.switches()["key_average"])
    info: dict = {"templates": templates, "template_weights": weights}
    zs = compute_targets(bundle, engine, runtime, requests, hp, templates, extra_terms, info)
    info["vectors"] = {"z": zs}
    z_layer = hp.layers[-1]
    deltas: dict[str, torch.Tensor] = {}

    def keys_at(layer: int) -> torch.Tensor:
        return subject_keys(engine, requests, templates, [layer], weights)[:, 0].T

    condition = getattr(solver, "condition", None) if runtime.diagnostics else None
    with temporarily_added(bundle, {}) as add:
        for i, layer in enumerate(hp.layers):
            keys = keys_at(layer)
            current = subject_states(engine, requests, z_layer, "resid_post")
            resid = (zs - current).T / (len(hp.layers) - i)
            if condition is not None:
                info.setdefault("solve_cond", {})[layer] = condition(layer, keys)
            upd = bundle.arch.from_out_in(solver(i, layer, keys, resid)).float().contiguous()
            name = bundle.arch.weight_name(layer)
            add(name, upd)
            deltas[name] = upd
            info.setdefault("vectors", {})[f"keys.{layer}"] = keys
            info["vectors"][f"resid.{layer}"] = resid
        if after is not None:
            after(keys_at)
    if "solve_cond" in info:
        info["solve_cond_max"] = max(info["solve_cond"].values())
    return deltas, info


@dataclass(frozen=True)
class MemitSolve:
    """The per-layer solve of eq. 14 (a :data:`Solver`) with the presolved C per layer; PRUNE and RECT reuse it."""

    covs: dict[int, torch.Tensor]
    lam: float

    def __call__(self, _i: int, layer: int, keys: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        return memit_update(keys, resid, self.covs[layer], self.lam)

    def condition(self, layer: int, keys: torch.Tensor) -> float:
        return symmetric_condition(memit_system(keys, self.covs[layer], self.lam))


def compute(bundle, requests: Sequence[EditRequest], hp: MemitHParams, state=None, *, engine: ScoringEngine,
            runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = (),
            presolved: dict[int, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """ΔW per edit layer; ``presolved``: C per layer (:func:`~editscope.edit.context.key_statistics`)."""
    covs = presolved if presolved is not None else key_statistics(bundle, hp)
    return spread_over_layers(bundle, engine, runtime, requests, hp, MemitSolve(covs, hp.mom2_update_weight),
                              extra_terms=extra_terms)
