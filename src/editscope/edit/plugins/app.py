"""APP — Appending via Preservation and Prevention (Ma et al. 2024, "Neighboring Perturbations of Knowledge Editing
on Large Language Models", paper 003 (../shared/papers/003_0255320ecbc315b9.txt), §6 eqs 7-10, appendix C 14-17).

Three terms added to the loss of any optimising editor (v* of ROME/MEMIT/AlphaEdit/PRUNE/RECT, the weights of
FT), on the edit prompt p, with O the other correct answers of the question and O_h the hard false answers:

- L1 (eq 7 / 14): (1/NM) Σ_i Σ_j max(0, M − log P'(o_i|p) + log P'(o_hj|p)), margin M (= 2);
- L2 (eq 8 / 15): (1/N) Σ_i max(0, log P(o_i|p) − log P'(o_i|p)): no correct answer drops below its pre-edit
  log-prob;
- L3 (eq 9 / 16): (1/M) Σ_j max(0, log P'(o_hj|p) − log P(o_hj|p)): no hard false answer rises;

    L = L_e + α·L1 + β·L2 + γ·L3                                                          (eq 10 / 17)

P is the unedited model (recorded once per edited request in ``setup``), P' the model with the candidate
δ (or weights). ``log P(o|p)`` of a multi-token answer is the sequence log-prob (``logprob: sum``, the
paper's ``log P``) or the length-normalised mean that PEAK's reference code uses (``logprob: mean``).

Where the answers come from: the request itself (:class:`~editscope.data.records.EditRequest`
``correct_answers`` / ``hard_false``; the PEAK loader fills them from ``postive_list`` / ``negtive_list``,
``editscope edit`` from ``--correct`` / ``--hard-false``). As in the peak suite, O drops o* and repeats, O_h
drops o*, repeats and every answer also in O, and — with ``filter_answers`` (default) — the suite's pre-edit
filter (paper §5.1, :func:`~editscope.metrics.peak_answer_filter`, on the edit prompt with the unedited model)
keeps only the answers the model ranks as PEAK requires; then the first ``k_correct`` / ``k_false`` answers
are used (paper Fig. 4's k; ``k`` sets both). PEAK's reference code uses the published lists unfiltered
(``filter_answers: false``).

Cost: one extra batched forward per optimisation step holding every APP answer after the bare prompt, with
δ added at the subject's last token (``VContext.run``), as the reference code (which appends these rows to its
main batch). On the fast objective path that forward runs, like the main batch's, only from the edited block
and the subject's last token on, with the prompt computed once for all answers (``fixed=True``;
:class:`~editscope.lm.partial_forward.SharedContextForward`). With FT, ``ctx.run`` runs the weights being trained, the
same way over all blocks; with MEND (whose gradient factors are per row) a full forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from editscope.edit.context import subject_last_token_index
from editscope.edit.objective import VContext, VStep
from editscope.edit.plugins import PluginHParams, PluginSpec, register_plugin
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.metrics import peak_answer_filter

LOGPROB_MODES = ("sum", "mean")


# -- the three terms on log-prob vectors (pure) -----------------------------------------------------------
def margin_loss(correct: torch.Tensor, false: torch.Tensor, margin: float) -> torch.Tensor:
    """L1 = (1/NM) Σ_i Σ_j max(0, M − lp(o_i) + lp(o_hj)) over log-probs ``correct`` [N], ``false`` [M]
    of the edited model (paper 003 eq 7 / eq 14). 0 when either list is empty."""
    if correct.numel() == 0 or false.numel() == 0:
        return correct.new_zeros(())
    return torch.relu(margin - correct[:, None] + false[None, :]).mean()


def preservation_loss(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """L2 = (1/N) Σ_i max(0, lp_pre(o_i) − lp_post(o_i)) over the correct answers (paper 003 eq 8 / eq 15)."""
    if post.numel() == 0:
        return post.new_zeros(())
    return torch.relu(pre - post).mean()


def prevention_loss(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """L3 = (1/M) Σ_j max(0, lp_post(o_hj) − lp_pre(o_hj)) over the hard false answers (paper 003 eq 9 / 16)."""
    if post.numel() == 0:
        return post.new_zeros(())
    return torch.relu(post - pre).mean()


# -- hyperparameters ------------------------------------------------------------------------------------
@dataclass
class AppHParams(PluginHParams):
    """α, β, γ (defaults: paper 003 Table 8, ROME+APP on GPT-2 XL), margin M (appendix B.2: 2), the answer
    log-prob convention, the pre-edit filter and how many answers to use (None: all)."""

    alpha: float = 0.2
    beta: float = 0.2
    gamma: float = 0.1
    margin: float = 2.0
    logprob: str = "sum"
    k: int | None = None
    k_correct: int | None = None
    k_false: int | None = None
    filter_answers: bool = True
    filter_prob: str = "mean"
    max_share_below: float = 0.2

    #: alpha/beta/gamma: loss weights; margin: M in log-prob units; k*: answers used (0 allowed: that part off).
    RANGES = {"alpha": "[0, 1e6]", "beta": "[0, 1e6]", "gamma": "[0, 1e6]", "margin": "[0, 1e6]", "k": "[0, inf)",
              "k_correct": "[0, inf)", "k_false": "[0, inf)", "max_share_below": "[0, 1]"}
    #: the loss weights: Table 8's were set for GPT-2 XL
    TUNABLE = {"alpha": (0.02, 0.2), "beta": (0.02, 0.2), "gamma": (0.01, 0.1)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        for key in ("alpha", "beta", "gamma", "margin"):
            value = getattr(self, key)
            if not np.isfinite(value) or value < 0:
                raise EditscopeError(f"{where}: key {key!r}: must be a finite number >= 0, got {value}")
        for key in ("k", "k_correct", "k_false"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise EditscopeError(f"{where}: key {key!r}: must be >= 0 or null (all), got {value}")
        for key in ("logprob", "filter_prob"):
            if getattr(self, key) not in LOGPROB_MODES:
                raise EditscopeError(f"{where}: key {key!r}: must be one of {', '.join(LOGPROB_MODES)}, "
                                     f"got {getattr(self, key)!r}")
        super().check(where, n_layers)  # the declared ranges (after the checks above, whose messages callers know)

    def limits(self) -> tuple[int | None, int | None]:
        """(k for O, k for O_h): ``k_correct``/``k_false`` where given, else ``k``."""
        return (self.k if self.k_correct is None else self.k_correct,
                self.k if self.k_false is None else self.k_false)


# -- answer lists and their log-probs -----------------------------------------------------------------------
def _distinct(answers: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """Answers in order without repeats and without ``exclude`` (compared without surrounding spaces)."""
    seen = {a.strip() for a in exclude}
    out = []
    for a in answers:
        if a.strip() not in seen:
            seen.add(a.strip())
            out.append(a)
    return out


def answer_lists(request) -> tuple[list[str], list[str]]:
    """(O, O_h) of a request, disjoint and without o* (the peak suite's rule, module docstring)."""
    correct = _distinct(request.correct_answers, [request.target_new])
    hard = _distinct(request.hard_false, [*correct, request.target_new])
    return correct, hard


def continuation_logprobs(engine: ScoringEngine, batch: TokenBatch, hidden: torch.Tensor,
                          mode: str = "sum") -> torch.Tensor:
    """Per-row log-prob [B] of each continuation of ``batch`` from its final hidden states (sum over tokens,
    or mean with ``mode="mean"``); the LM head runs only at the positions read."""
    rows, cols, owner = [], [], []
    for r, (start, n) in enumerate(zip(batch.context_lengths, batch.continuation_lengths, strict=True)):
        rows += [r] * n
        cols += list(range(start - 1, start + n - 1))
        owner += [r] * n
    rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
    lp = engine.logits_from_hidden(hidden[rows_t, cols_t]).float().log_softmax(-1)
    token_lp = lp.gather(1, batch.input_ids[rows_t, cols_t + 1][:, None])[:, 0]
    device = token_lp.device
    total = torch.zeros(len(batch.context_lengths), dtype=token_lp.dtype, device=device).index_add(
        0, torch.tensor(owner, device=device), token_lp)
    if mode == "mean":
        total = total / torch.tensor(batch.continuation_lengths, dtype=token_lp.dtype, device=device)
    return total


@dataclass
class AppState:
    """What ``setup`` records per edited request (``ctx.store["app"]``): the answers used, their batch and
    δ positions, pre-edit log-probs, and per step the unweighted L1, L2, L3."""

    correct: list[str]
    hard_false: list[str]
    batch: TokenBatch | None
    positions: list[int]
    pre: torch.Tensor
    dropped: dict[str, list[str]] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)


class AppTerm:
    """α·L1 + β·L2 + γ·L3 as one objective term (the module docstring); its ``setup`` needs the unedited model."""

    name = "app"
    #: its answers run in forwards of their own (shared context, per request), so APP edits one request at a time
    batched = False

    def __init__(self, hp: AppHParams) -> None:
        self.hp = hp

    def rows(self, engine, request) -> None:
        return None

    def setup(self, ctx: VContext) -> None:
        request = ctx.request
        correct, hard = answer_lists(request)
        if not correct and not hard:
            raise EditscopeError(
                f"plug-in app: the edit request {request.text!r} -> {request.target_new!r} has no other correct "
                "and no hard false answers to protect (PEAK records carry them; on the command line give "
                "--correct / --hard-false)")
        text = request.text
        positions = [] if ctx.hook_point is None else [subject_last_token_index(ctx.engine, request.prompt,
                                                                                 request.subject)]
        dropped: dict[str, list[str]] = {}
        with torch.no_grad():
            if self.hp.filter_answers and correct and hard:
                batch = ctx.engine.prepare([(text, a) for a in correct + hard])
                lp = continuation_logprobs(ctx.engine, batch, ctx.run(batch, positions * len(batch.context_lengths),
                                                                      None), self.hp.filter_prob)
                probs = np.exp(lp.double().cpu().numpy())
                keep_c, keep_h, _ = peak_answer_filter(probs[: len(correct)], probs[len(correct):],
                                                       max_share_below=self.hp.max_share_below)
                dropped = {"correct": [a for i, a in enumerate(correct) if i not in set(keep_c.tolist())],
                           "hard_false": [a for i, a in enumerate(hard) if i not in set(keep_h.tolist())]}
                correct, hard = [correct[i] for i in keep_c], [hard[i] for i in keep_h]
            k_c, k_f = self.hp.limits()
            correct = correct if k_c is None else correct[:k_c]
            hard = hard if k_f is None else hard[:k_f]
            answers = correct + hard
            batch, pre = None, torch.zeros(0)  # host: empty placeholder
            if answers:
                # P's log-probs from the forward that computes P' at every step, with δ = 0: L2 and L3 are then
                # exactly 0 at δ = 0, and their hinges do not switch on rounding noise (fast vs full forward).
                batch = ctx.engine.prepare([(text, a) for a in answers])
                zero = None if ctx.hook_point is None else torch.zeros(ctx.bundle.hidden_size, device=ctx.bundle.device)
                hidden = ctx.run(batch, positions * len(answers), zero, fixed=True)
                pre = continuation_logprobs(ctx.engine, batch, hidden, self.hp.logprob).detach()
        ctx.store[self.name] = AppState(correct, hard, batch, positions * len(answers), pre, dropped)

    def parts(self, state: AppState, post: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted L1, L2, L3 from the edited model's log-probs ``post`` (rows as ``state.pre``)."""
        n = len(state.correct)
        return {"L1": margin_loss(post[:n], post[n:], self.hp.margin),
                "L2": preservation_loss(state.pre[:n], post[:n]),
                "L3": prevention_loss(state.pre[n:], post[n:])}

    def __call__(self, step: VStep) -> torch.Tensor:
        state: AppState = step.ctx.store[self.name]
        if state.batch is None:
            return step.hidden.new_zeros(())
        hidden = step.ctx.run(state.batch, state.positions, step.delta, fixed=True)
        post = continuation_logprobs(step.ctx.engine, state.batch, hidden, self.hp.logprob)
        parts = self.parts(state, post)
        state.history.append({k: float(v.detach()) for k, v in parts.items()})
        return self.hp.alpha * parts["L1"] + self.hp.beta * parts["L2"] + self.hp.gamma * parts["L3"]


APP = register_plugin(PluginSpec(
    name="app",
    label="APP",
    hparams_class=AppHParams,
    make=AppTerm,
    doc="PEAK's APP (paper 003 eqs 7-10): hinge margin between correct and hard false answers, no drop of "
        "correct, no rise of hard false answers",
))

__all__ = ["APP", "AppHParams", "AppState", "AppTerm", "answer_lists", "continuation_logprobs", "margin_loss",
           "preservation_loss", "prevention_loss"]
