"""EVK-Align — embedding-virtualized knowledge alignment (paper 004, ../shared/papers/004, §3.2, eqs 10-14).

One more term of the loss of any optimising editor (the v* of ROME/MEMIT/AlphaEdit/PRUNE/RECT, the weights of
FT):

    L = L_Edit + λ · (1/N) Σ_i D_KL( p̃_θ^(k)(·|x̂_i) ‖ p̃_θ+δ^(k)(·|x̂_i) )                     (eqs 11-12)

over N EVK copies x̂_i of the edit prompt (its input embeddings with Δ ~ N(0, σ²I) on the subject, relation or
all tokens, the drift type drawn per copy from ``drifts``; eqs 7-8, :mod:`editscope.data.evk`). p_θ is the
*unedited* model's next-token distribution after x̂_i (recorded once in ``setup``: the pre-edit distribution
comes first, the reverse of ROME's essence KL), p_θ+δ the distribution with the candidate δ (or weights).
Both are restricted to I_k = TopK(p_θ) and renormalised there (eqs 13-14). Progressive regulation (§3.2.2):
k = ``k1`` for the first ``switch_step`` optimisation steps, then ``k2`` (paper: 10 then 50; the paper gives
no switch point — 10 is half of the shipped configs' 20 v* steps).

The copies are fixed for one edited request (seeded by ``seed`` and the request), so p_θ is computed once. They
are rows of the optimisation's main batch (:meth:`EvkAlign.rows`), δ added at the subject's last token of the edit
prompt as in the request's own rows: the term reads the one forward per step the optimiser runs anyway, so the
requests of a MEMIT-family batch still share one forward per step with EVK-Align on (``batched``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import torch

from editscope.data.evk import DRIFTS, drift_embeddings, instance_seed, prompt_spans
from editscope.data.records import EditRequest
from editscope.edit.context import subject_last_token_index
from editscope.edit.objective import TermRows, VContext, VStep
from editscope.edit.plugins import PluginHParams, PluginSpec
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.scorer import ScoreRequest


def topk_kl(pre_logprobs: torch.Tensor, post_logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """Per-row D_KL(p̃_pre ‖ p̃_post) over the top-``k`` tokens of ``pre`` renormalised (paper 004, eqs 13-14).

    Args:
        pre_logprobs: [N, V] log-probs (or logits: renormalisation removes any per-row constant) of the
            unedited model; treated as constant.
        post_logprobs: [N, V] log-probs (or logits) of the edited model.
        k: size of I_k (capped at V).

    Returns:
        [N] KL divergences (nats), differentiable in ``post_logprobs``.
    """
    k = min(int(k), pre_logprobs.shape[-1])
    idx = pre_logprobs.detach().topk(k, dim=-1).indices
    p = pre_logprobs.detach().gather(-1, idx).double()
    q = post_logprobs.gather(-1, idx).double()
    p = p - p.logsumexp(-1, keepdim=True)
    q = q - q.logsumexp(-1, keepdim=True)
    return (p.exp() * (p - q)).sum(-1)


@dataclass
class EvkAlignHParams(PluginHParams):
    """EVK-Align settings (paper 004 §4.3.3's baseline σ=0.3, λ=0.1, N=1; §4.1's k schedule 10 -> 50)."""

    sigma: float = 0.3
    lam: float = 0.1
    n: int = 1
    k1: int = 10
    k2: int = 50
    switch_step: int = 10
    drifts: list[str] = field(default_factory=lambda: list(DRIFTS))
    seed: int = 0

    #: sigma: the drift noise's standard deviation; lam: the loss weight; n: perturbed copies per step (each is a
    #: forward); k1/k2: top-k of the KL before/after switch_step.
    RANGES = {"sigma": "[0, 1e3]", "lam": "[0, 1e6]", "n": "[1, 1000]", "k1": "[1, 1e7]", "k2": "[1, 1e7]",
              "switch_step": "[0, 10000]", "seed": "[0, 1e18]"}
    #: σ and λ: the paper's were set on GPT-J
    TUNABLE = {"sigma": (0.05, 0.1, 0.3), "lam": (0.03, 0.1, 0.3)}

    def check(self, where: str = "<evk_align>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        bad = [d for d in self.drifts if d not in DRIFTS]
        if bad or not self.drifts:
            raise EditscopeError(f"{where}: key 'drifts': a non-empty subset of {', '.join(DRIFTS)}, got {self.drifts}")


@dataclass
class _Copies:
    """What ``setup`` records per request: the copies' rows of the main batch, their read positions and drift
    types, p_θ there (log-probs), and the number of calls so far (the k schedule)."""

    rows: list[int]
    read: list[int]
    drifts: list[str]
    pre: torch.Tensor
    calls: int = 0


class EvkAlign:
    """The EVK-Align loss term (:class:`~editscope.edit.objective.terms.ObjectiveTerm`); see the module docstring."""

    name = "evk_align"
    batched = True

    def __init__(self, hp: EvkAlignHParams) -> None:
        self.hp = hp

    # Equal settings, equal term: a window of independent edits (objective.solve) shares δ between requests
    # optimised under equal terms, e.g. every case of an EVK-Edit run, whose edits each build a new instance.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, EvkAlign) and self.hp == other.hp

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(asdict(self.hp), sort_keys=True)))

    def copies(self, engine: ScoringEngine, request: EditRequest) -> tuple[list[str], list[torch.Tensor]]:
        """Drift type and perturbed embeddings of each of the N copies of ``request``'s prompt (seeded)."""
        template = request.prompt.rstrip()  # the engine moves a trailing space off the context
        spans = prompt_spans(engine, template, request.subject)
        clean = engine.embed(list(spans.ids))
        gen = torch.Generator().manual_seed(instance_seed(self.hp.seed, "evk_align", spans.text, request.target_new,
                                                          float(self.hp.sigma)))
        drifts, embeds = [], []
        for _ in range(self.hp.n):
            drift = self.hp.drifts[int(torch.randint(len(self.hp.drifts), (1,), generator=gen))]  # host generator
            drifts.append(drift)
            embeds.append(drift_embeddings(clean, spans.span(drift), self.hp.sigma, gen))
        return drifts, embeds

    def rows(self, engine: ScoringEngine, request: EditRequest) -> TermRows:
        """The N copies as rows of the main batch (the continuation is a filler: only the next-token distribution
        after the prompt is read), δ at the subject's last token."""
        _, embeds = self.copies(engine, request)
        text = request.prompt.rstrip().replace("{}", request.subject)
        position = subject_last_token_index(engine, request.prompt.rstrip(), request.subject)
        return TermRows([ScoreRequest(text, request.target_new, e) for e in embeds], [position] * len(embeds))

    def setup(self, ctx: VContext) -> None:
        if self.name not in ctx.term_rows:
            raise ValueError("evk_align: the optimisation's context was built without this term's rows "
                             "(pass the terms to build_context / weights_context)")
        rows = ctx.term_rows[self.name]
        read = [ctx.batch.context_lengths[r] - 1 for r in rows]
        drifts, _ = self.copies(ctx.engine, ctx.request)
        with torch.no_grad():  # p_θ: the unedited forward the optimiser records its fixed states from
            pre = VStep(ctx, None, ctx.unedited_hidden()).logprobs_at(rows, read).detach()
        ctx.store[self.name] = _Copies(rows, read, drifts, pre)

    def k_at(self, step_index: int) -> int:
        """The progressive top-k schedule (paper 004 §3.2.2): k1 before ``switch_step``, then k2."""
        return self.hp.k1 if step_index < self.hp.switch_step else self.hp.k2

    def __call__(self, step: VStep) -> torch.Tensor:
        copies: _Copies = step.ctx.store[self.name]
        k = self.k_at(copies.calls)
        copies.calls += 1
        post = step.logprobs_at(copies.rows, copies.read)
        kl = topk_kl(copies.pre, post, k).mean()
        return (self.hp.lam * kl).to(step.hidden.dtype)


def make(hp: EvkAlignHParams) -> EvkAlign:
    return EvkAlign(hp)


SPEC = PluginSpec(
    name="evk_align",
    label="EVK-Align",
    hparams_class=EvkAlignHParams,
    make=make,
    doc="λ·mean KL(p_pre ‖ p_post) on N embedding-perturbed copies of the edit prompt, top-k renormalised "
        "(paper 004 eqs 11-14)",
)

__all__ = ["SPEC", "EvkAlign", "EvkAlignHParams", "topk_kl"]
