"""Portability suite: KnowEdit's portability and locality questions scored as EasyEdit scores them.

Protocol ``easyedit token accuracy`` (DESIGN rule 10: a different number from CounterFact's ES/PS/NS and from
zsRE's paper protocol; KnowEdit, Zhang et al. 2024, §4 and the KnowEdit dataset card; EasyEdit's
``easyeditor/evaluate/evaluate_utils.py`` ``test_prediction_acc`` and ``compute_locality_quality``):

* a question and its answer are fed teacher-forced as ``prompt + " " + answer`` (the scoring engine adds the
  boundary space); at every answer position the model's argmax is read;
* **token accuracy** of a question = the share of answer positions whose argmax is the answer's token; per
  type (``Reasoning`` = multi-hop, ``Subject_Aliasing`` = alias, ``Logical_Generalization`` = logical) the mean
  over that type's questions of the case; ``Portability`` = the mean over the case's types ("the average of all
  sub-scores under the portability category", KnowEdit card). The scored answer is the first string of the
  published ``ground_truth`` (EasyEdit's ``ground_truth[0][0]``); EasyEdit's example script keeps only the first
  question of each type, editscope scores every listed question;
* **locality** of a question = the share of answer positions whose argmax token after the edit equals the argmax
  token before it (the card's example: [29, 234, 334] before, [29, 234, 333] after -> 2/3); not accuracy against
  the ground truth. Per type and ``Locality`` as above; post-only (it compares the two models itself);
* ``Edit_Succ`` and ``Rephrase``: the same token accuracy of ``target_new`` on the edit prompt and on
  ``rephrase_prompt`` (KnowEdit's "Edit Succ."; EasyEdit's ``rewrite_acc`` / ``rephrase_acc``).

Probe (conventions of :mod:`editscope.suites.base`)::

    {"prompts": [{"prompt", "role": "rewrite" | "paraphrase" | "portability" | "locality", "type": <KnowEdit type
                  or "">, "candidates": [<answer, kind "new" (rewrite, paraphrase) or "answer">]}, ...]}

Locality candidates also hold ``"token_argmax"``: the argmax token id at each answer position.
Cases come from the KnowEdit loader (:mod:`editscope.data.knowedit`: ``extra["portability"]``,
``extra["locality"]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from editscope.data.knowedit import LOCALITY_TYPES, PORTABILITY_TYPES
from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics import easyedit_locality, easyedit_token_accuracy
from editscope.metrics.registry import MetricSpec
from editscope.suites._common import Plan, candidate, mean, one, prompts_with_role
from editscope.suites.base import Suite

PROTOCOL = "easyedit token accuracy"
_P = "KnowEdit (Zhang et al. 2024) / EasyEdit"
_ACC = "teacher-forced top-1 share of answer tokens"
_LOC = "share of answer positions whose argmax token is unchanged"


def _metrics() -> tuple[MetricSpec, ...]:
    specs = [
        MetricSpec("Edit_Succ", _P, _ACC, True, paper_scale=100,
                   description="token accuracy of target_new on the edit prompt (EasyEdit rewrite_acc)"),
        MetricSpec("Rephrase", _P, _ACC, True, paper_scale=100,
                   description="token accuracy of target_new on rephrase_prompt (EasyEdit rephrase_acc)"),
        MetricSpec("Portability", _P, "mean of the case's portability types", True, paper_scale=100,
                   description="mean token accuracy over the case's portability types"),
        MetricSpec("Locality", _P, "mean of the case's locality types", True, paper_scale=100, pairing="post_only",
                   description="mean unchanged-argmax share over the case's locality types"),
    ]
    specs += [MetricSpec(f"Portability_{name}", _P, _ACC, True, paper_scale=100, headline=False,
                         description=f"token accuracy: {what}") for name, what in PORTABILITY_TYPES.items()]
    specs += [MetricSpec(f"Locality_{name}", _P, _LOC, True, paper_scale=100, pairing="post_only", headline=False,
                         description=f"unchanged argmax tokens: {what}") for name, what in LOCALITY_TYPES.items()]
    return tuple(specs)


METRICS: tuple[MetricSpec, ...] = _metrics()


def _accuracy(prompts: list[dict[str, Any]], kind: str) -> float:
    return easyedit_token_accuracy([one(p, kind)["token_is_argmax"] for p in prompts])


def accuracies(probe: dict[str, Any]) -> dict[str, float]:
    """Edit_Succ, Rephrase, Portability_<type> and Portability of one probe (pre or post). Questions of a type
    KnowEdit does not name (EasyEdit's API takes any) count in ``Portability`` without a column of their own."""
    row = {"Edit_Succ": _accuracy(prompts_with_role(probe, "rewrite"), "new")}
    para = prompts_with_role(probe, "paraphrase")
    if para:
        row["Rephrase"] = _accuracy(para, "new")
    port = prompts_with_role(probe, "portability")
    present = {p["type"] for p in port}  # KnowEdit's types first, in their order; then any other (EasyEdit's API)
    types = [t for t in PORTABILITY_TYPES if t in present] + sorted(present - set(PORTABILITY_TYPES))
    per_type = {t: _accuracy([p for p in port if p["type"] == t], "answer") for t in types}
    row.update({f"Portability_{t}": v for t, v in per_type.items() if t in PORTABILITY_TYPES})
    if types:
        row["Portability"] = mean(list(per_type.values()))
    return row


def localities(pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
    """Locality_<type> and Locality: per question the unchanged-argmax share, averaged per type, then over types."""
    pre_loc, post_loc = prompts_with_role(pre, "locality"), prompts_with_role(post, "locality")
    if [(p["prompt"], p["type"]) for p in pre_loc] != [(p["prompt"], p["type"]) for p in post_loc]:
        raise EditscopeError("portability suite: the pre- and post-edit probes hold different locality questions")
    per_type: dict[str, list[float]] = {}
    for a, b in zip(pre_loc, post_loc, strict=True):
        share = easyedit_locality(one(a, "answer")["token_argmax"], one(b, "answer")["token_argmax"])
        per_type.setdefault(a["type"], []).append(share)
    means = {t: mean(v) for t, v in per_type.items()}
    row = {f"Locality_{t}": m for t, m in means.items() if t in LOCALITY_TYPES}  # declared columns: KnowEdit's types
    if per_type:
        row["Locality"] = mean(list(means.values()))
    return row


class PortabilitySuite(Suite):
    """KnowEdit portability/locality, EasyEdit's token-accuracy protocol (see the module docstring)."""

    name = "portability"
    metrics_declared = METRICS

    @property
    def protocol(self) -> dict[str, str]:
        return {"name": PROTOCOL, "note": "EasyEdit/KnowEdit: teacher-forced argmax over prompt + ' ' + answer; "
                "portability = share of answer tokens predicted, locality = share of answer positions whose "
                "argmax token the edit left unchanged; every listed question, first ground_truth string"}

    def plan(self, case: Case) -> Plan:
        """The scoring requests of one case; ``Plan.prompts`` carry the KnowEdit type."""
        if "portability" not in case.extra and "locality" not in case.extra:
            raise EditscopeError(f"portability suite: case {case.case_id} ({case.source}) has no KnowEdit "
                                 "portability/locality questions; load a KnowEdit file")
        plan = Plan()
        new = case.request.target_new
        plan.add_prompt(case.request.text, "rewrite", [(new, "new")])
        for p in case.paraphrase_prompts:
            plan.add_prompt(p, "paraphrase", [(new, "new")])
        for role in ("portability", "locality"):
            for kind, items in case.extra.get(role, {}).items():
                for prompt, answer in items:
                    plan.add_prompt(prompt, role, [(answer, "answer")])
                    plan.prompts[-1]["type"] = kind
        return plan

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Raw scores of many cases with one ``engine.score`` call (locality candidates keep the argmax ids)."""
        plans = [self.plan(c) for c in cases]
        scores = engine.score([pair for plan in plans for pair in plan.pairs])
        probes, start = [], 0
        for plan in plans:
            prompts = [{"prompt": p["prompt"], "role": p["role"], "type": p.get("type", ""), "candidates": []}
                       for p in plan.prompts]
            for slot, score in zip(plan.slots, scores[start:start + len(plan.slots)], strict=True):
                cand = candidate(score, slot.text, slot.kind)
                if prompts[slot.prompt_index]["role"] == "locality":
                    if score.token_argmax is None:
                        raise EditscopeError("portability suite: the scorer gives no argmax token ids "
                                             "(ContinuationScore.token_argmax), which locality compares")
                    cand["token_argmax"] = [int(x) for x in score.token_argmax]
                prompts[slot.prompt_index]["candidates"].append(cand)
            start += len(plan.slots)
            probes.append({"prompts": prompts})
        return probes

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """``*_pre``/``*_post`` token accuracies and the post-only localities."""
        row = {f"{k}_pre": v for k, v in accuracies(pre).items()}
        row.update({f"{k}_post": v for k, v in accuracies(post).items()})
        row.update(localities(pre, post))
        return {k: float(v) for k, v in row.items()}
