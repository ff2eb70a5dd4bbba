"""Probe sets of facts the *unedited* model knows, chosen once per model and cached: one :class:`FactPool` behind
the general suite's ``KnownFacts`` and the collateral suite's flip count (and the edit card's collateral scan).

The pool: the records of its sources (datasets, in order; of each the last ``tail`` records, or all) that have a
true answer and whose filled prompt occurs exactly once among all records of the sources (a prompt asked twice has
an ambiguous answer, and a run editing the other record would edit this fact); each gives a :class:`Fact` (the
filled prompt and ``target_true``). A fact is known when every token of its answer is the argmax after its prompt
(zsRE's top-1 rule). The pool is scanned in order, in chunks of one batched ``engine.score`` call each, until ``n``
known facts are found (so a large pool costs only as much as the scan needs); the first ``n`` known facts in pool
order are the set. The choice is cached as JSON under ``home()/known_facts/`` keyed by the model's weights
fingerprint and the pool's rule (its sources, tail, ``n`` and the prompt format: everything the set depends on),
with each fact's log-prob on the unedited model (the "before" of a scan). Sets chosen ahead for the shipped models'
default pools ship with editscope under the same key (``suites/known_sets/``: a scan's cache file, copied;
``tests/suites/test_general.py`` checks each against the model): a fresh cache reads one instead of scanning (~1 min
on SmolLM2 on one thread).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.paths import home
from editscope.suites._common import read_json, write_json_atomic

CHUNK = 1000  # facts scored per engine call while scanning a pool
PROGRESS_EVERY = 5.0  # seconds between progress calls inside a chunk (found: the count before the chunk)


@dataclass(frozen=True)
class Fact:
    """One probe fact: the filled prompt, its answer and where it came from (for grouping on the edit card)."""

    prompt: str
    answer: str
    subject: str = ""
    relation: str = ""  # the dataset's relation id, else the prompt template ("{} is a citizen of")
    source: str = ""  # "dataset:case_id"


@dataclass
class KnownSet:
    """The chosen facts, their log-probs (sum over answer tokens) on the unedited model, and the scan's counts."""

    facts: list[Fact]
    logprobs: list[float]
    scanned: int
    pool: int
    fingerprint: str = ""  # the weights the set was chosen (and its log-probs scored) on


def set_key(fingerprint: str, rule: str) -> str:
    """The cache key of the set a pool's ``rule`` chooses on the weights ``fingerprint``."""
    return hashlib.blake2b(f"{fingerprint}|{rule}".encode(), digest_size=10).hexdigest()


def shipped_set(key: str) -> dict | None:
    """The set shipped with editscope under ``key`` (the same JSON as a cache file), or None."""
    res = resources.files("editscope") / "suites" / "known_sets" / f"{key}.json"
    return json.loads(res.read_text()) if res.is_file() else None


def choose_known(engine: Scorer, pool: Sequence[Fact] | Callable[[], Sequence[Fact]], n: int, rule: str, *,
                 who: str, progress: Callable[[int, int, int], None] | None = None) -> KnownSet:
    """The first ``n`` facts of ``pool`` the model answers top-1 (cached; see the module docstring). ``pool`` may be a
    callable, called only when the cache misses; ``who`` names the caller in errors; ``progress(scanned, pool,
    found)`` is called after each chunk and every few seconds inside one. The set belongs to the unedited model:
    cached under its fingerprint, it is read back while patches are applied (a run that took its pre-edit probes
    from elsewhere first asks after an edit), but a set not chosen yet is refused then."""
    key = set_key(engine.base_fingerprint, rule)
    path = home() / "known_facts" / f"{key}.json"
    cached = read_json(path) or shipped_set(key)
    if cached is None and engine.fingerprint != engine.base_fingerprint:
        raise EditscopeError(f"{who}: the known-fact probe set must be chosen on the unedited model, but "
                             "patches are applied")
    if cached is None:
        facts = list(pool() if callable(pool) else pool)
        known: list[tuple[Fact, float]] = []
        scanned = 0
        shown = time.monotonic()

        def within(done: int) -> None:  # inside a chunk: every few seconds, so a long chunk is not silent
            nonlocal shown
            if time.monotonic() - shown >= PROGRESS_EVERY:
                shown = time.monotonic()
                progress(scanned + done, len(facts), min(len(known), n))

        while scanned < len(facts) and len(known) < n:
            chunk = facts[scanned:scanned + CHUNK]
            scores = engine.score([(f.prompt, f.answer) for f in chunk],
                                  progress=within if progress is not None else None)
            known += [(f, s.sum) for f, s in zip(chunk, scores, strict=True) if all(s.token_is_argmax)]
            scanned += len(chunk)
            if progress is not None:
                shown = time.monotonic()
                progress(scanned, len(facts), min(len(known), n))
        known = known[:n]
        cached = {"rule": rule, "facts": [[f.prompt, f.answer] for f, _ in known],
                  "meta": [[f.subject, f.relation, f.source, lp] for f, lp in known],
                  "pool": len(facts), "known_in_pool": len(known), "scanned": scanned}
        write_json_atomic(path, cached)
    meta = cached.get("meta") or [["", "", "", float("nan")] for _ in cached["facts"]]
    return KnownSet([Fact(p, a, *m[:3]) for (p, a), m in zip(cached["facts"], meta, strict=True)],
                    [float(m[3]) for m in meta], int(cached.get("scanned", cached.get("pool", 0))),
                    int(cached.get("pool", 0)), engine.base_fingerprint)


@dataclass(frozen=True)
class FactPool:
    """The candidate facts of a known-fact set (the module docstring's pool) and the set chosen from them."""

    sources: tuple[str, ...]
    tail: int | None = None  # the last ``tail`` records of each source (None: all of them)

    def __post_init__(self) -> None:
        if isinstance(self.sources, str) or not self.sources:
            raise EditscopeError(f"fact pool: sources must be a non-empty list of datasets, not {self.sources!r}")
        object.__setattr__(self, "sources", tuple(self.sources))

    def facts(self) -> list[Fact]:
        """Every candidate, in source order then record order."""
        from editscope.data import load_cases  # data loading only when a cache misses

        loaded = [(source, load_cases(source)) for source in self.sources]
        seen = Counter(r.text for _, cases in loaded for c in cases for r in c.requests)
        return [Fact(c.request.text, c.request.target_true, c.request.subject, relation_of(c), f"{source}:{c.case_id}")
                for source, cases in loaded for c in (cases if self.tail is None else cases[-self.tail:])
                if c.request.target_true and seen[c.request.text] == 1]

    def rule(self, engine: Scorer, n: int) -> str:
        """Everything the set of ``n`` depends on besides the weights (chat-wrapped prompts: another set)."""
        fmt = engine.prompt_format
        parts: list = [list(self.sources), self.tail, n, "top1-true", "unique-text"]
        return json.dumps(parts + [fmt] if fmt else parts)

    def known(self, engine: Scorer, n: int, *, who: str,
              progress: Callable[[int, int, int], None] | None = None) -> KnownSet:
        """The first ``n`` facts of the pool the unedited model answers top-1 (:func:`choose_known`, cached)."""
        return choose_known(engine, self.facts, n, self.rule(engine, n), who=who, progress=progress)


def relation_of(case: Any) -> str:
    """A case's relation: its dataset's relation id where it has one (PEAK), else its prompt template."""
    return str(case.extra.get("relation_id") or case.request.prompt)


__all__ = ["CHUNK", "Fact", "FactPool", "KnownSet", "choose_known", "relation_of"]
