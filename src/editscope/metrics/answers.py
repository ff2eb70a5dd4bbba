"""Answer-level metrics for evaluation in the wild: SQuAD answer normalisation, exact match, token F1, and
pluggable answer judges.

In the wild (Yang et al., ACL 2025, "The Mirage of Model Editing: Revisiting Evaluation in the Wild",
arXiv 2502.11177; reference code WanliYoung/Revisit-Editing-Evaluation) the edited model answers a question by
greedy decoding with no gold prefix, and its *whole* answer is judged against the gold answer(s): by normalised
exact match, or by a judge model. This module holds the pure part of that: strings in, a number in [0, 1] out.
No model, no I/O.

The normalisation and both scores are those of the official SQuAD evaluation script (Rajpurkar et al., 2016,
"SQuAD: 100,000+ Questions for Machine Comprehension of Text", EMNLP; script ``evaluate-v1.1.py``):

* :func:`normalize_answer`: lower-case; drop every character of :data:`string.punctuation` (ASCII punctuation
  only: ``“``, ``—`` and other non-ASCII marks stay); replace the articles ``a``/``an``/``the`` (whole words,
  regex ``\\b(a|an|the)\\b``) by a space; collapse whitespace (:meth:`str.split`, so any Unicode space) to
  single spaces and strip. The Mirage reference code normalises with this same function.
* :func:`exact_match`: 1.0 when the normalised prediction equals a normalised gold answer, else 0.0; the
  maximum over the gold answers (SQuAD's ``metric_max_over_ground_truths``).
* :func:`token_f1`: the harmonic mean of token precision and recall, tokens being the whitespace-split
  normalised text and the overlap counted as a multiset; the maximum over the gold answers.

Empty answers (empty after normalisation: ``""``, ``"the"``, ``"?!"``) follow the SQuAD 2.0 script
(``evaluate-v2.0.py``, ``compute_f1``): when the prediction or the gold answer has no token, F1 is 1.0 if both
have none and 0.0 otherwise. The v1.1 script returns 0.0 when both are empty (no common token), while its exact
match gives 1.0 for the same pair; the 2.0 rule keeps EM and F1 consistent, so it is the one used here.

Judges (:class:`Judge`): a judge scores a prediction for a question against its gold answers, returning a
number in [0, 1]; it has a ``name`` and declares whether it only ever returns 0 or 1 (``binary``). The
built-in ones, ``exact_match``, ``token_f1``, ``contains`` (lenient) and ``first_object`` (the object the answer
asserts first, :func:`first_object`), are in :data:`JUDGES`; a judge model (the Mirage paper's LLM-as-a-judge) is
registered there from a layer that may hold a model. :func:`judge_answer` calls a judge by name or object and checks
what it returns.

Neighbourhood judges (:data:`NEIGHBOUR_JUDGES`) decide whether an edit left a neighbouring prompt's answer alone:
``unchanged`` (the whole answer equal after normalisation, the Mirage paper's locality), ``same_start`` (the first
three words equal) and ``same_object`` (the same first asserted object, :func:`same_object`).

Why an object-level judge: a greedy answer to a completion prompt rarely stops after the object ("Toronto, Canada",
"English, and the English language, ..."); judged whole, each is wrong for the target "Toronto" / "English". How
each judge agrees with answers labelled by hand is measured (``editscope judge-agreement``, agreement statistics in
:mod:`editscope.metrics.agreement`).

The per-case numbers a wild suite reports from these (efficacy, generalisation, locality in the wild) are
declared by that suite as :class:`~editscope.metrics.registry.MetricSpec` entries, as every suite declares its
own metrics; this module declares none.
"""

from __future__ import annotations

import math
import numbers
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from editscope.metrics._validate import fail
from editscope.registry import Registry

__all__ = [
    "JUDGES",
    "NEIGHBOUR_JUDGES",
    "FIRST_OBJECT_VERSION",
    "AnswerMatchJudge",
    "Judge",
    "NeighbourJudge",
    "answer_tokens",
    "contains_answer",
    "exact_match",
    "first_object",
    "judge_answer",
    "judge_neighbour",
    "leading_clause",
    "normalize_answer",
    "same_object",
    "same_start",
    "token_f1",
]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise fail(name, f"expected a str, got {type(value).__name__}")
    return value


def _golds(truths: object, name: str = "truths") -> list[str]:
    """The gold answers: a non-empty sequence of strings (a bare string is refused, not split into characters)."""
    if isinstance(truths, str | bytes):
        raise fail(name, "expected a sequence of gold answers, got a single string (wrap it in a list)")
    if not isinstance(truths, Sequence):
        raise fail(name, f"expected a sequence of gold answers, got {type(truths).__name__}")
    golds = list(truths)
    if not golds:
        raise fail(name, "is empty: at least one gold answer is needed")
    for i, gold in enumerate(golds):
        _text(gold, f"{name}[{i}]")
    return golds


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation (Rajpurkar et al., 2016; ``normalize_answer`` of the official evaluation
    script), in its order: lower-case, remove :data:`string.punctuation` characters, replace the articles
    ``a``/``an``/``the`` (regex ``\\b(a|an|the)\\b``) by a space, collapse whitespace.

    ``"The  Eiffel-Tower!"`` -> ``"eiffeltower"``; ``"an apple a day"`` -> ``"apple day"``. Used by the Mirage of
    Model Editing's exact-match metric (Yang et al., ACL 2025).
    """
    lowered = _text(text, "text").lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punctuation)
    return " ".join(no_articles.split())


def answer_tokens(text: str) -> list[str]:
    """The tokens SQuAD's F1 counts: the normalised text (:func:`normalize_answer`) split on whitespace."""
    return normalize_answer(text).split()


def exact_match(prediction: str, truths: Sequence[str]) -> float:
    """Normalised exact match, max over gold answers: ``max_g 1[norm(prediction) == norm(g)]``.

    SQuAD v1.1 evaluation script, ``exact_match_score`` with ``metric_max_over_ground_truths`` (Rajpurkar et al.,
    2016, section 6.1 "Model Evaluation": exact match). The Mirage paper's WILD metric for the edited question and
    its paraphrase (Yang et al., ACL 2025; reference ``evaluate_utils.exact_match_score``, one gold answer; its
    locality compares the generated tokens before and after the edit instead). Returns 0.0 or 1.0.
    """
    pred = normalize_answer(_text(prediction, "prediction"))
    return max(float(pred == normalize_answer(g)) for g in _golds(truths))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # SQuAD 2.0's rule for empty answers
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2.0 * precision * recall / (precision + recall)


def token_f1(prediction: str, truths: Sequence[str]) -> float:
    """Token-level F1, max over gold answers: ``max_g 2·P·R / (P + R)`` with ``P = |p ∩ g| / |p|``,
    ``R = |p ∩ g| / |g|``, ``p`` and ``g`` the multisets of :func:`answer_tokens` of prediction and gold.

    SQuAD evaluation script ``f1_score`` (Rajpurkar et al., 2016, section 6.1 "Model Evaluation": macro-averaged F1),
    with the SQuAD 2.0 script's rule for answers that are empty after normalisation: 1.0 when both are empty,
    0.0 when one is (module docstring). No common token gives 0.0. A partial-credit companion of the Mirage
    paper's exact match (Yang et al., ACL 2025).
    """
    pred = answer_tokens(_text(prediction, "prediction"))
    return max(_f1(pred, answer_tokens(g)) for g in _golds(truths))


def contains_answer(prediction: str, truths: Sequence[str]) -> float:
    """Whether the answer holds a gold answer, max over gold answers: ``max_g 1[tokens(g) is a contiguous run of
    tokens(prediction)]`` on :func:`answer_tokens` (whole tokens: "New Yorker" does not hold "New York").

    The has-answer check of open-domain QA (DPR, Karpukhin et al., 2020: a retrieved passage counts when it holds an
    answer as a token span), here applied to a generated answer: a lenient companion of exact match for greedy
    answers that go on past the target ("Central District of Lahore" for "Central District"). A gold answer that is
    empty after normalisation is held only by an empty prediction (exact match's rule for that pair). Returns 0.0
    or 1.0.
    """
    pred = answer_tokens(_text(prediction, "prediction"))

    def holds(gold: list[str]) -> bool:
        if not gold:
            return not pred
        return any(pred[i:i + len(gold)] == gold for i in range(len(pred) - len(gold) + 1))

    return max(float(holds(answer_tokens(g))) for g in _golds(truths))


_CLAUSE_BREAK = re.compile(
    r"[,;()\[\]!?\"“”]|\s[-–—]+\s|—|\b(?:and|or|but|nor|which|who|whom|whose|where|while|whereas|because|although"
    r"|though|since|unless|whether)\b", re.IGNORECASE)
"""Where an answer's first clause ends: a comma, semicolon, bracket, quote, exclamation or question mark, a dash
between spaces, or a coordinating / relative / subordinating word. A full stop ends every answer already (the wild
protocol stops decoding there); a colon is not a break ("The answer is: Paris")."""


def leading_clause(text: str) -> list[str]:
    """The normalised tokens (:func:`answer_tokens`) of ``text`` before its first clause break
    (:data:`_CLAUSE_BREAK`): the span in which an answer states the object it asserts first.

    ``"Toronto, Canada"`` -> ``["toronto"]``; ``"English, and the English language"`` -> ``["english"]``;
    ``"The continent that is Freyberg Mountains on is Europe"`` -> the whole answer; ``"Paris and London"`` ->
    ``["paris"]``; ``'"Roar" by Katy Perry'`` -> ``["roar"]`` (punctuation before the first letter or digit is no
    break)."""
    raw = _text(text, "text")
    found = _first_break(raw)
    return answer_tokens(raw[:found.start()] if found else raw)


def _first_break(text: str) -> re.Match | None:
    """The first clause break (:data:`_CLAUSE_BREAK`) after ``text``'s first letter or digit: an opening quote or
    bracket is no break."""
    return _CLAUSE_BREAK.search(text, next((i for i, ch in enumerate(text) if ch.isalnum()), len(text)))


def _run_at(tokens: list[str], gold: list[str]) -> int | None:
    """The first position where ``gold`` is a contiguous run of ``tokens`` (None when it is not one)."""
    for i in range(len(tokens) - len(gold) + 1):
        if tokens[i:i + len(gold)] == gold:
            return i
    return None


_MASK = "\u27e8gold\u27e9"  # stands in for a gold answer inside an answer: one token, no clause break, not a word


def _gold_in_clause(prediction: str, gold: str) -> bool:
    """Whether ``gold``, a gold answer whose own text holds a clause break (:data:`_CLAUSE_BREAK`: ``"Trinidad and
    Tobago"``, ``'"Roar" by Katy Perry'``, ``"December 29, 1998"``, ``"Doctor Who"``), is stated inside the answer's
    first clause: its first occurrence in the answer (its words in order, case-insensitive, any punctuation or space
    between them, and the punctuation around it when the gold opens or closes with some) is replaced by one neutral
    token and the leading clause of what remains is read. A break inside the gold is the gold's, not the answer's."""
    raw = gold.strip()
    if not _first_break(raw):
        return False  # no break of its own: the plain clause test decides
    words = re.findall(r"\w+", raw)
    lead = "" if raw[0].isalnum() else r"\W*"
    tail = "" if raw[-1].isalnum() else r"\W*"
    found = re.search(lead + r"(?<!\w)" + r"\W+".join(map(re.escape, words)) + r"(?!\w)" + tail, prediction,
                      re.IGNORECASE)
    if found is None:
        return False
    return _MASK in leading_clause(f"{prediction[:found.start()]} {_MASK} {prediction[found.end():]}")


def first_object(prediction: str, truths: Sequence[str]) -> float:
    """Whether the object the answer asserts first is a gold answer, max over gold answers: 1 when the normalised
    answer *begins* with the gold answer's tokens (``"Trinidad and Tobago, an island"`` for "Trinidad and Tobago"),
    or when the gold answer's tokens are a whole-token run of the answer's :func:`leading_clause` (``"the city of
    Toronto"``, ``"The continent ... is Europe"``), or, for a gold answer whose own text holds a clause break, when it
    is stated inside the first clause (:func:`_gold_in_clause`: ``"The answer is December 29, 1998"``, ``'The song
    "Roar" by Katy Perry'``; version 2 of the judge, :data:`FIRST_OBJECT_VERSION`); else 0.

    Neither the Mirage paper (Yang et al., ACL 2025), which judges the whole answer by exact match or a judge model,
    nor SQuAD defines it: it is editscope's reading of the object an answer asserts, for greedy answers that go on
    past the object. ``"Toronto, Canada"`` holds for "Toronto"; ``"French, not English"`` does not hold for
    "English" (the clause ends at the comma); an empty answer holds nothing (an empty gold answer only an empty
    answer)."""
    pred = answer_tokens(_text(prediction, "prediction"))
    clause = leading_clause(prediction)

    def holds(raw: str) -> bool:
        gold = answer_tokens(raw)
        if not gold:
            return not pred
        return pred[:len(gold)] == gold or _run_at(clause, gold) is not None or _gold_in_clause(prediction, raw)

    return max(float(holds(g)) for g in _golds(truths))


LOOP_WORDS, LOOP_DISTINCT = 4, 0.5


def repeats_itself(prediction: str) -> bool:
    """Whether an answer is a repetition loop: at least :data:`LOOP_WORDS` answer tokens (:func:`answer_tokens`), fewer
    than :data:`LOOP_DISTINCT` of them distinct (``"Welsh Welsh Welsh Welsh"``, ``"Rijmenam, Rijmenam, Rijmenam,
    Rijmenam"``). The rule of editscope's quick check for a degenerate continuation, read on words."""
    tokens = answer_tokens(_text(prediction, "prediction"))
    return len(tokens) >= LOOP_WORDS and len(set(tokens)) < LOOP_DISTINCT * len(tokens)


def first_object_fluent(prediction: str, truths: Sequence[str]) -> float:
    """:func:`first_object`, and 0 for an answer that :func:`repeats_itself`: an edit that leaves the model saying
    ``"Welsh Welsh Welsh ..."`` asserts the object first but does not answer as a speaker would. Stricter than the
    hand-label rule, which counts a run-on that opens with the object right."""
    return 0.0 if repeats_itself(prediction) else first_object(prediction, truths)


FIRST_OBJECT_VERSION = 2
"""Version 1 ended every answer's first clause at a break inside the gold answer itself, so ``'The song "Roar" by
Katy Perry'`` was 0 for ``'"Roar" by Katy Perry'``; version 2 reads such a gold answer whole (:func:`_gold_in_clause`).
Wild rows record the version (a run begun under version 1 is not resumed under 2)."""


@runtime_checkable
class Judge(Protocol):
    """Scores a generated answer: ``judge(question, prediction, golds) -> float`` in [0, 1].

    ``question`` is the question as asked (a judge model reads it; string matchers ignore it), ``prediction`` the
    model's whole answer, ``golds`` the accepted answers (at least one). ``name`` is the judge's registry name and
    the label result rows carry; ``binary`` declares that the judge only returns 0.0 or 1.0 (a success share
    rather than a graded score).
    """

    name: str
    binary: bool

    def __call__(self, question: str, prediction: str, golds: Sequence[str]) -> float: ...


@dataclass(frozen=True)
class AnswerMatchJudge:
    """A :class:`Judge` made of a pure string metric ``score(prediction, golds)`` (the question is not read)."""

    name: str
    score: Callable[[str, Sequence[str]], float]
    binary: bool
    version: int = 1  # bumped when the judge's verdicts change; rows record a version above 1

    def __call__(self, question: str, prediction: str, golds: Sequence[str]) -> float:
        _text(question, "question")
        return self.score(prediction, golds)


JUDGES: Registry[Judge] = Registry("answer judge", expected=Judge, name_of=lambda j: j.name)
"""Answer judges by name (``JUDGES.register(judge, description="...")``; the judge's ``name`` is the key)."""

JUDGES.register(
    AnswerMatchJudge("exact_match", exact_match, binary=True),
    description="SQuAD-normalised exact match, max over gold answers (the Mirage paper's WILD metric)",
)
JUDGES.register(
    AnswerMatchJudge("token_f1", token_f1, binary=False),
    description="SQuAD token F1 on normalised answers, max over gold answers (SQuAD 2.0 rule for empty answers)",
)
JUDGES.register(
    AnswerMatchJudge("contains", contains_answer, binary=True),
    description="the answer holds a gold answer as a whole-token span after SQuAD normalisation (lenient)",
)
JUDGES.register(
    AnswerMatchJudge("first_object", first_object, binary=True, version=FIRST_OBJECT_VERSION),
    description="the answer begins with a gold answer, or its first clause holds one (the object it asserts first)",
)
JUDGES.register(
    AnswerMatchJudge("first_object_fluent", first_object_fluent, binary=True),
    description="first_object, and an answer that loops (fewer than half of its 4 or more words distinct) is wrong",
)


def judge_answer(judge: str | Judge, question: str, prediction: str, golds: Sequence[str]) -> float:
    """``judge(question, prediction, golds)`` for a judge given by name (:data:`JUDGES`) or as an object, checked:
    the result must be a real number in [0, 1] (exactly 0 or 1 for a ``binary`` judge); anything else, and any
    exception the judge raises, is a :class:`~editscope.metrics.MetricInputError` (one line) naming the judge."""
    resolved = JUDGES[judge] if isinstance(judge, str) else judge
    if not isinstance(resolved, Judge):
        raise fail("judge", f"expected a judge name or a Judge, got {type(judge).__name__}")
    golds_list = _golds(golds, "golds")
    question, prediction = _text(question, "question"), _text(prediction, "prediction")
    label = f"judge {resolved.name!r}"
    try:
        value = resolved(question, prediction, golds_list)
    except Exception as exc:  # noqa: BLE001 -- a registered judge is user code: whatever it raised, one line naming it
        words = str(exc).strip().splitlines()
        raise fail(label, f"raised {type(exc).__name__}" + (f": {words[0][:200]}" if words else "")) from exc
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(label, f"returned {type(value).__name__}, not a number")
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise fail(label, f"returned {value!r}, outside [0, 1]")
    if resolved.binary and value not in (0.0, 1.0):
        raise fail(label, f"is declared binary but returned {value!r}")
    return value


# -- neighbourhood judges ----------------------------------------------------------------------------------------


def same_start(before: str, after: str, words: int = 3) -> float:
    """1 when the first ``words`` normalised tokens of the two answers are equal (both answers shorter: all their
    tokens), else 0: a rewording after the first words is not counted as a change."""
    a, b = answer_tokens(_text(before, "before")), answer_tokens(_text(after, "after"))
    return float(a[:words] == b[:words])


def same_object(before: str, after: str, golds: Sequence[str] = ()) -> float:
    """Whether the answer after an edit asserts the same first object as the answer before it (1 or 0).

    When the answer before asserts one of the neighbour's gold answers (:func:`first_object`), the answer after must
    assert that gold answer too, however it goes on; otherwise the two answers' :func:`leading_clause` spans must be
    equal after normalisation (two empty answers are the same answer). editscope's object-level reading of the
    Mirage paper's locality in the wild (Yang et al., ACL 2025), which compares whole answers."""
    before, after = _text(before, "before"), _text(after, "after")
    for gold in golds:
        if first_object(before, [gold]):
            return first_object(after, [gold])
    return float(leading_clause(before) == leading_clause(after))


@runtime_checkable
class NeighbourJudge(Protocol):
    """Decides whether an edit left a neighbouring prompt's answer alone: ``judge(question, before, after, golds)``
    -> 1.0 (the same answer) or 0.0; ``golds`` are the dataset's answers to the neighbouring prompt (possibly
    empty)."""

    name: str

    def __call__(self, question: str, before: str, after: str, golds: Sequence[str]) -> float: ...


@dataclass(frozen=True)
class AnswerPairJudge:
    """A :class:`NeighbourJudge` made of a pure comparison ``same(before, after, golds)`` (the question unread)."""

    name: str
    same: Callable[[str, str, Sequence[str]], float]
    version: int = 1  # bumped when the judge's verdicts change; rows record a version above 1

    def __call__(self, question: str, before: str, after: str, golds: Sequence[str]) -> float:
        _text(question, "question")
        return self.same(before, after, golds)


NEIGHBOUR_JUDGES: Registry[NeighbourJudge] = Registry("neighbourhood judge", expected=NeighbourJudge,
                                                      name_of=lambda j: j.name)
"""Neighbourhood judges by name (``NEIGHBOUR_JUDGES.register(judge, description="...")``)."""

NEIGHBOUR_JUDGES.register(
    AnswerPairJudge("unchanged", lambda before, after, golds: exact_match(after, [before])),
    description="the whole answer unchanged after SQuAD normalisation (the Mirage paper's locality in the wild)",
)
NEIGHBOUR_JUDGES.register(
    AnswerPairJudge("same_start", lambda before, after, golds: same_start(before, after)),
    description="the first three normalised words unchanged",
)
NEIGHBOUR_JUDGES.register(
    AnswerPairJudge("same_object", same_object, version=FIRST_OBJECT_VERSION),  # it reads first_object
    description="the same first asserted object (the gold answer kept when it was asserted, else the same first "
                "clause)",
)


def judge_neighbour(judge: str | NeighbourJudge, question: str, before: str, after: str,
                    golds: Sequence[str] = ()) -> float:
    """``judge(question, before, after, golds)`` for a neighbourhood judge given by name (:data:`NEIGHBOUR_JUDGES`)
    or as an object, checked: it must return exactly 0.0 or 1.0; anything else, and any exception it raises, is a
    :class:`~editscope.metrics.MetricInputError` naming the judge."""
    resolved = NEIGHBOUR_JUDGES[judge] if isinstance(judge, str) else judge
    if not isinstance(resolved, NeighbourJudge):
        raise fail("judge", f"expected a neighbourhood judge name or a NeighbourJudge, got {type(judge).__name__}")
    golds_list = [_text(g, f"golds[{i}]") for i, g in enumerate(golds)]
    question, before, after = _text(question, "question"), _text(before, "before"), _text(after, "after")
    label = f"neighbourhood judge {resolved.name!r}"
    try:
        value = resolved(question, before, after, golds_list)
    except Exception as exc:  # noqa: BLE001 -- a registered judge is user code: whatever it raised, one line naming it
        words = str(exc).strip().splitlines()
        raise fail(label, f"raised {type(exc).__name__}" + (f": {words[0][:200]}" if words else "")) from exc
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or float(value) not in (0.0, 1.0):
        raise fail(label, f"returned {value!r}, not 0 or 1")
    return float(value)
