"""PEAK suite: appending ES/GS/LS and additivity RFF/RNF/CPC/FPC/AFF/ANF (paper 003, sections 3.2, 4, 5.1).

The edit of a case is its request: append ``o* = target_new`` to the answers ``O`` of ``t_r(s)`` (the
case's ``valid_answers``, PEAK's positive list).

What is edited (option ``targets``; :meth:`PeakSuite.edit_requests`, recorded in every row's protocol):

* ``"new"`` (default, paper 003 Tables 3-4): the case's request, ``o*`` alone;
* ``"all_correct"`` (Table 5, "fairer baselines": "all baseline methods have been extended to utilize the entire
  set O when editing"): one request per correct answer of ``O ∪ {o*}`` -- each answer of the published positive
  list O (deduplicated, ``o*`` removed; the pre-edit filter needs probabilities and cannot choose what is edited,
  so it is the unfiltered list) in list order, then ``o*`` last. Single-edit methods (ROME, ...) apply them one
  after another, batch methods (MEMIT, ...) as one batch. ``o*`` comes last because successive rank-one edits of
  one subject key overwrite each other's value, so the last target written keeps the most of its edit, and
  appending ``o*`` is the point of the case. Everything scored stays as with ``"new"`` (ES/GS/LS of ``o*``,
  additivity of O).

Probe, following :mod:`editscope.suites.base`::

    {"prompts": [
        {"prompt": <edit prompt>, "role": "rewrite", "candidates": [
            <each o in O, kind "correct">, <each hard false answer, kind "hard_false">,
            <each random false answer, kind "random_false">, <o*, kind "new">]},
        {"prompt": <paraphrase>, "role": "paraphrase", "candidates": [... the same ...]}, ...
        {"prompt": <locality prompt>, "role": "neighborhood",
         "candidates": [<its original answer o_l, kind "correct">, <o*, kind "new">]}, ...]}

Candidates are ``{"text", "kind", "logprob_sum", "n_tokens", "token_logprobs", "token_is_argmax"}``; one
``engine.score`` call per case (per batch of cases in :meth:`PeakSuite.probe_many`).

Answer lists. The paper states that O and the false lists are disjoint, but 35 PEAK-CF records share 51
answers between the positive and the hard negative list, and 7 have ``o*`` itself in O or in the hard list.
The suite drops from the false lists every answer that is also correct (in O) or is ``o*``, and drops ``o*``
from O; repeats are dropped too (exact string match, order kept).

Probabilities. ``P(o | p) = exp(mean per-token log-prob)`` (option ``prob="mean"``, default), as PEAK's
reference code computes it (``exp(-mean NLL)``); ``prob="sum"`` gives the sequence probability
``exp(sum)``. The paper only writes ``P_F(o | t_r(s))``; the choice matters for multi-token answers (with
``sum`` long answers are penalised by their length, and most RFF/RNF comparisons become length comparisons).

Pre-edit answer filtering (paper 003, section 5.1; :func:`~editscope.metrics.peak_answer_filter`, thresholds
from PEAK's ``select_pos_neg``): per prompt, on the *pre-edit* probabilities, a correct answer is dropped when
it is less probable than at least 20% of the hard false answers; then every false answer (hard and random)
that is at least as probable as the least probable kept correct answer is dropped. The kept indices apply to
both probes of the case. A prompt whose correct list or false list (of a setting) becomes empty is skipped
for that setting. ``filter_answers=False`` turns the filter off.

Protocol (option ``protocol``; DESIGN rule 10; recorded in every results row via :attr:`PeakSuite.protocol`):

* ``"paper"`` (default): the definitions of paper 003 section 3.2 read literally. LS averages over *all*
  locality prompts; a rewrite/paraphrase prompt is skipped only for the setting whose filtered false list is
  empty (and for ES/GS only when no correct answer is kept);
* ``"reference"``: as PEAK's ``experiments/summarize.py`` computes them. (a) LS averages only over the
  locality prompts the *unedited* model gets right, ``P(o_l | p_l) > P(o* | p_l)`` on the pre-edit probe
  (``local_id``; LS is absent when none is); so ``LS_pre`` is 1 by construction. (b) A rewrite/paraphrase
  prompt is skipped for *both* settings and for ES/GS when the kept correct list or *either* filtered false
  list is empty (``select_pos_neg`` and the ``len(temp_neg)==0 or len(temp_neg_random)==0`` checks).
  Not reproduced: after its per-prompt loop, ``summarize.py`` re-tests the lists of the *last* prompt only and
  drops the whole case's additivity when that prompt was skipped (a loop-variable slip); here the case keeps
  the mean over its surviving prompts.

Metrics (declared in :data:`METRICS`; ``NAME_pre``/``NAME_post`` for the appending metrics, plain ``NAME``
for the post-only additivity metrics):

* ``ES`` (appending efficacy): ``P*(o*) > min_O P*(o)`` on the edit prompt; ``GS``: the same averaged over
  the paraphrase prompts; ``LS``: ``P*(o_l | p_l) > P*(o* | p_l)`` averaged over the locality prompts;
  each as ``*_pre`` (unedited model) and ``*_post``. O here is the *filtered* list of each prompt
  (the answers the unedited model knows; section 5.1 filters the dataset's answers before any metric), so
  an edit must lift o* above the least probable known answer; a prompt with no kept answer is skipped (ES
  absent when that is the edit prompt). With the full published O, whose least probable answer is often
  tiny, ES_pre was 0.8 on 5 PEAK-CF cases with SmolLM2; those values are kept as ``ES_unfiltered_pre``,
  ``ES_unfiltered_post``, ``GS_unfiltered_pre``, ``GS_unfiltered_post``.
* for ``S`` in ``hard``, ``random``: ``RFF_S``, ``RNF_S``, ``CPC_S``, ``FPC_S``, ``AFF_S``, ``ANF_S``
  (eqs 1-6) per prompt of ``{p} U P^G`` (after filtering), averaged over the prompts (as PEAK reports them);
  ``n_prompts_S`` is the number of prompts that survived the filter. When none survived, the six keys of
  that setting are absent from the row (``n_prompts_S`` = 0), so aggregates never average an undefined value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics import (
    additivity,
    appending_efficacy,
    appending_generalization,
    appending_locality,
    peak_answer_filter,
)
from editscope.metrics.registry import MetricSpec
from editscope.suites._common import Plan, by_kind, dedupe, one, prompts_with_role, score_plans
from editscope.suites.base import Suite, SuiteFigure, check_choice

ADDITIVITY_KEYS = ("RFF", "RNF", "CPC", "FPC", "AFF", "ANF")
SETTINGS = ("hard", "random")
PROTOCOLS = ("paper", "reference")
TARGETS = ("new", "all_correct")
_P = "003 (PEAK)"
_INF = (0.0, math.inf)


def _additivity_specs(setting: str) -> tuple[MetricSpec, ...]:
    def spec(key: str, eq: str, better: bool, rng: tuple[float, float] = (0.0, 1.0), unit: str = "share",
             scale: float = 100, what: str = "") -> MetricSpec:
        return MetricSpec(f"{key}_{setting}", _P, eq, better, rng, unit, scale, "post_only",
                          f"{what} ({setting} false answers)", headline=key in ("AFF", "ANF"))  # Tables 3-4
    return (
        spec("RFF", "eq 1", False, what="Ranking Forgetting Factor"),
        spec("RNF", "eq 2", False, what="Ranking Noising Factor"),
        spec("CPC", "eq 3", True, _INF, "ratio", 1, "Correct Probability Change (post / pre)"),
        spec("FPC", "eq 4", False, _INF, "ratio", 1, "False Probability Change (post / pre)"),
        spec("AFF", "eq 5", False, what="Additive Forgetting Factor"),
        spec("ANF", "eq 6", False, what="Additive Noising Factor"),
        MetricSpec(f"n_prompts_{setting}", _P, "section 5.1 filter", None, _INF, "count", 1, "post_only",
                   f"prompts left by the pre-edit answer filter ({setting} setting)"),
    )


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("ES", _P, "section 3.2 (appending efficacy)", True, paper_scale=100,
               description="P(o*) above the least probable kept correct answer on the edit prompt"),
    MetricSpec("GS", _P, "section 3.2 (appending generalization)", True, paper_scale=100,
               description="the same on the paraphrase prompts"),
    MetricSpec("LS", _P, "section 3.2 (locality)", True, paper_scale=100,
               description="P(o_l) > P(o*) on the locality prompts"),
    MetricSpec("ES_unfiltered", _P, "section 3.2, unfiltered O", True, paper_scale=100,
               description="ES against the full published answer list", headline=False),
    MetricSpec("GS_unfiltered", _P, "section 3.2, unfiltered O", True, paper_scale=100,
               description="GS against the full published answer list", headline=False),
) + tuple(spec for setting in SETTINGS for spec in _additivity_specs(setting))


def answer_lists(case: Case) -> tuple[list[str], list[str], list[str]]:
    """(correct O, hard false, random false) made disjoint as the module docstring says."""
    new = case.request.target_new
    correct = dedupe(case.valid_answers, exclude=[new])
    hard = dedupe(case.hard_false, exclude=[*correct, new])
    random = dedupe(case.random_false, exclude=[*correct, new])
    if not correct:
        raise EditscopeError(f"case {case.case_id}: the peak suite needs valid answers (PEAK's positive list)")
    if not hard or not random:
        raise EditscopeError(f"case {case.case_id}: the peak suite needs hard and random false answers")
    return correct, hard, random


def _both_settings(keep: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PEAK's reference rule: a prompt whose kept correct list or either kept false list is empty is dropped
    entirely (every index list empty), for both settings and for ES/GS."""
    if all(k.size for k in keep):
        return keep
    empty = np.array([], dtype=np.int64)
    return empty, empty, empty


class PeakSuite(Suite):
    """PEAK appending + additivity; see the module docstring."""

    name = "peak"
    card_section = "peak-answers"
    metrics_declared = METRICS

    def __init__(self, *, prob: Literal["mean", "sum"] = "mean", filter_answers: bool = True,
                 max_share_below: float = 0.2, protocol: Literal["paper", "reference"] = "paper",
                 targets: Literal["new", "all_correct"] = "new") -> None:
        check_choice(self.name, "prob", prob, ("mean", "sum"))
        check_choice(self.name, "protocol", protocol, PROTOCOLS)
        check_choice(self.name, "targets", targets, TARGETS)
        check_choice(self.name, "filter_answers", filter_answers, (True, False))
        self.prob = prob
        self.filter_answers = filter_answers
        self.max_share_below = max_share_below
        self.peak_protocol = protocol
        self.targets = targets

    @property
    def protocol(self) -> dict[str, str]:
        """``paper`` or ``reference`` (PEAK's summarize.py), with the choices that move the numbers."""
        p = "exp(mean token log-prob)" if self.prob == "mean" else "exp(sum of token log-probs)"
        filt = (f"pre-edit answer filter ({self.max_share_below:g} share rule of select_pos_neg)"
                if self.filter_answers else "no answer filter")
        if self.peak_protocol == "reference":
            rule = ("PEAK reference code (summarize.py): LS only over locality prompts the unedited model gets right; "
                    "a prompt is skipped for both settings and ES/GS when either filtered false list is empty")
        else:
            rule = ("paper 003 section 3.2: LS over all locality prompts; a prompt is skipped per setting when its "
                    "filtered false list is empty")
        edits = ("edit targets: every correct answer, O then o* (paper 003 Table 5, fairer baselines)"
                 if self.targets == "all_correct" else "edit target: o* alone")
        return {"name": self.peak_protocol, "note": f"{rule}; P = {p}; {filt}; {edits}"}

    def edit_requests(self, case: Case) -> list[EditRequest]:
        """What the runner edits for ``case`` (option ``targets``, module docstring): ``o*`` alone, or one request
        per answer of ``O ∪ {o*}`` with ``o*`` last (paper 003 Table 5)."""
        req = case.request
        if self.targets == "new":
            return [req]
        correct = answer_lists(case)[0]
        return [EditRequest(req.prompt, req.subject, answer, req.target_true, req.correct_answers, req.hard_false)
                for answer in [*correct, req.target_new]]

    def plan(self, case: Case) -> Plan:
        """The scoring requests of one case."""
        correct, hard, random = answer_lists(case)
        new = case.request.target_new
        cands = ([(a, "correct") for a in correct] + [(a, "hard_false") for a in hard]
                 + [(a, "random_false") for a in random] + [(new, "new")])
        plan = Plan()
        plan.add_prompt(case.request.text, "rewrite", cands)
        for p in case.paraphrase_prompts:
            plan.add_prompt(p, "paraphrase", cands)
        for p, answer in case.neighborhood:
            plan.add_prompt(p, "neighborhood", [(answer, "correct"), (new, "new")])
        return plan

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Raw scores of many cases with one ``engine.score`` call."""
        return score_plans(engine, [self.plan(c) for c in cases])

    # -- metrics ------------------------------------------------------------------------------------
    def probs(self, candidates: list[dict[str, Any]]) -> np.ndarray:
        """P of each candidate: ``exp(mean token log-prob)`` or ``exp(sum)`` (option ``prob``)."""
        lp = np.array([float(c["logprob_sum"]) for c in candidates])
        if self.prob == "mean":
            lp = lp / np.array([int(c["n_tokens"]) for c in candidates])
        return np.exp(lp)

    def _kind_probs(self, prompt: dict[str, Any], kind: str) -> np.ndarray:
        return self.probs(by_kind(prompt, kind))

    def _keep(self, pre_prompt: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Indices of the kept correct / hard / random answers of one prompt (pre-edit filter, or all)."""
        pc, ph, pr = (self._kind_probs(pre_prompt, k) for k in ("correct", "hard_false", "random_false"))
        if not self.filter_answers:
            return np.arange(len(pc)), np.arange(len(ph)), np.arange(len(pr))
        return peak_answer_filter(pc, ph, pr, max_share_below=self.max_share_below)

    def _appending(self, probe: dict[str, Any], keeps: list[np.ndarray] | None,
                   local: list[int] | None = None) -> dict[str, float]:
        """ES/GS over the rewrite/paraphrase prompts (O restricted to ``keeps[i]`` per prompt when given;
        prompts with nothing kept are skipped) and LS over the locality prompts (those in ``local`` when given)."""
        row: dict[str, float] = {}
        prompts = [p for p in probe["prompts"] if p["role"] in ("rewrite", "paraphrase")]
        new: dict[str, list[float]] = {"rewrite": [], "paraphrase": []}
        cor: dict[str, list[np.ndarray]] = {"rewrite": [], "paraphrase": []}
        for i, p in enumerate(prompts):
            pc = self._kind_probs(p, "correct")
            if keeps is not None:
                if keeps[i].size == 0:
                    continue
                pc = pc[keeps[i]]
            new[p["role"]].append(float(self._kind_probs(p, "new")[0]))
            cor[p["role"]].append(pc)
        if new["rewrite"]:
            row["ES"] = appending_efficacy(new["rewrite"], cor["rewrite"])
        if new["paraphrase"]:
            row["GS"] = appending_generalization(new["paraphrase"], cor["paraphrase"])
        neigh = prompts_with_role(probe, "neighborhood")
        if local is not None:
            neigh = [neigh[i] for i in local]
        if neigh:
            row["LS"] = appending_locality([self.probs([one(p, "correct")])[0] for p in neigh],
                                           [self.probs([one(p, "new")])[0] for p in neigh])
        return row

    def _additivity(self, pre: dict[str, Any], post: dict[str, Any],
                    keeps: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, float]:
        roles = ("rewrite", "paraphrase")
        pre_prompts = [p for p in pre["prompts"] if p["role"] in roles]
        post_prompts = [p for p in post["prompts"] if p["role"] in roles]
        per: dict[str, list[dict[str, float]]] = {"hard": [], "random": []}
        for a, b, (kc, kh, kr) in zip(pre_prompts, post_prompts, keeps, strict=True):
            pc, ph, pr = (self._kind_probs(a, k) for k in ("correct", "hard_false", "random_false"))
            qc, qh, qr = (self._kind_probs(b, k) for k in ("correct", "hard_false", "random_false"))
            if kc.size == 0:
                continue
            for setting, pf, qf, kf in (("hard", ph, qh, kh), ("random", pr, qr, kr)):
                if kf.size:
                    per[setting].append(additivity(pc[kc], qc[kc], pf[kf], qf[kf]))
        row: dict[str, float] = {}
        for setting, values in per.items():
            row[f"n_prompts_{setting}"] = float(len(values))
            if values:
                for key in ADDITIVITY_KEYS:
                    row[f"{key}_{setting}"] = float(np.mean([v[key] for v in values]))
        return row

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """The PEAK metric row: appending ES/GS/LS (``*_pre``/``*_post``) and additivity per false-answer setting."""
        roles = ("rewrite", "paraphrase")
        pre_prompts = [p for p in pre["prompts"] if p["role"] in roles]
        if [p["prompt"] for p in pre_prompts] != [p["prompt"] for p in post["prompts"] if p["role"] in roles]:
            raise EditscopeError("peak: pre and post probes hold different prompts")
        keeps = [self._keep(p) for p in pre_prompts]
        local = None
        if self.peak_protocol == "reference":
            keeps = [_both_settings(k) for k in keeps]
            local = self.locality_kept(pre)
        kept_correct = [k[0] for k in keeps]
        row: dict[str, float] = {}
        for tag, probe in (("pre", pre), ("post", post)):
            row.update({f"{k}_{tag}": v for k, v in self._appending(probe, kept_correct, local).items()})
            unfiltered = self._appending(probe, None)
            for key in ("ES", "GS"):
                if key in unfiltered:
                    row[f"{key}_unfiltered_{tag}"] = unfiltered[key]
        row.update(self._additivity(pre, post, keeps))
        return {k: float(v) for k, v in row.items()}

    def locality_kept(self, pre: dict[str, Any]) -> list[int]:
        """Indices of the locality prompts the unedited model gets right, ``P(o_l) > P(o*)`` on the pre-edit
        probe (PEAK's summarize.py, ``local_id``; ``protocol="reference"``)."""
        neigh = prompts_with_role(pre, "neighborhood")
        return [i for i, p in enumerate(neigh)
                if self.probs([one(p, "correct")])[0] > self.probs([one(p, "new")])[0]]

    # -- report -------------------------------------------------------------------------------------
    def figures(self, dataset: str, rows: Sequence[dict[str, Any]], methods: Sequence[str], *,
                seed: int = 0) -> list[SuiteFigure]:
        """The probability shift of correct vs false answers on the edit prompt (paper 003, Fig. 2)."""
        from editscope.suites._figures import peak_shift

        pairs = {m: [(r["pre"][self.name], r["post"][self.name]) for r in rows if r["method"] == m]
                 for m in methods}
        pairs = {m: sel for m, sel in pairs.items() if sel}
        if not pairs:
            return []
        return [SuiteFigure(
            f"peak-shift-{dataset}", f"Probability shift of correct vs false answers ({dataset})",
            "Mean probability P = exp(mean token log-prob) of the correct answers O, hard and random false answers "
            "and the appended answer o* on the edit prompt, before (light) and after (dark) the edit; per case the "
            "mean over its answers of a kind, error bars are 95% CIs over cases; cf. paper 003, Fig. 2.",
            peak_shift(pairs, prob=self.prob))]
