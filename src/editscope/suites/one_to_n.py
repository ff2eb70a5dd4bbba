"""1-to-N suite: NKL, MaxAcc, Precision@K, PPL before and after an edit (paper 000, eqs 1-13, section 2.2).

A case is a query with several valid answers: PEAK's cases are such facts (``valid_answers`` = the positive
list). The query is the rewrite prompt with the subject filled in.

What to edit (paper 000, appendix D.2 -- the runner's job, listed here so it edits the right thing):
:meth:`OneToNSuite.edit_requests` gives the requests. With ``edits="all_valid"`` (default, the paper's
protocol) there is one request per valid answer, ``target_new`` = that answer, in the order of the list:
single-edit methods (ROME, ...) apply them sequentially, one at a time, keeping the earlier edits;
batch methods (MEMIT, AlphaEdit, ...) apply them as one batch. With ``edits="append"`` it is the case's own
request (PEAK's appended ``o*``); the valid set scored stays the original answers.

Probe, following :mod:`editscope.suites.base`::

    {"prompts": [{"prompt": <query>, "role": "rewrite", "candidates": [
        <each valid answer, kind "correct">, <each hard false answer, kind "hard_false">,
        <each random false answer, kind "random_false">]}],
     "gold": {"answers": [str], "weights": [float], "source": "counts" | "uniform",
              "counts": [int], "window": str, "corpus": sha256}}

Candidates are ``{"text", "kind", "logprob_sum", "n_tokens", "token_logprobs", "token_is_argmax"}``. False
answers that equal a valid answer are dropped (35 PEAK-CF records overlap; see :mod:`editscope.suites.peak`).

Metrics (declared by :attr:`OneToNSuite.metrics_declared`; each ``*_pre`` and ``*_post``, as paper 000
compares them, except ``gold_uniform``):

* ``NKL`` (eq 10): Q-weighted length-normalised NLL of the valid answers;
* ``MaxAcc``: is the most probable candidate (valid + false answers, sequence log-prob = sum over tokens,
  eq 3) valid; ``Precision@K`` (K = option ``k``, default 3, the key is e.g. ``Precision@3``): is any of the
  top-K candidates valid;
* ``PPL``: ``exp(-mean over valid answers of log P(a | q))`` with sequence log-probs (may be ``inf``);
* ``gold_uniform`` (post-only): 1.0 when the gold distribution fell back to uniform (all counts 0), else 0.0.

Gold distribution Q (section 3.4): co-occurrence counts of (subject, answer) in a corpus, normalised over the
valid answers (:func:`~editscope.metrics.gold_distribution`); uniform when every count is 0 (the paper drops
such queries; here the probe records ``"source": "uniform"`` and the row ``gold_uniform`` = 1 so a report can
drop or keep them). Counting (:class:`CooccurrenceCounter`): the corpus is wikitext-2 test+valid by default;
the window is a *passage* (one wikitext paragraph = one non-heading line; option ``window="sentence"``
splits passages at ``.``/``!``/``?`` followed by whitespace); the count of (s, a) is the number of windows in
which both the subject and the answer occur, case-sensitively, at word boundaries; a trailing Wikidata
qualifier of an answer is ignored for matching ("Georgia (country)" is looked up as "Georgia"). Counts are
cached on disk as JSON under ``home()/cooccurrence/<corpus sha256>-<window>.json`` and on the suite object.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from editscope.data.corpus import Corpus, phrase_pattern
from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics import gold_distribution, max_acc, nkl, perplexity, precision_at_k
from editscope.metrics.registry import MetricSpec
from editscope.paths import home
from editscope.suites._common import (
    Plan,
    by_kind,
    dedupe,
    prompts_with_role,
    read_json,
    score_plans,
    surface,
    write_json_atomic,
)
from editscope.suites.base import Suite, SuiteFigure, check_choice

_P = "000 (1-to-N knowledge)"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_windows(passages: Sequence[str], window: str) -> list[str]:
    """The co-occurrence windows: the passages themselves, or their sentences."""
    if window == "passage":
        return list(passages)
    if window == "sentence":
        return [s for p in passages for s in _SENTENCE_END.split(p) if s.strip()]
    raise EditscopeError(f"window must be 'passage' or 'sentence', not {window!r}")


def count_cooccurrences(windows: Sequence[str], subject: str, answers: Sequence[str]) -> list[int]:
    """Per answer, the number of windows holding both ``subject`` and the answer (word-boundary matches of
    the :func:`~editscope.suites._common.surface` forms, case-sensitive)."""
    subj = phrase_pattern(surface(subject))
    with_subject = [w for w in windows if subj.search(w)]
    counts = []
    for a in answers:
        pat = phrase_pattern(surface(a))
        counts.append(sum(1 for w in with_subject if pat.search(w)))
    return counts


class CooccurrenceCounter:
    """(subject, answer) co-occurrence counts in a corpus, cached on disk by corpus hash and window."""

    def __init__(self, corpus: Corpus, window: Literal["passage", "sentence"] = "passage") -> None:
        split_windows([], window)  # validates the name
        self.corpus = corpus
        self.window = window
        self._windows: list[str] | None = None
        self._cache: dict[str, int] | None = None
        self._dirty = False

    @property
    def path(self) -> Path:
        return home() / "cooccurrence" / f"{self.corpus.sha256}-{self.window}.json"

    def _load(self) -> dict[str, int]:
        if self._cache is None:
            data = read_json(self.path)
            self._cache = {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
        return self._cache

    @staticmethod
    def key(subject: str, answer: str) -> str:
        return f"{subject}\x1f{answer}"

    def counts(self, subject: str, answers: Sequence[str]) -> list[int]:
        """Counts for each answer (computed once, then served from the cache)."""
        cache = self._load()
        missing = [a for a in answers if self.key(subject, a) not in cache]
        if missing:
            if self._windows is None:
                self._windows = split_windows(self.corpus.passages, self.window)
            for a, c in zip(missing, count_cooccurrences(self._windows, subject, missing), strict=True):
                cache[self.key(subject, a)] = c
            self._dirty = True
        return [cache[self.key(subject, a)] for a in answers]

    def flush(self) -> None:
        """Merge the new counts into the disk cache (atomic rewrite; concurrent writers only add keys)."""
        if not self._dirty or self._cache is None:
            return
        on_disk = read_json(self.path)
        merged = {**(on_disk if isinstance(on_disk, dict) else {}), **self._cache}
        write_json_atomic(self.path, merged)
        self._dirty = False


class OneToNSuite(Suite):
    """1-to-N knowledge metrics before and after an edit; see the module docstring."""

    name = "one_to_n"
    card_section = "siblings"

    def __init__(self, *, k: int = 3, corpus: Sequence[str | os.PathLike[str]] | None = None,
                 window: Literal["passage", "sentence"] = "passage", include_false: bool = True,
                 edits: Literal["all_valid", "append"] = "all_valid") -> None:
        check_choice(self.name, "edits", edits, ("all_valid", "append"))
        self.k = int(k)
        self.include_false = include_false
        self.edits = edits
        self.corpus = Corpus(corpus)
        self.counter = CooccurrenceCounter(self.corpus, window)

    @property
    def metrics_declared(self) -> tuple[MetricSpec, ...]:
        return (
            MetricSpec("NKL", _P, "eq 10", False, (0.0, math.inf), "nats",
                       description="Q-weighted length-normalised NLL of the valid answers"),
            MetricSpec("MaxAcc", _P, "section 2.2 (1)", True, description="the most probable candidate is valid"),
            MetricSpec(f"Precision@{self.k}", _P, "section 2.2 (2)", True,
                       description=f"a valid answer is among the top-{self.k} candidates"),
            MetricSpec("PPL", _P, "section 2.2 (3)", False, (1.0, math.inf), "ppl",
                       description="exp(-mean over valid answers of the sequence log-prob)"),
            MetricSpec("gold_uniform", _P, "section 3.4", None, (0.0, 1.0), "flag", pairing="post_only",
                       description="1 when the gold distribution fell back to uniform (no co-occurrence)"),
        )

    def edit_requests(self, case: Case) -> list[EditRequest]:
        """The edits the runner should make for ``case`` (paper 000, appendix D.2; see the module docstring)."""
        req = case.request
        if self.edits == "append":
            return [req]
        return [EditRequest(req.prompt, req.subject, answer, req.target_true) for answer in self._valid(case)]

    @staticmethod
    def _valid(case: Case) -> list[str]:
        valid = dedupe(case.valid_answers)
        if not valid:
            raise EditscopeError(f"case {case.case_id}: the one_to_n suite needs valid answers (a 1-to-N fact)")
        return valid

    def plan(self, case: Case) -> Plan:
        """The scoring requests of one case: every candidate after the query."""
        valid = self._valid(case)
        cands = [(a, "correct") for a in valid]
        if self.include_false:
            cands += [(a, "hard_false") for a in dedupe(case.hard_false, exclude=valid)]
            cands += [(a, "random_false") for a in dedupe(case.random_false, exclude=[*valid, *case.hard_false])]
        plan = Plan()
        plan.add_prompt(case.request.text, "rewrite", cands)
        return plan

    def gold(self, case: Case) -> dict[str, Any]:
        """The gold distribution block of the probe (counts, weights, source)."""
        valid = self._valid(case)
        counts = self.counter.counts(case.request.subject, valid)
        weights = gold_distribution(counts, on_zero="uniform")
        return {
            "answers": valid,
            "weights": [float(w) for w in weights],
            "source": "counts" if sum(counts) > 0 else "uniform",
            "counts": [int(c) for c in counts],
            "window": self.counter.window,
            "corpus": self.corpus.sha256,
        }

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Raw scores of many cases with one ``engine.score`` call."""
        probes = score_plans(engine, [self.plan(c) for c in cases])
        for case, probe in zip(cases, probes, strict=True):
            probe["gold"] = self.gold(case)
        self.counter.flush()
        return probes

    # -- metrics ------------------------------------------------------------------------------------
    def _values(self, probe: dict[str, Any]) -> dict[str, float]:
        (query,) = prompts_with_role(probe, "rewrite")
        gold = probe["gold"]
        correct = by_kind(query, "correct")
        if [c["text"] for c in correct] != list(gold["answers"]):
            raise EditscopeError("one_to_n probe: the valid candidates do not match the gold answers")
        cands = query["candidates"]
        seq_lp = np.array([float(c["logprob_sum"]) for c in cands])
        valid = np.array([c["kind"] == "correct" for c in cands])
        token_lps = [c["token_logprobs"] for c in correct]
        return {
            "NKL": nkl(token_lps, gold["weights"]),
            "MaxAcc": max_acc(seq_lp, valid),
            f"Precision@{self.k}": precision_at_k(seq_lp, valid, self.k),
            "PPL": perplexity(token_lps),
        }

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """``NKL/MaxAcc/Precision@K/PPL`` each as ``*_pre`` and ``*_post``, plus ``gold_uniform``."""
        row: dict[str, float] = {}
        for tag, probe in (("pre", pre), ("post", post)):
            row.update({f"{k}_{tag}": v for k, v in self._values(probe).items()})
        row["gold_uniform"] = float(post["gold"]["source"] == "uniform")
        return {k: float(v) for k, v in row.items()}

    # -- report -------------------------------------------------------------------------------------
    def sample_case(self, rows: Sequence[dict[str, Any]], seed: int) -> str | None:
        """A case id drawn with ``seed``, preferring gold from counts and >= 2 valid answers."""
        ids = list(dict.fromkeys(r["case_id"] for r in rows))
        good = [c for c in ids if any(r["case_id"] == c and r["pre"][self.name]["gold"]["source"] == "counts"
                                       and len(r["pre"][self.name]["gold"]["answers"]) >= 2 for r in rows)]
        pool = good or ids
        return random.Random(seed).choice(pool) if pool else None

    def figures(self, dataset: str, rows: Sequence[dict[str, Any]], methods: Sequence[str], *,
                seed: int = 0) -> list[SuiteFigure]:
        """The 1-to-N distribution of a sampled case before and after each method's edit (paper 000, Fig. 5)."""
        from editscope.suites._figures import one_to_n_case

        case_id = self.sample_case(rows, seed)
        if case_id is None:
            return []
        order = {m: i for i, m in enumerate(methods)}
        crows = sorted((r for r in rows if r["case_id"] == case_id), key=lambda r: order.get(r["method"], len(order)))
        pre = crows[0]["pre"][self.name]
        # a probe-only run (``methods: [none]``) has no post-edit state: the figure shows the model and Q only
        posts = {r["method"]: r["post"][self.name] for r in crows if self.name in (r.get("post") or {})}
        query = next(p["prompt"] for p in pre["prompts"] if p["role"] == "rewrite")
        reqs = crows[0].get("requests") or []
        note = ""
        if reqs and posts:  # a probe-only run edited nothing
            targets = ", ".join(r["target_new"] for r in reqs)
            note = f"edit: {'append' if len(reqs) == 1 else 'write'} “{targets}”"
        return [SuiteFigure(
            f"one-to-n-{dataset}-{case_id}", f"1-to-N distribution of case {case_id} ({dataset})",
            "Model probability of each valid answer (sequence probability renormalised over the valid answers) "
            "before and after each method's edit, beside the gold distribution Q from corpus co-occurrence "
            "counts (uniform when no count is found); cf. paper 000, Fig. 5.",
            one_to_n_case(case_id, query, pre["gold"], pre, posts, note))]
