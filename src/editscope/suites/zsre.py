"""zsRE suite: Efficacy, Paraphrase, Specificity top-1 accuracy (paper 002, appendix C.1, eqs 21-23).

Protocol (DESIGN rule 10; both choices are options, recorded in every results row via :attr:`ZsreSuite.protocol`):

* ``target`` -- what is edited (:meth:`ZsreSuite.edit_requests`, the runner edits exactly that) and scored by
  Efficacy/Paraphrase:

  - ``"answers0"`` (default): MEND's ``answers[0]``, as the reference code of ROME and MEMIT
    (``dsets/zsre.py``, ``MENDQADataset``: ``target_new = record["answers"][0]``) and of AlphaEdit (its
    ``dsets/zsre.py`` is MEMIT's, unchanged) -- the protocol behind paper 002's zsRE table. Paper 002 does not
    name the field; its numbers come from that code, so it is the default. The edit then writes the answer the
    dataset calls correct, which the unedited model sometimes already predicts: ``Efficacy_pre`` is not ~0
    (GPT-J: 26.4 in paper 002's table);
  - ``"alt"``: MEND's alternative answer ``alt``, as EasyEdit's ``ZsreDataset`` (``target_new = record["alt"]``)
    -- a counterfactual edit; ``Case.request.target_new`` of the zsRE loader.

* ``loc_question_mark`` -- how the neighbourhood question is presented: ``True`` (default) scores the answer
  after ``loc + "?"``, as MEMIT's ``MENDQADataset`` builds its neighbourhood prompts
  (``record["loc"] + "?" + tok.decode(ans_toks[:i])``, answer tokens of ``" " + loc_ans``); ``False`` scores it
  after ``loc`` exactly as published, as EasyEdit's ``locality_prompt``. The published ``loc`` has no question
  mark (none of the 1,000 records of the shared MEND train sample ends in ``"?"``); a ``loc`` that already ends
  in ``"?"`` gets no second one.

Probe, following :mod:`editscope.suites.base`::

    {"prompts": [
        {"prompt": <edit prompt>, "role": "rewrite", "candidates": [<edit target, kind "new">]},
        {"prompt": <paraphrase>, "role": "paraphrase", "candidates": [<edit target, kind "new">]}, ...
        {"prompt": <neighbourhood question>, "role": "neighborhood",
         "candidates": [<its answer, kind "true">]}, ...]}

Each candidate is ``{"text", "kind", "logprob_sum", "n_tokens", "token_logprobs", "token_is_argmax"}``; one
``engine.score`` call per case (per batch of cases in :meth:`ZsreSuite.probe_many`).

Scoring is top-1 per target token under teacher forcing: token ``t_j`` counts as correct when it is the
argmax of the model's distribution given the prompt and ``t_<j`` (the engine's ``token_is_argmax``), as
ROME/MEMIT's ``compute_rewrite_quality_zsre`` does by appending the answer prefixes to the prompt. Per prompt,
the mean over its target tokens; per case, the mean over its prompts.

Metrics (declared in :data:`METRICS`; each as ``NAME_pre`` and ``NAME_post`` unless noted):

* ``Efficacy`` (eq 21): the edit target on the edit prompt;
* ``Paraphrase`` (eq 22): the edit target on the paraphrase prompts;
* ``Specificity`` (eq 23): the neighbourhood prompt's *dataset* answer (MEND's ``loc_ans``, the
  ``o_i^c`` of eq 23) on the neighbourhood prompts, scored against that ground truth -- as MEMIT's code does,
  not against the pre-edit prediction (that is EasyEdit's "locality", a different number). Because the
  unedited model rarely gets the NQ answers right, compare ``Specificity_post`` with ``Specificity_pre``;
  ``Specificity_delta`` (post-only) = post - pre is emitted for that;
* ``Score`` (aggregate, computed by the summary): harmonic mean of the *dataset-level* means of the three
  (paper 002, C.1), with a bootstrap CI over cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics import zsre_efficacy, zsre_paraphrase, zsre_specificity
from editscope.metrics.registry import MetricSpec, hmean_of
from editscope.suites._common import Plan, one, prompts_with_role, score_plans
from editscope.suites.base import Suite, check_choice

_P = "002 (ROME), appendix C.1"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("Efficacy", _P, "eq 21", True, paper_scale=100,
               description="top-1 token accuracy of target_new on the edit prompt"),
    MetricSpec("Paraphrase", _P, "eq 22", True, paper_scale=100,
               description="top-1 token accuracy of target_new on the paraphrases"),
    MetricSpec("Specificity", _P, "eq 23", True, paper_scale=100,
               description="top-1 token accuracy of the neighbourhood questions' dataset answers"),
    MetricSpec("Score", _P, "harmonic mean of eqs 21-23", True, paper_scale=100,
               aggregate=hmean_of(("Efficacy", "Paraphrase", "Specificity")),
               description="harmonic mean of the dataset-level means (bootstrap CI over cases)"),
    MetricSpec("Specificity_delta", _P, "eq 23, post - pre", True, (-1.0, 1.0), paper_scale=100,
               pairing="post_only", description="Specificity after minus before the edit", headline=False),
)


def _flags(prompts: list[dict[str, Any]], kind: str) -> list[list[bool]]:
    return [one(p, kind)["token_is_argmax"] for p in prompts]


def top1_metrics(probe: dict[str, Any]) -> dict[str, float]:
    """Efficacy / Paraphrase / Specificity of one probe (paper 002, eqs 21-23)."""
    rewrite = prompts_with_role(probe, "rewrite")
    para = prompts_with_role(probe, "paraphrase")
    neigh = prompts_with_role(probe, "neighborhood")
    if not rewrite:
        raise EditscopeError("zsre probe has no rewrite prompt")
    row = {"Efficacy": zsre_efficacy(_flags(rewrite, "new"))}
    if para:
        row["Paraphrase"] = zsre_paraphrase(_flags(para, "new"))
    if neigh:
        row["Specificity"] = zsre_specificity(_flags(neigh, "true"))
    return row


TARGETS = ("answers0", "alt")


def neighborhood_question(loc: str, question_mark: bool = True) -> str:
    """The neighbourhood prompt as scored: ``loc + "?"`` (MEMIT's ``MENDQADataset``; none when ``loc`` already
    ends in ``"?"``) or ``loc`` as published (``question_mark=False``, EasyEdit)."""
    return loc + "?" if question_mark and not loc.endswith("?") else loc


def answers0(case: Case, suite: str) -> str:
    """MEND's ``answers[0]`` of a zsRE case (what ROME/MEMIT/AlphaEdit's code edits); ``suite`` names the asker in
    the error when the case has no answers list."""
    answers = case.extra.get("answers") or []
    if not answers or not str(answers[0]).strip():
        raise EditscopeError(f"{suite} suite: case {case.case_id}: target answers0 needs extra['answers'] "
                             "(MEND's answers list; load the case with the zsRE loader)")
    return str(answers[0])


def answers0_request(case: Case, suite: str) -> EditRequest:
    """The case's edit with target_new = :func:`answers0` and no target_true."""
    req = case.request
    return EditRequest(req.prompt, req.subject, answers0(case, suite), None)


class ZsreSuite(Suite):
    """zsRE top-1 probability tests; options ``target`` and ``loc_question_mark`` (see the module docstring)."""

    name = "zsre"
    card_section = "logprobs"
    metrics_declared = METRICS

    def __init__(self, *, target: Literal["answers0", "alt"] = "answers0", loc_question_mark: bool = True) -> None:
        check_choice(self.name, "target", target, TARGETS)
        check_choice(self.name, "loc_question_mark", loc_question_mark, (True, False))
        self.target = target
        self.loc_question_mark = loc_question_mark

    @property
    def protocol(self) -> dict[str, str]:
        """``paper`` (MEMIT's code: target answers[0], neighbourhood ``loc + "?"``), ``easyedit`` (target alt,
        ``loc`` as published) or a named mix of the two options."""
        memit = (self.target == "answers0", self.loc_question_mark)
        name = {(True, True): "paper", (False, False): "easyedit"}.get(memit, "custom")
        target = ("answers[0] (ROME/MEMIT/AlphaEdit code)" if self.target == "answers0"
                  else "alt (EasyEdit)")
        loc = 'loc + "?" (MEMIT code)' if self.loc_question_mark else "loc as published (EasyEdit)"
        return {"name": name, "note": f"paper 002 eqs 21-23, teacher-forced top-1 token accuracy; edit target "
                                      f"{target}; neighbourhood question {loc}; Specificity against loc_ans"}

    def edit_target(self, case: Case) -> str:
        """The answer this suite edits and scores on the edit/paraphrase prompts (option ``target``)."""
        return case.request.target_new if self.target == "alt" else answers0(case, self.name)

    def edit_requests(self, case: Case) -> list[EditRequest]:
        """The edit of ``case``: its prompt and subject with target_new = :meth:`edit_target`. With
        ``target="answers0"`` no target_true is set (ROME/MEMIT give ``"<|endoftext|>"``, used by no editor)."""
        return [case.request] if self.target == "alt" else [answers0_request(case, self.name)]

    def plan(self, case: Case) -> Plan:
        """The scoring requests of one case."""
        plan = Plan()
        new = self.edit_target(case)
        plan.add_prompt(case.request.text, "rewrite", [(new, "new")])
        for p in case.paraphrase_prompts:
            plan.add_prompt(p, "paraphrase", [(new, "new")])
        for p, answer in case.neighborhood:
            plan.add_prompt(neighborhood_question(p, self.loc_question_mark), "neighborhood", [(answer, "true")])
        return plan

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Raw scores of many cases with one ``engine.score`` call."""
        return score_plans(engine, [self.plan(c) for c in cases])

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """The zsRE metric row (``*_pre``, ``*_post`` and ``Specificity_delta``)."""
        pre_row, post_row = top1_metrics(pre), top1_metrics(post)
        row = {f"{k}_pre": float(v) for k, v in pre_row.items()}
        row.update({f"{k}_post": float(v) for k, v in post_row.items()})
        if "Specificity" in post_row:
            row["Specificity_delta"] = float(post_row["Specificity"] - pre_row["Specificity"])
        return row
