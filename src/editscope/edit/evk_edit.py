"""EVK-Edit — AlphaEdit with the EVK-Align term (paper 004, ../shared/papers/004, §3.3 and §4.1).

The paper's main method: AlphaEdit's null-space constrained update (:mod:`editscope.edit.alphaedit`) whose v*
objective carries EVK-Align (:mod:`editscope.edit.plugins.evk_align`, eqs 11-14). The EVK settings are
hyperparameters of the method (``evk_*``); defaults are the paper's GPT2-XL / GPT-J values (σ = 0.1, λ = 0.3,
N = 1; k = 10 early, 50 late). The paper's LLaMA3-8B values are σ = 0.2, λ = 0.05.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from editscope.data.evk import DRIFTS
from editscope.data.records import EditRequest
from editscope.edit import alphaedit
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.plugins.evk_align import EvkAlign, EvkAlignHParams
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine


@dataclass
class EvkEditHParams(alphaedit.AlphaEditHParams):
    method = "evk_edit"
    evk_sigma: float = 0.1
    evk_lam: float = 0.3
    evk_n: int = 1
    evk_k1: int = 10
    evk_k2: int = 50
    evk_switch_step: int = 10
    evk_drifts: list[str] = field(default_factory=lambda: list(DRIFTS))
    evk_seed: int = 0

    #: EVK-Align's σ and λ: the paper's values were set on GPT-J
    TUNABLE = {"evk_sigma": (0.05, 0.1, 0.3), "evk_lam": (0.1, 0.3, 1.0)}

    def align(self) -> EvkAlignHParams:
        """The EVK-Align settings of these hparams (validated)."""
        return EvkAlignHParams.from_dict(
            dict(sigma=self.evk_sigma, lam=self.evk_lam, n=self.evk_n, k1=self.evk_k1, k2=self.evk_k2,
                 switch_step=self.evk_switch_step, drifts=list(self.evk_drifts), seed=self.evk_seed),
            "<evk_edit hparams (evk_*)>")

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        self.align()


def compute(bundle, requests: Sequence[EditRequest], hp: EvkEditHParams,
            state: alphaedit.AlphaEditState | None = None, *, engine: ScoringEngine, runtime: EditRuntime,
            extra_terms: Sequence[ObjectiveTerm] = (), presolved: dict[int, tuple[torch.Tensor, int]] | None = None
            ) -> tuple[dict[str, torch.Tensor], dict]:
    """AlphaEdit's ΔW with EVK-Align (from ``hp.evk_*``) added to its v* loss (``presolved``: AlphaEdit's)."""
    if any(t.name == EvkAlign.name for t in extra_terms):
        raise EditscopeError("evk_edit already includes EVK-Align (set evk_* hparams); do not attach the "
                             "evk_align plug-in to it")
    return alphaedit.compute(bundle, requests, hp, state, engine=engine, runtime=runtime,
                             extra_terms=[EvkAlign(hp.align()), *extra_terms], presolved=presolved)
