"""The v*/z objective: loss terms (``terms``), one request's problem (``problem``), the one optimiser loop
(``optimise``), the forward strategies it is handed (``forward``) and the solving of edit requests (``solve``).
The formulas live in ``terms``; the speed machinery lives below, in :mod:`editscope.lm.partial_forward`."""

from editscope.edit.objective.forward import FORWARDS, ForwardStrategy, forward_strategy
from editscope.edit.objective.optimise import AdamSettings, optimise, request_groups
from editscope.edit.objective.problem import ESSENCE_TEMPLATE, VContext, build_context, weights_context
from editscope.edit.objective.solve import (
    Solved,
    VSpec,
    independent_edits,
    optimisation_summary,
    solve_requests,
)
from editscope.edit.objective.terms import (
    EssenceKL,
    NormPenalty,
    ObjectiveTerm,
    TargetNLL,
    Term,
    TermRows,
    VStep,
    default_terms,
    setup_terms,
)

__all__ = [
    "AdamSettings", "ESSENCE_TEMPLATE", "EssenceKL", "FORWARDS", "ForwardStrategy", "NormPenalty", "ObjectiveTerm",
    "Solved", "TargetNLL", "Term", "TermRows", "VContext", "VSpec", "VStep", "build_context", "default_terms",
    "forward_strategy", "independent_edits", "optimisation_summary", "optimise", "request_groups", "setup_terms",
    "solve_requests", "weights_context",
]
