"""A small loss-term plug-in for the plug-in tests: ``weight · ‖δ − center·1‖²`` on the v* offset δ, whose
gradient 2·weight·(δ − center) is known in closed form. Importing this module registers it (the tests reach it
from the CLI with ``--plugin-module tests.edit.l2_plugin``). Also a ``count`` plug-in recording set-up calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from editscope.edit.objective import Term, VContext, VStep
from editscope.edit.plugins import PluginHParams, PluginSpec, register_plugin


@dataclass
class L2HParams(PluginHParams):
    weight: float = 0.0
    center: float = 0.0


@dataclass
class L2Term(Term):
    weight: float
    center: float
    name: str = "l2"

    def __call__(self, step: VStep) -> torch.Tensor:
        if step.delta is None:  # weight-optimising editors (FT) have no δ
            return step.hidden.new_zeros(())
        return self.weight * (step.delta - self.center).pow(2).sum()


L2 = register_plugin(PluginSpec("l2", "L2", L2HParams, lambda hp: L2Term(hp.weight, hp.center),
                                "weight · ‖δ − center‖² on the v* offset (test plug-in)"))


@dataclass
class CountHParams(PluginHParams):
    pass


#: (kind, request subject) per call of every CountTerm, in order
CALLS: list[tuple[str, str]] = []


@dataclass
class CountTerm(Term):
    name: str = "count"
    log: list = field(default_factory=lambda: CALLS)

    def setup(self, ctx: VContext) -> None:
        self.log.append(("setup", ctx.request.subject))

    def __call__(self, step: VStep) -> torch.Tensor:
        self.log.append(("call", step.ctx.request.subject))
        return step.hidden.new_zeros(())


COUNT = register_plugin(PluginSpec("count", "Count", CountHParams, lambda hp: CountTerm()))
