"""CounterFact suite: ES/PS/NS/Score and magnitudes (paper 002, appendix C.2), optionally GE and RS.

Probe (``probe(engine, case)``), following :mod:`editscope.suites.base`::

    {"prompts": [
        {"prompt": <rewrite prompt, subject filled in>, "role": "rewrite",
         "candidates": [<target_new, kind "new">, <target_true, kind "true">]},
        {"prompt": <paraphrase>, "role": "paraphrase", "candidates": [<new>, <true>]}, ...
        {"prompt": <neighbourhood prompt>, "role": "neighborhood",
         "candidates": [<target_new, kind "new">, <the neighbourhood answer, kind "true">]}, ...],
     "generation": {...}}            # only with generation=True, see below

Each candidate is ``{"text", "kind", "logprob_sum", "n_tokens", "token_logprobs", "token_is_argmax"}``.
All requests of a case (of all cases, in :meth:`CounterFactSuite.probe_many`) go to one ``engine.score``.

Metrics (``metrics(case, pre, post)``; declared in :data:`METRICS`), each as ``NAME_pre`` (pre-edit probe)
and ``NAME_post`` (post-edit probe):

* ``ES`` (eq 24), ``PS`` (eq 25), ``NS`` (eq 26): per prompt, the mean per-token NLL of target_new vs the
  true answer, exactly as ROME/MEMIT's code (``nll_true > nll_new`` for ES/PS, ``<`` for NS), averaged over
  the prompts of the case;
* ``Score`` (aggregate, not in the rows): the summary's harmonic mean of the *dataset-level* means of ES, PS
  and NS (paper 002 appendix C; ROME/MEMIT's summaries), with a bootstrap CI over cases. The mean over cases
  of a per-case harmonic mean is a different, lower number (on one-paraphrase data: the share of cases where
  all three succeed) and is not emitted;
* ``EM``, ``PM``, ``NM``: the magnitudes, mean of ``P(new) - P(true)`` (NM: ``P(true) - P(new)``) with
  ``P = exp(-mean NLL)``;
* ``EasyEdit_rewrite_acc``, ``EasyEdit_rephrase_acc``: EasyEdit's teacher-forced token accuracy of
  target_new on the rewrite / paraphrase prompts -- a *different* number from ES/PS, named apart;
* with ``generation=True``: ``GE`` (eq 27, bits, ``convention`` option; "paper" by default) and ``RS``
  (TF-IDF cosine). ``RS_*`` is absent when no reference text was found.

The "true" answer of a neighbourhood prompt is the answer stored with it (``case.neighborhood``): on
CounterFact that is ``target_true`` (ROME's definition); on zsRE it is the Natural Questions answer of the
``loc`` question, so NS there asks "is the neighbourhood's own answer still more likely than target_new".
zsRE cases have a ``target_true`` (MEND's ``answers[0]``), so ES/PS work on them unchanged.

Generation (option ``generation=True``): the EasyEdit CounterFact split has no generation prompts, so the
suite generates from ``case.generation_prompts`` when present (ROME format) and otherwise from the rewrite
prompt and the paraphrase prompts. Sampling as ROME: top-k = 5, ``max_new_tokens`` = 100, seeded (one
``generate`` call per case, so ``probe`` and ``probe_many`` give the same texts). The generation block is
``{"prompts": [str], "texts": [str], "reference": str, "n_reference_passages": int, "corpus": sha256}``.

RS reference text -- a substitute for ROME's Wikipedia snippets about the object, which are not available
here: the first ``n_reference_passages`` (default 5) passages (wikitext paragraphs) of the reference corpus
(wikitext-2 test+valid by default) that contain ``target_new`` at word boundaries, joined. The TF-IDF
vectorizer is fitted on all passages of the same corpus and cached on disk as JSON
(``home()/tfidf/<corpus sha256>.json``, via :func:`~editscope.metrics.tfidf_state`); it is held on the suite
object once loaded.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from editscope.data.corpus import Corpus
from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics import (
    easyedit_token_accuracy,
    efficacy_magnitude,
    efficacy_success,
    fit_tfidf,
    generation_entropy,
    neighborhood_magnitude,
    neighborhood_success,
    paraphrase_magnitude,
    paraphrase_success,
    reference_score,
    tfidf_from_state,
    tfidf_state,
)
from editscope.metrics.registry import MetricSpec, hmean_of
from editscope.paths import home
from editscope.suites._common import (
    Plan,
    nll,
    one,
    prompts_with_role,
    read_json,
    score_plans,
    write_json_atomic,
)
from editscope.suites.base import Suite

_P = "002 (ROME), appendix C.2"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("ES", _P, "eq 24", True, paper_scale=100, description="Efficacy Success: P(new) > P(true) on the "
               "rewrite prompt (mean per-token NLL, ROME's code)"),
    MetricSpec("PS", _P, "eq 25", True, paper_scale=100, description="Paraphrase Success, the same on paraphrases"),
    MetricSpec("NS", _P, "eq 26", True, paper_scale=100, description="Neighborhood Success: P(true) > P(new) on "
               "neighbourhood prompts"),
    MetricSpec("Score", _P, "harmonic mean of ES, PS, NS", True, paper_scale=100,
               aggregate=hmean_of(("ES", "PS", "NS")),
               description="harmonic mean of the dataset-level means of ES, PS, NS (bootstrap CI over cases)"),
    MetricSpec("EM", _P, "magnitude of eq 24", True, (-1.0, 1.0), "prob-diff", 100,
               description="Efficacy Magnitude: mean P(new) - P(true), P = exp(-mean NLL)", headline=False),
    MetricSpec("PM", _P, "magnitude of eq 25", True, (-1.0, 1.0), "prob-diff", 100,
               description="Paraphrase Magnitude", headline=False),
    MetricSpec("NM", _P, "magnitude of eq 26", True, (-1.0, 1.0), "prob-diff", 100,
               description="Neighborhood Magnitude: mean P(true) - P(new)", headline=False),
    MetricSpec("EasyEdit_rewrite_acc", "EasyEdit (token accuracy)", "teacher-forced top-1 share", True,
               description="EasyEdit's rewrite accuracy of target_new; not ES", headline=False),
    MetricSpec("EasyEdit_rephrase_acc", "EasyEdit (token accuracy)", "teacher-forced top-1 share", True,
               description="EasyEdit's rephrase accuracy of target_new; not PS", headline=False),
)
GENERATION_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("GE", _P, "eq 27", True, (0.0, math.inf), "bits", 100,
               description="Generation Entropy (fluency), weighted 2-/3-gram entropy"),
    MetricSpec("RS", _P, "C.2 (Reference Score)", True, (0.0, 1.0), "cosine", 100,
               description="TF-IDF cosine of the generated texts to reference passages about target_new"),
)


def _targets(case: Case) -> tuple[str, str]:
    req = case.request
    if not req.target_true:
        raise EditscopeError(f"case {case.case_id}: the counterfact suite needs target_true (none in this case)")
    return req.target_new, req.target_true


def rewrite_plan(case: Case, *, neighborhood_kind: str = "true") -> Plan:
    """Rewrite + paraphrase prompts with target_new ("new") and target_true ("true"); neighbourhood prompts
    with target_new ("new") and their own answer (``neighborhood_kind``)."""
    new, true = _targets(case)
    plan = Plan()
    plan.add_prompt(case.request.text, "rewrite", [(new, "new"), (true, "true")])
    for p in case.paraphrase_prompts:
        plan.add_prompt(p, "paraphrase", [(new, "new"), (true, "true")])
    for p, answer in case.neighborhood:
        plan.add_prompt(p, "neighborhood", [(new, "new"), (answer, neighborhood_kind)])
    return plan


def _nll_pairs(prompts: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    new = np.array([nll(one(p, "new")) for p in prompts])
    true = np.array([nll(one(p, "true")) for p in prompts])
    return new, true


def rewrite_metrics(probe: dict[str, Any]) -> dict[str, float]:
    """ES/PS/NS, EM/PM/NM and EasyEdit's accuracies of one probe (paper 002, eqs 24-26)."""
    row: dict[str, float] = {}
    rewrite = prompts_with_role(probe, "rewrite")
    para = prompts_with_role(probe, "paraphrase")
    neigh = prompts_with_role(probe, "neighborhood")
    if not rewrite:
        raise EditscopeError("counterfact probe has no rewrite prompt")
    new, true = _nll_pairs(rewrite)
    row["ES"] = efficacy_success(new, true)
    row["EM"] = efficacy_magnitude(new, true)
    row["EasyEdit_rewrite_acc"] = easyedit_token_accuracy([one(p, "new")["token_is_argmax"] for p in rewrite])
    if para:
        new, true = _nll_pairs(para)
        row["PS"] = paraphrase_success(new, true)
        row["PM"] = paraphrase_magnitude(new, true)
        row["EasyEdit_rephrase_acc"] = easyedit_token_accuracy([one(p, "new")["token_is_argmax"] for p in para])
    if neigh:
        new, true = _nll_pairs(neigh)
        row["NS"] = neighborhood_success(new, true)
        row["NM"] = neighborhood_magnitude(new, true)
    return row


class CounterFactSuite(Suite):
    """CounterFact probability tests (+ optional generation tests); see the module docstring."""

    name = "counterfact"
    card_section = "logprobs"

    def __init__(self, *, generation: bool = False, max_new_tokens: int = 100, top_k: int | None = 5,
                 seed: int = 0, corpus: Sequence[str | os.PathLike[str]] | None = None,
                 n_reference_passages: int = 5, ge_convention: Literal["paper", "rome"] = "paper") -> None:
        self.generation = generation
        self.max_new_tokens = max_new_tokens
        self.top_k = top_k
        self.seed = seed
        self.n_reference_passages = n_reference_passages
        self.ge_convention = ge_convention
        self.corpus = Corpus(corpus)
        self._vectorizer: Any = None
        self._references: dict[str, list[str]] = {}

    @property
    def metrics_declared(self) -> tuple[MetricSpec, ...]:
        return METRICS + (GENERATION_METRICS if self.generation else ())

    @property
    def protocol(self) -> dict[str, str]:
        """``paper``: ES/PS/NS as paper 002 defines them and ROME/MEMIT's code computes them; the EasyEdit
        columns follow EasyEdit's token-accuracy protocol, named apart."""
        note = ("ES/PS/NS, EM/PM/NM: paper 002 eqs 24-26 as ROME/MEMIT's code computes them (mean per-token NLL "
                "per prompt); Score: harmonic mean of the dataset-level means; EasyEdit_rewrite_acc, "
                "EasyEdit_rephrase_acc: EasyEdit's teacher-forced token accuracy (a different number from ES/PS)")
        if self.generation:
            note += f"; GE: {self.ge_convention} convention, RS: TF-IDF cosine to wikitext passages (not ROME's)"
        return {"name": "paper", "note": note}

    # -- probing ------------------------------------------------------------------------------------
    def plan(self, case: Case) -> Plan:
        """The scoring requests of one case."""
        return rewrite_plan(case)

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Raw scores of many cases with one ``engine.score`` call (plus one ``generate`` per case)."""
        probes = score_plans(engine, [self.plan(c) for c in cases])
        if self.generation:
            for case, probe in zip(cases, probes, strict=True):
                probe["generation"] = self._generate(engine, case)
        return probes

    def generation_prompts(self, case: Case) -> list[str]:
        """The prompts generated from: the case's generation prompts, else rewrite + paraphrase prompts."""
        return list(case.generation_prompts) or [case.request.text, *case.paraphrase_prompts]

    def _generate(self, engine: Scorer, case: Case) -> dict[str, Any]:
        prompts = self.generation_prompts(case)
        texts = engine.generate(prompts, max_new_tokens=self.max_new_tokens, top_k=self.top_k, seed=self.seed)
        passages = self.reference_passages(case.request.target_new)
        return {
            "prompts": prompts,
            "texts": texts,
            "reference": " ".join(passages),
            "n_reference_passages": len(passages),
            "corpus": self.corpus.sha256,
        }

    def reference_passages(self, target: str) -> list[str]:
        """RS reference passages about ``target``: the first ``n_reference_passages`` corpus passages that
        mention it (memoised on the suite)."""
        if target not in self._references:
            self._references[target] = self.corpus.passages_with(target, limit=self.n_reference_passages)
        return self._references[target]

    def vectorizer(self) -> Any:
        """The TF-IDF vectorizer fitted on the corpus passages, from the JSON disk cache when present."""
        if self._vectorizer is None:
            path = home() / "tfidf" / f"{self.corpus.sha256}.json"
            state = read_json(path)
            vec = None
            if state is not None:
                try:
                    vec = tfidf_from_state(state)
                except ValueError:
                    vec = None
            if vec is None:
                vec = fit_tfidf(self.corpus.passages)
                write_json_atomic(path, tfidf_state(vec))
            self._vectorizer = vec
        return self._vectorizer

    # -- metrics ------------------------------------------------------------------------------------
    def _generation_metrics(self, probe: dict[str, Any]) -> dict[str, float]:
        gen = probe.get("generation")
        if not gen:
            return {}
        row = {"GE": generation_entropy(gen["texts"], convention=self.ge_convention)}
        if gen["reference"].strip():
            row["RS"] = reference_score(gen["texts"], gen["reference"], self.vectorizer())
        return row

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """The CounterFact metric row: ``*_pre`` from the pre-edit probe, ``*_post`` from the post-edit one."""
        row: dict[str, float] = {}
        for tag, probe in (("pre", pre), ("post", post)):
            values = {**rewrite_metrics(probe), **self._generation_metrics(probe)}
            row.update({f"{k}_{tag}": float(v) for k, v in values.items()})
        return row
