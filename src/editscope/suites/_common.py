"""Shared pieces of the suites: candidate records, one-call batching of many cases, answer surfaces, JSON caches.

Every suite builds a *plan* per case (the list of ``(context, continuation)`` pairs it needs plus where each
lands in the probe), submits the plans of all cases in one :meth:`Scorer.score` call, and fills the
probes from the scores (:func:`score_plans`). The reference corpus is :class:`editscope.data.corpus.Corpus`;
no state is global.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.finite import strict_dumps
from editscope.lm.scorer import ContinuationScore, Scorer


@dataclass
class Slot:
    """Where one scored pair goes: ``probe["prompts"][prompt_index]["candidates"]`` gets a candidate."""

    prompt_index: int
    text: str
    kind: str


@dataclass
class Plan:
    """The scoring requests of one case: prompts (``prompt``/``role``) and one slot per request."""

    prompts: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)

    def add_prompt(self, prompt: str, role: str, candidates: Sequence[tuple[str, str]]) -> None:
        """A prompt with its candidates ``[(answer_text, kind), ...]``."""
        index = len(self.prompts)
        self.prompts.append({"prompt": prompt, "role": role, "candidates": []})
        for text, kind in candidates:
            self.pairs.append((prompt, text))
            self.slots.append(Slot(index, text, kind))


def candidate(score: ContinuationScore, text: str, kind: str) -> dict[str, Any]:
    """A scored candidate in the raw-score convention of :mod:`editscope.suites.base` (with token lists)."""
    return {
        "text": text,
        "kind": kind,
        "logprob_sum": score.sum,
        "n_tokens": score.n_tokens,
        "token_logprobs": [float(x) for x in score.token_logprobs],
        "token_is_argmax": [bool(x) for x in score.token_is_argmax],
    }


def score_plans(engine: Scorer, plans: Sequence[Plan]) -> list[dict[str, Any]]:
    """Score the pairs of all plans in ONE engine call and return one ``{"prompts": [...]}`` probe per plan."""
    pairs = [pair for plan in plans for pair in plan.pairs]
    scores = engine.score(pairs) if pairs else []
    probes, start = [], 0
    for plan in plans:
        prompts = [{"prompt": p["prompt"], "role": p["role"], "candidates": []} for p in plan.prompts]
        for slot, score in zip(plan.slots, scores[start:start + len(plan.slots)], strict=True):
            prompts[slot.prompt_index]["candidates"].append(candidate(score, slot.text, slot.kind))
        start += len(plan.slots)
        probes.append({"prompts": prompts})
    return probes


def nll(cand: dict[str, Any]) -> float:
    """Mean per-token negative log-likelihood of a candidate (ROME/MEMIT's per-prompt statistic)."""
    return -float(cand["logprob_sum"]) / int(cand["n_tokens"])


def by_kind(prompt: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The candidates of one prompt with the given ``kind``, in probe order."""
    return [c for c in prompt["candidates"] if c.get("kind") == kind]


def one(prompt: dict[str, Any], kind: str) -> dict[str, Any]:
    """The single candidate of ``kind`` on a prompt (a malformed probe raises)."""
    found = by_kind(prompt, kind)
    if len(found) != 1:
        raise EditscopeError(f"probe prompt {prompt.get('prompt')!r}: expected one {kind!r} candidate, "
                             f"found {len(found)}")
    return found[0]


def prompts_with_role(probe: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """The prompts of a probe with the given role, in probe order."""
    return [p for p in probe["prompts"] if p["role"] == role]


def dedupe(answers: Sequence[str], exclude: Sequence[str] = ()) -> list[str]:
    """``answers`` without repeats and without any string in ``exclude`` (exact match), order kept."""
    seen = set(exclude)
    out = []
    for a in answers:
        if a not in seen:
            seen.add(a)
            out.append(a)
    return out


# --------------------------------------------------------------------------------------- corpus answers


_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")


def surface(answer: str) -> str:
    """The text to look for in a corpus: a Wikidata-style trailing qualifier is dropped
    (``"Georgia (country)"`` -> ``"Georgia"``); the rest is kept as is."""
    stripped = _QUALIFIER.sub("", answer).strip()
    return stripped or answer.strip()


def read_json(path: Path) -> Any:
    """JSON content of ``path``, or None when missing or unreadable (a broken cache is recomputed)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON atomically (:func:`editscope.atomic.atomic_write_text`: readers never see half a file)."""
    atomic_write_text(path, strict_dumps(obj, str(path)))


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean as a Python float."""
    return float(np.mean(values))
