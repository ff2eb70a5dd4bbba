"""FT-L — constrained fine-tuning of one MLP down projection (Zhu et al. 2020; the FT-L baseline of ROME,
Meng et al. 2022, §4 / App. G).

W of ``blocks.L`` MLP down projection (or each MLP matrix named in ``modules``: gate, up, down) is trained with
Adam on the target NLL of each request's prompt (the :class:`~editscope.edit.objective.terms.TargetNLL` term plus
any plug-in terms); after each step every entry is clamped to ‖W − W₀‖_∞ ≤ ``norm_constraint`` (the L∞
constraint of FT-L). The model is restored on return; the patch holds W_final − W₀.

Every term's ``setup`` runs once per request before training (unedited weights); each step runs one forward per
group of requests (their rows stacked and right-padded up to the engine's token budget, as the v*/z optimiser groups
them; one request per group when a plug-in term is not ``batched``), shared by all terms (the loss is the mean over
requests of the summed terms). Rows never attend to each other, so the loss equals the one-request-at-a-time sum to
float rounding; a batch of 100 short CounterFact prompts runs in a few forwards instead of 100.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from editscope.data.records import EditRequest
from editscope.edit.hparams import (
    TUNE_LAYERS,
    HParams,
    Modules,
    ModulesKey,
    check_modules,
    default_modules,
)
from editscope.edit.objective import ObjectiveTerm, TargetNLL, VContext, VStep, setup_terms, weights_context
from editscope.edit.objective.optimise import concat_batches, request_groups
from editscope.edit.runtime import EditRuntime
from editscope.lm.engine import ScoringEngine
from editscope.progress import report


@dataclass
class FTHParams(ModulesKey, HParams):
    LAYER_RULE = "single"  # derived layers follow ROME's layer (hparams.derived_layers)
    method = "ft"
    lr: float = 5e-4
    steps: int = 25
    norm_constraint: float = 5e-4
    stop_loss: float = 1e-2
    #: the MLP matrices trained at each of ``layers`` (gate, up, down; FT-L's is the down projection), or a layer set
    #: per matrix (:data:`~editscope.edit.hparams.Modules`)
    modules: Modules = field(default_factory=default_modules)

    #: norm_constraint: the L∞ bound on each weight's change (a shipped config uses 1e9 for "unconstrained").
    RANGES = {"lr": "(0, 10]", "steps": "[1, 10000]", "norm_constraint": "(0, inf)", "stop_loss": "[0, 1e6]"}
    #: The bound's grid stays below lr x steps (Adam moves an entry by about lr per step: 1.25e-2 at the defaults),
    #: so every candidate is FT-L; a larger bound never binds and is plain FT (measured: 2e-2 and 1e-1 equal). Its
    #: low end is for models whose MLP rows are long or large: on Gemma3-270M 1e-3 already flipped neighbours.
    TUNABLE = {"layers": TUNE_LAYERS, "lr": (1e-4, 5e-4, 1e-3),
               "norm_constraint": (1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        check_modules(self.modules, self.layers, where)



def _step_loss(step: VStep, terms: Sequence[ObjectiveTerm]) -> torch.Tensor:
    """All terms on one forward (``step.hidden``)."""
    return sum(term(step) for term in terms)


def _group_loss(engine: ScoringEngine, ctxs: Sequence[VContext], terms: Sequence[ObjectiveTerm]) -> torch.Tensor:
    """Σ over ``ctxs`` of their summed terms, from one forward of their rows stacked (each context reads its own
    rows, at its own width)."""
    if len(ctxs) == 1:
        return _step_loss(VStep(ctxs[0], None, engine.batch_hidden(ctxs[0].batch)), terms)
    hidden = engine.batch_hidden(concat_batches([c.batch for c in ctxs], engine.pad_id))
    loss, offset = 0.0, 0
    for ctx in ctxs:
        rows, width = ctx.batch.input_ids.shape
        loss = loss + _step_loss(VStep(ctx, None, hidden[offset:offset + rows, :width]), terms)
        offset += rows
    return loss


def compute(bundle, requests: Sequence[EditRequest], hp: FTHParams, state=None, *, engine: ScoringEngine,
            runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()) -> tuple[dict[str, torch.Tensor], dict]:
    params = dict(bundle.model.named_parameters())
    names = [bundle.arch.weight_name(layer, bundle.arch.matrix_part(m)) for layer, m in hp.written()]
    originals = {n: params[n].detach().clone() for n in names}
    terms = [TargetNLL(), *extra_terms]
    ctxs = [weights_context(engine, r, terms, forward=runtime.settings.strategy) for r in requests]
    for ctx in ctxs:
        setup_terms(ctx, terms)
    if all(term.batched for term in terms):
        groups = [[ctxs[i] for i in g] for g in request_groups(ctxs, engine.token_budget)]
    else:
        groups = [[ctx] for ctx in ctxs]
    history = []
    try:
        for n in names:
            params[n].requires_grad_(True)
        opt = torch.optim.Adam([params[n] for n in names], lr=hp.lr)
        for i in range(hp.steps):
            report("fine-tuning step", i + 1, hp.steps)
            opt.zero_grad()
            with torch.enable_grad():
                loss = sum(_group_loss(engine, group, terms) for group in groups) / len(ctxs)
            history.append(float(loss.detach()))
            if float(loss.detach()) < hp.stop_loss or i == hp.steps - 1:
                break
            loss.backward()
            opt.step()
            with torch.no_grad():
                for n in names:
                    w0 = originals[n]
                    params[n].copy_(torch.clamp(params[n], w0 - hp.norm_constraint, w0 + hp.norm_constraint))
        deltas = {n: (params[n].detach() - originals[n]).contiguous() for n in names}
    finally:
        with torch.no_grad():
            for n in names:
                params[n].requires_grad_(False)
                params[n].copy_(originals[n])
    return deltas, {"losses": history}
