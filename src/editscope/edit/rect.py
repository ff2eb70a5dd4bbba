"""RECT — RElative Change in weighT regularisation (Gu et al. 2024, "Model Editing Harms General Abilities
of Large Language Models: Regularization to the Rescue", §4).

The update ΔW of a locate-then-edit method (here MEMIT's) is sparsified per edited matrix: only the top
``rect_share`` (e.g. 40 %) of entries by relative change |Δ_ij| / |W_ij| keep their value, the others are set
to zero (eq. 3-4). Exactly ``round(share · numel)`` entries are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from editscope.data.records import EditRequest
from editscope.edit.memit import MemitHParams, memit_update, spread_over_layers
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.runtime import EditRuntime
from editscope.lm.engine import ScoringEngine
from editscope.stats import second_moments


@dataclass
class RectHParams(MemitHParams):
    method = "rect"
    rect_share: float = 0.4

    RANGES = {"rect_share": "(0, 1]"}  # the share of ΔW's entries kept: none kept would be no edit


def keep_top_relative(delta: torch.Tensor, weight: torch.Tensor, share: float) -> torch.Tensor:
    """Δ with all but the top ``share`` of entries by |Δ|/|W| zeroed (RECT eq. 3-4)."""
    rel = delta.abs().double() / weight.abs().double()  # |W| = 0 gives inf: always kept
    k = int(round(share * delta.numel()))
    keep = torch.zeros(delta.numel(), dtype=torch.bool, device=delta.device)
    keep[torch.topk(rel.flatten(), k).indices] = True
    return torch.where(keep.view_as(delta), delta, torch.zeros_like(delta))


def compute(bundle, requests: Sequence[EditRequest], hp: RectHParams, state=None, *, engine: ScoringEngine,
            runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()) -> tuple[dict[str, torch.Tensor], dict]:
    params = dict(bundle.model.named_parameters())
    covs = second_moments(bundle, hp.layers, token_budget=hp.mom2_tokens, weights="base", stats_dtype=hp.mom2_dtype)
    weights = {bundle.arch.weight_name(layer): params[bundle.arch.weight_name(layer)].detach().clone()
               for layer in hp.layers}

    def solver(_i: int, layer: int, keys: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        return memit_update(keys, resid, covs[layer], hp.mom2_update_weight)

    raw, info = spread_over_layers(bundle, engine, runtime, requests, hp, solver, extra_terms=extra_terms)
    return {name: keep_top_relative(d, weights[name], hp.rect_share).contiguous() for name, d in raw.items()}, info
