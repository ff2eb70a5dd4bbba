"""ROME — Rank-One Model Editing (Meng et al. 2022, "Locating and Editing Factual Associations in GPT").

For one request at layer L (hook point ``blocks.L.mlp_out``; weight W of the MLP down projection):

- k* = (1/N) Σ_j k(x_j + s): the key at the subject's last token averaged over short prefixes (eq. 3).
- v* = v₀ + δ*, δ* from the objective of :mod:`editscope.edit.objective.terms` (eq. 4).
- Ŵ = W + Λ (C⁻¹k*)ᵀ with Λ = (v* − W k*) / ((C⁻¹k*)ᵀ k*) (eq. 2; PEAK eq. 13), C = E[k kᵀ] the uncentered
  second moment of the keys (:mod:`editscope.stats`). ``mom2_adjustment: false`` uses C = I.

``convention: paper`` (default) reads eq. 2 literally: the template-averaged k* in the residual and the
denominator, so Ŵ k* = v*. ``convention: reference`` computes as kmeng01/rome does (``compute_v``: ``cur_input``,
``cur_output`` at the bare prompt; ``right_vector = (target − cur_output) / (cur_input · left_vector)``;
``compute_u``: ``left_vector ∝ C⁻¹k*``): Λ = (v* − W k_bare) / ((C⁻¹k*)ᵀ k_bare) with k_bare the key at the
subject's last token of the bare prompt, so Ŵ k_bare = v*; and the essence KL is read at the subject's last
token (:class:`~editscope.edit.objective.terms.EssenceKL`). k* is the uniform mean over the templates under both
(ROME's ``compute_u`` has no template groups).

Several requests are edited one after another (each on the model already holding the previous ones), as
the reference implementation does; the patch holds the summed update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from editscope.data.records import EditRequest
from editscope.edit.context import (
    context_templates,
    key_statistics,
    mlp_out_of_keys,
    subject_keys,
    subject_states,
    temporarily_added,
)
from editscope.edit.hparams import VStarHParams
from editscope.edit.objective import ObjectiveTerm, VSpec, optimisation_summary, solve_requests
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine


@dataclass
class RomeHParams(VStarHParams):
    LAYER_RULE = "single"  # derived layers follow ROME's layer (hparams.derived_layers)
    method = "rome"
    mom2_adjustment: bool = True

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        if len(self.layers) != 1:
            raise EditscopeError(f"{where}: key 'layers': ROME edits exactly one layer, got {self.layers}")

    def stats_layers(self) -> list[int]:
        return list(self.layers) if self.mom2_adjustment else []  # C = I needs no statistics


def rank_one_update(k: torch.Tensor, residual: torch.Tensor, cov: torch.Tensor | None,
                    k_apply: torch.Tensor | None = None) -> torch.Tensor:
    """ΔW (out, in) = r (C⁻¹k)ᵀ / ((C⁻¹k)ᵀ k_a) (ROME eq. 2 with k_a = k, r = v* − W k*; the reference code's
    form with k_a = k_bare, r = v* − W k_bare). ``cov=None`` means C = I. Then ΔW k_a = r exactly. float64."""
    k = k.double()
    k_apply = k if k_apply is None else k_apply.double()
    u = torch.linalg.solve(cov.to(device=k.device, dtype=torch.float64), k) if cov is not None else k
    return torch.outer(residual.double(), u) / torch.dot(u, k_apply)


def first_requests(groups: Sequence[tuple[EditRequest, ...]]) -> list[EditRequest]:
    """The peers whose v* ROME solves together with a window's first edit: each case's first request."""
    return [g[0] for g in groups]


def compute(bundle, requests: Sequence[EditRequest], hp: RomeHParams, state=None, *, engine: ScoringEngine,
            runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = (),
            presolved: dict[int, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """ΔW of the edit layer (stored orientation) and diagnostics; the model is unchanged on return.
    ``presolved``: C of the edit layer (:func:`~editscope.edit.context.key_statistics`; none: C = I)."""
    layer = hp.layers[0]
    name = bundle.arch.weight_name(layer)
    cov = (presolved if presolved is not None else key_statistics(bundle, hp)).get(layer)
    templates = context_templates(engine, hp.context_templates, hp.template_seed, hp.template_start,
                                  runtime.templates)
    weight = dict(bundle.model.named_parameters())[name]
    total = torch.zeros(weight.shape, dtype=torch.float64, device=weight.device)
    info: dict = {"templates": templates, "requests": []}
    all_solved = []
    with temporarily_added(bundle, {}) as add:
        spec = VSpec.of(hp, f"blocks.{layer}.mlp_out", templates)
        for j, request in enumerate(requests):
            # the first request's v* is computed on the model as handed over: in runner mode single, together
            # with the first requests of the other cases of the window (objective.independent_edits)
            solved = solve_requests(engine, runtime, [request], spec, extra_terms,
                                    peers=first_requests if j == 0 else None)[0]
            all_solved.append(solved)
            delta = solved.delta
            v_star = solved.v_init + delta
            k_star = subject_keys(engine, [request], templates, [layer])[0, 0]
            # the key the update is solved on (switch update_key): k* (eq. 2) or the bare prompt's key (reference
            # compute_v's cur_input)
            bare = hp.switches()["update_key"] == "bare"
            k_apply = subject_states(engine, [request], layer, "mlp_key")[0] if bare else k_star
            residual = v_star - mlp_out_of_keys(bundle, layer, k_apply[None])[0]
            upd = bundle.arch.from_out_in(rank_one_update(k_star, residual, cov, k_apply))
            add(name, upd.float())
            total += upd
            info["requests"].append({"losses": solved.losses, "delta_norm": float(delta.norm()),
                                     "v_init_norm": float(solved.v_init.norm())})
            info.setdefault("vectors", {}).setdefault("k_star", []).append(k_star)
            info["vectors"].setdefault("k_apply", []).append(k_apply)
            info["vectors"].setdefault("v_star", []).append(v_star)
    info.update(optimisation_summary(all_solved, spec.adam))
    return {name: total.float().contiguous()}, info
