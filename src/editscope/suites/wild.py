"""Evaluation in the wild: does the edit hold when the model *generates* its answer?

Yang et al., ACL 2025, "The Mirage of Model Editing: Revisiting Evaluation in the Wild" (reference code
WanliYoung/Revisit-Editing-Evaluation): teacher-forced metrics (CounterFact's probability comparison, zsRE's
per-token argmax given the gold prefix) overstate what an edited model says. In the wild the model answers with
no gold prefix -- greedy decoding, stopped at ``.``, a newline or EOS, at most ``max_new_tokens`` (50) new
tokens, never cut to the target's length -- and the answer is judged against the gold answer. The paper judges the
whole answer (exact match, or a judge model); editscope's default judge reads the object the answer asserts first
(``first_object``), the judge that agrees best with answers labelled by hand (``editscope judge-agreement``).

This suite is that protocol for any dataset whose cases have an edit prompt, paraphrases and neighbourhood
prompts with answers (CounterFact, zsRE, QAEdit, KnowEdit). Put it beside the teacher-forced suite of the same
block (``suites: [counterfact, wild]``, ``[zsre, {name: wild, options: {target: answers0, context: qa}}]``) and
both protocols measure the same edits of the same cases, row by row.

Options (all recorded in :attr:`WildSuite.protocol`, so in every results row):

* ``context``: how a prompt is shown -- ``plain`` (the prompt as published, completion style, as CounterFact's
  prompts are written) or ``qa`` (:data:`QA_TEMPLATE`, a question-answer wrapper for question datasets). The
  paper's third context, the tokenizer's chat template, is the run's ``chat_template`` setting (it wraps every
  suite's prompts and is recorded with them);
* ``target``: the answer the edit writes and the rewrite/paraphrase answers are judged against --
  ``target_new`` (the case's request) or ``answers0`` (MEND's ``answers[0]``, what the zsre suite edits by
  default: use it beside that suite so both edit the same thing) or ``target_true`` (the case's true answer: with
  ``methods: [none]`` the unedited model's Efficacy/Generalization are the share of facts it *says*; with an editor
  they count the answers the edit left at the old fact; the edit itself still writes ``target_new``);
* ``max_new_tokens`` (50) and ``stop`` (``.``, newline): the decoding bounds;
* ``blank_start``: what a stop string before the answer's first visible character does -- ``stop`` (default, the
  reference code's ``stop_strings``: a model that opens with a newline answers ``""``, judged wrong) or ``skip``
  (stop strings count from the first non-whitespace character: the words after that newline are the answer) or
  ``lead_in`` (as ``skip``, and a first line that ends with a colon is a lead-in, not the answer: "The answer
  is:\\nFrance" is kept whole, not cut to "The answer is:");
* ``full_stop``: which ``.`` ends an answer -- ``any`` (default, the reference's: every one, so "Robert C. Newton"
  is answered "Robert C" and judged wrong) or ``sentence`` (one that ends a sentence: followed by a space and not
  after an initial or a title, :func:`~editscope.lm.stops.sentence_end`; decoding reads one token past a final
  ``.`` to tell);
* ``judge``: the :data:`~editscope.metrics.answers.JUDGES` entry that decides whether an answer is right
  (``exact_match``, default: SQuAD-normalised exact match; ``token_f1``; ``contains``, the answer holds the gold
  answer as a whole-token span; ``first_object``, the object the answer asserts first; ``model:NAME``, a local
  model asked a fixed yes/no question, ``mirage:NAME`` the same model given the Mirage paper's grading rubric,
  :mod:`editscope.suites.model_judge`; or one registered by the user);
* ``locality_judge``: the :data:`~editscope.metrics.answers.NEIGHBOUR_JUDGES` entry that decides whether a
  neighbourhood answer is unchanged by the edit (``unchanged``: the whole answer equal, the paper's reading;
  ``same_start``; ``same_object``: the same first asserted object);
* ``share`` (1): the share of cases asked about, by a hash of the case id (the same cases at every probe and for
  every method, so a lifelong chain's wild curve follows fixed cases); the others have no wild metrics.

Probe: ``{"prompts": [{"prompt": <the case's prompt>, "role": "rewrite" | "paraphrase" | "neighborhood",
"gold": [answers], "answer": <what the model said>}, ...]}`` -- every generated answer is kept, pre and post, so
a reader can see it (the results rows and the edit card carry the probes).

Metrics (each ``_pre`` and ``_post`` unless noted; a case's value is the mean over its prompts of that role):

* ``Efficacy``: the judge's score of the answer to the edit prompt against the edit target;
* ``Generalization``: the same on the paraphrases;
* ``Locality`` (post-only): the neighbourhood answers the edit left unchanged, by the neighbourhood judge
  (``unchanged``: normalised exact match of the post-edit answer with the unedited model's, the paper's locality in
  the wild);
* ``LocalityTrue``: the neighbourhood answers equal to the dataset's answer (the judge), which a model that never
  knew the fact fails before any edit;
* ``EfficacyF1`` / ``GeneralizationF1``: SQuAD token F1 of the same answers (not headline).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Literal

from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.lm.stops import BLANK_STARTS, FULL_STOPS
from editscope.metrics._validate import MetricInputError
from editscope.metrics.answers import JUDGES, NEIGHBOUR_JUDGES, judge_answer, judge_neighbour, token_f1
from editscope.metrics.registry import MetricSpec
from editscope.suites.base import Suite, check_choice
from editscope.suites.model_judge import ensure_model_judge, judge_prompt_of
from editscope.suites.zsre import answers0, answers0_request

DEFAULT_JUDGE = "first_object"
"""The answer judge unless a config names one: the judge that agrees best with answers labelled by hand on every
dataset labelled (``editscope judge-agreement``: Cohen's κ 0.93 over 220 rewrite and paraphrase answers of
CounterFact, zsRE and QAEdit, against 0.28 for whole-answer exact match, the Mirage paper's metric)."""
DEFAULT_LOCALITY_JUDGE = "same_start"
"""The neighbourhood judge unless a config names one: the first three words unchanged, the judge that agrees best
with the hand labels of 130 neighbourhood answers (κ 0.93; ``same_object`` 0.91 and whole-answer ``unchanged`` 0.88
are within its interval)."""

QA_TEMPLATE = "Question: {prompt}\nAnswer:"
"""The ``qa`` context: a question-answer wrapper (the answer is read after ``Answer:``)."""

CONTEXTS = ("plain", "qa")
TARGETS = ("target_new", "answers0", "target_true")

_P = "Mirage (Yang et al., ACL 2025), evaluation in the wild"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("Efficacy", _P, "judged greedy answer to the edit prompt", True, paper_scale=100,
               description="the answer the model generates to the edit prompt is the edit target (judge)"),
    MetricSpec("Generalization", _P, "judged greedy answers to the paraphrases", True, paper_scale=100,
               description="the answers the model generates to the paraphrases are the edit target (judge)"),
    MetricSpec("Locality", _P, "neighbourhood answers unchanged by the edit", True, paper_scale=100,
               pairing="post_only", description="neighbourhood answers the unedited model gave, unchanged by the "
               "edit (neighbourhood judge)"),
    MetricSpec("LocalityTrue", _P, "neighbourhood answers equal to the dataset's", True, paper_scale=100,
               description="neighbourhood answers equal to the dataset's answer (judge)", headline=False),
    MetricSpec("EfficacyF1", "SQuAD (Rajpurkar et al., 2016) token F1", "F1 of the edit prompt's answer", True,
               paper_scale=100, description="token F1 of the generated answer against the edit target",
               headline=False),
    MetricSpec("GeneralizationF1", "SQuAD (Rajpurkar et al., 2016) token F1", "F1 of the paraphrases' answers",
               True, paper_scale=100, description="token F1 of the paraphrases' answers against the edit target",
               headline=False),
)


COUNTERPARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "counterfact": (("ES_post", "Efficacy_post"), ("PS_post", "Generalization_post"), ("NS_post", "Locality")),
    "zsre": (("Efficacy_post", "Efficacy_post"), ("Paraphrase_post", "Generalization_post"),
             ("Specificity_post", "LocalityTrue_post")),
    "portability": (("Edit_Succ_post", "Efficacy_post"), ("Rephrase_post", "Generalization_post"),
                    ("Locality", "Locality")),
}
"""Teacher-forced suite -> (its column, this suite's column) pairs that measure the same thing in the two protocols:
the summary's paired gap (wild minus teacher-forced, per case) of a block that holds both suites."""


_JUDGED_WHOLE = re.compile(r"judged (?:whole )?by (\S+)")


def recorded_judges(protocol: dict[str, Any]) -> tuple[str, str] | None:
    """(answer judge, neighbourhood judge) a wild row's protocol records: its ``judge`` / ``locality_judge`` keys, with
    `` vN`` where a ``judge_version`` / ``locality_judge_version`` above 1 is recorded; rows written before those keys
    existed name the answer judge in the note and compared neighbour answers whole (``unchanged``). None: not a wild
    protocol that names a judge."""
    if "judge" in protocol:
        def named(key: str, default: str) -> str:
            version = int(protocol.get(f"{key}_version", 1))
            return str(protocol.get(key, default)) + ("" if version == 1 else f" v{version}")

        return named("judge", ""), named("locality_judge", "unchanged")
    found = _JUDGED_WHOLE.search(str(protocol.get("note", "")))
    return None if found is None else (found.group(1), "unchanged")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


class WildSuite(Suite):
    """Evaluation in the wild: greedy answers, each judged by the suite's judges (see the module docstring)."""

    name = "wild"
    metrics_declared = METRICS
    counterparts = COUNTERPARTS

    def __init__(self, *, context: Literal["plain", "qa"] = "plain",
                 target: Literal["target_new", "answers0", "target_true"] = "target_new", max_new_tokens: int = 50,
                 stop: Sequence[str] = (".", "\n"), judge: str = DEFAULT_JUDGE,
                 locality_judge: str = DEFAULT_LOCALITY_JUDGE, share: float = 1.0,
                 blank_start: Literal["stop", "skip", "lead_in"] = "stop",
                 full_stop: Literal["any", "sentence"] = "any") -> None:
        check_choice(self.name, "context", context, CONTEXTS)
        check_choice(self.name, "blank_start", blank_start, BLANK_STARTS)
        check_choice(self.name, "full_stop", full_stop, FULL_STOPS)
        check_choice(self.name, "target", target, TARGETS)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= 1000:
            raise EditscopeError(f"wild suite: option max_new_tokens must be an integer in [1, 1000], not "
                                 f"{max_new_tokens!r}")
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise EditscopeError(f"wild suite: option stop must be a list of non-empty strings, not {stop!r}")
        if isinstance(judge, str):
            ensure_model_judge(judge)  # judge: model:NAME (editscope.suites.model_judge)
        JUDGES.get(judge)  # a one-line error naming the registered judges
        NEIGHBOUR_JUDGES.get(locality_judge)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise EditscopeError(f"wild suite: option share must be a number in (0, 1], not {share!r}")
        self.context, self.target, self.max_new_tokens = context, target, max_new_tokens
        self.stop, self.judge, self.share = tuple(stop), judge, float(share)
        self.locality_judge = locality_judge
        self.blank_start = blank_start
        if full_stop == "sentence" and "." not in self.stop:
            raise EditscopeError(f"wild suite: option full_stop: sentence reads the '.' among the stop strings, and "
                                 f"stop {list(self.stop)!r} has none")
        self.full_stop = full_stop

    @property
    def protocol(self) -> dict[str, str]:
        """``wild``, with every setting that changes its numbers in the note."""
        shown = "the prompt as published" if self.context == "plain" else f"the QA wrapper {QA_TEMPLATE!r}"
        stops = " / ".join(repr(s) for s in self.stop)
        # recorded only when set: rows of the default keep their bytes
        starts = {"stop": "", "skip": " (stop strings counted from the first visible character)",
                  "lead_in": " (stop strings counted from the first visible character, and past a first line ending "
                             "with a colon)"}
        sentence = self.full_stop == "sentence"
        return {"name": "wild", "judge": self.judge, "locality_judge": self.locality_judge, **self._versions(),
                **({"blank_start": self.blank_start} if self.blank_start != "stop" else {}),
                **({"full_stop": "sentence"} if sentence else {}),
                "note": f"evaluation in the wild (Mirage, ACL 2025): context {self.context}, greedy answers to "
                        f"{shown}, stopped at {stops} / EOS or max_new_tokens {self.max_new_tokens}"
                        f"{starts[self.blank_start]}"
                        f"{' (a full stop only where it ends a sentence)' if sentence else ''}, judged by "
                        f"{self.judge}{self._judge_version()} against {self.target}; Locality = neighbourhood "
                        f"answers unchanged ({self.locality_judge})"
                        + ("" if self.share == 1 else f"; asked of the cases whose id hashes below share "
                           f"{self.share:g} (the same at every probe)")}

    def _versions(self) -> dict[str, int]:
        """The judges' versions above 1 (a judge whose verdicts changed since rows first recorded it)."""
        answer = getattr(JUDGES.get(self.judge), "version", 1)
        neighbour = getattr(NEIGHBOUR_JUDGES.get(self.locality_judge), "version", 1)
        return {**({"judge_version": answer} if answer > 1 else {}),
                **({"locality_judge_version": neighbour} if neighbour > 1 else {})}

    def _judge_version(self) -> str:
        style = judge_prompt_of(self.judge)
        version = self._versions().get("judge_version")
        return f" (judge prompt v{style.version})" if style is not None and style.name == "model" else (
            f" (judge prompt {style.name} v{style.version})" if style is not None else
            f" v{version}" if version else "")

    def edit_target(self, case: Case) -> str:
        """The answer the rewrite and paraphrase answers are judged against."""
        if self.target == "target_true":
            if not (case.request.target_true or "").strip():
                raise EditscopeError(f"wild suite: case {case.case_id}: target target_true needs the case's true "
                                     "answer (target_true), which this dataset's record does not give")
            return case.request.target_true
        return case.request.target_new if self.target == "target_new" else answers0(case, self.name)

    def edit_requests(self, case: Case) -> list[EditRequest]:
        """The case's own requests, or (``target: answers0``) its prompt with MEND's answers[0], as the zsre suite
        edits it by default."""
        return [answers0_request(case, self.name)] if self.target == "answers0" else list(case.requests)

    def shown(self, prompt: str) -> str:
        """A prompt as the model sees it in this suite's context."""
        return prompt if self.context == "plain" else QA_TEMPLATE.format(prompt=prompt)

    def questions(self, case: Case) -> list[tuple[str, str, list[str]]]:
        """``(prompt, role, gold answers)`` of every prompt the suite asks about ``case``, in probe order."""
        target = self.edit_target(case)
        out = [(case.request.text, "rewrite", [target])]
        out += [(p, "paraphrase", [target]) for p in case.paraphrase_prompts]
        out += [(p, "neighborhood", [a]) for p, a in case.neighborhood]
        return out

    def asked(self, case: Case) -> bool:
        """Whether the suite asks about ``case``: all of them, or (``share`` < 1) those whose case id hashes below
        ``share``, so a lifelong chain's probes ask the same cases at every checkpoint, whatever the method (the
        wild probe is generation: on a large re-probe sample a share keeps its cost in bounds)."""
        if self.share == 1:
            return True
        digest = hashlib.blake2b(str(case.case_id).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2 ** 64 < self.share

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Every prompt of every case asked about answered in one batched call of ``engine.answer`` (a case not
        asked about has no prompts, and no metrics)."""
        questions = [self.questions(c) if self.asked(c) else [] for c in cases]
        flat = [self.shown(p) for qs in questions for p, _, _ in qs]
        answers = iter(engine.answer(flat, max_new_tokens=self.max_new_tokens, stop=self.stop,
                                     blank_start=self.blank_start, full_stop=self.full_stop)
                       if flat else [])
        return [{"prompts": [{"prompt": p, "role": role, "gold": gold, "answer": next(answers)}
                             for p, role, gold in qs]} for qs in questions]

    def _judged(self, case: Case, p: dict[str, Any]) -> float:
        """The judge's score of one answer; a judge that fails is one line naming it and the case."""
        try:
            return judge_answer(self.judge, p["prompt"], p["answer"], p["gold"])
        except MetricInputError as exc:
            raise EditscopeError(f"wild suite: case {case.case_id}, prompt {p['prompt'][:60]!r}: {exc}") from exc

    def _scores(self, probe: dict[str, Any], role: str, score) -> list[float]:
        return [score(p) for p in probe["prompts"] if p["role"] == role]

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        row: dict[str, float] = {}
        for when, probe in (("pre", pre), ("post", post)):
            def judged(p: dict[str, Any]) -> float:
                return self._judged(case, p)

            def f1(p: dict[str, Any]) -> float:
                return token_f1(p["answer"], p["gold"])

            for name, role, score in (("Efficacy", "rewrite", judged), ("Generalization", "paraphrase", judged),
                                      ("LocalityTrue", "neighborhood", judged), ("EfficacyF1", "rewrite", f1),
                                      ("GeneralizationF1", "paraphrase", f1)):
                value = _mean(self._scores(probe, role, score))
                if value is not None:
                    row[f"{name}_{when}"] = float(value)
        pre_n = [p for p in pre["prompts"] if p["role"] == "neighborhood"]
        post_n = [p for p in post["prompts"] if p["role"] == "neighborhood"]
        if len(pre_n) != len(post_n) or any(a["prompt"] != b["prompt"] for a, b in zip(pre_n, post_n, strict=True)):
            raise EditscopeError(f"wild suite: case {case.case_id}: the pre and post probes ask different "
                                 "neighbourhood prompts")
        if post_n:
            row["Locality"] = _mean([self._same(case, a, b) for a, b in zip(pre_n, post_n, strict=True)])
        return row

    def _same(self, case: Case, before: dict[str, Any], after: dict[str, Any]) -> float:
        """The neighbourhood judge's verdict on one neighbour's answers before and after the edit."""
        try:
            return judge_neighbour(self.locality_judge, before["prompt"], before["answer"], after["answer"],
                                   before.get("gold", []))
        except MetricInputError as exc:
            raise EditscopeError(f"wild suite: case {case.case_id}, prompt {before['prompt'][:60]!r}: {exc}") from exc


__all__ = ["BLANK_STARTS", "CONTEXTS", "COUNTERPARTS", "DEFAULT_JUDGE", "DEFAULT_LOCALITY_JUDGE", "METRICS",
           "QA_TEMPLATE", "TARGETS", "WildSuite", "recorded_judges"]
