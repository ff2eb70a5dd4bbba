"""IKE: in-context knowledge editing (Zheng et al., "Can We Edit Factual Knowledge by In-Context Learning?", EMNLP
2023, §3).

Before the prompt go ``k`` demonstrations built from training records (CounterFact's train split), then the new
fact. Each demonstration states a training record's new fact and answers one probe of it (§3.2):

- *copy*: the fact's own prompt, answered with its new target;
- *update*: a paraphrase of it, answered with the new target;
- *retain*: a neighbourhood prompt (another subject, same relation), answered with its unchanged answer.

The records are the ``k`` nearest to the edit's facts (the paper: k-NN by sentence embeddings; here BM25 over the
training facts, :mod:`editscope.edit.retrievers`, since no embedding model can be fetched), ordered so the nearest
stands last, next to the new fact; their types cycle through ``mix`` (copy : update : retain, the paper's 1 : 3 : 4)
by rank. Layout as EasyEdit's IKE: ``"New Fact: {fact}\\nPrompt: {probe} {answer}\\n\\n"`` per demonstration, then
``"New Fact: {fact}\\nPrompt: {prompt}"``. In ``sequential`` use every fact stated so far follows the demonstrations
chosen for the newest edit."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from editscope.data.records import Case, EditRequest
from editscope.edit.context_edit import ContextEdit, ContextHParams, ContextStore, context_edit, fact_text
from editscope.edit.retrievers import BM25
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle

TYPES = ("copy", "update", "retain")


@dataclass
class IkeHParams(ContextHParams):
    """``k`` demonstrations from the dataset ``pool``, their types cycling through ``mix`` (copy, update, retain
    counts per cycle); no instruction line (IKE's layout has none)."""

    method = "ike"
    instruction: str = ""
    k: int = 32
    mix: list[int] = field(default_factory=lambda: [1, 3, 4])
    pool: str = "counterfact-train"

    RANGES: ClassVar[dict[str, str]] = {"k": "[0, 1024]"}
    TUNABLE: ClassVar[dict[str, tuple]] = {"k": (8, 16, 32)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        if len(self.mix) != 3 or any(m < 0 for m in self.mix) or not sum(self.mix):
            raise EditscopeError(f"{where}: key 'mix': three counts (copy, update, retain), not all 0, got {self.mix}")


def demonstration(case: Case, kind: str) -> str | None:
    """One demonstration of ``case`` (None when the record has no probe of that kind)."""
    request = case.requests[0]
    if kind == "copy":
        probe, answer = request.text, request.target_new
    elif kind == "update":
        if not case.paraphrase_prompts:
            return None
        probe, answer = case.paraphrase_prompts[0], request.target_new
    else:
        if not case.neighborhood:
            return None
        probe, answer = case.neighborhood[0]
    return f"New Fact: {fact_text(request)}\nPrompt: {probe.rstrip()} {answer.strip()}\n\n"


@functools.lru_cache(maxsize=4)
def _pool(name: str) -> tuple[tuple[Case, ...], BM25]:
    """The demonstration records of dataset ``name`` (those with a paraphrase and a neighbour) and their index."""
    from editscope.data import load_cases

    cases = tuple(c for c in load_cases(name) if len(c.requests) == 1 and c.paraphrase_prompts and c.neighborhood)
    return cases, BM25([fact_text(c.requests[0]) for c in cases])


def choose(requests: Sequence[EditRequest], hp: IkeHParams) -> tuple[str, ...]:
    """The ``k`` demonstrations for an edit of ``requests``, nearest last (see the module docstring)."""
    if hp.k == 0:
        return ()
    cases, index = _pool(hp.pool)
    if hp.k > len(cases):
        raise EditscopeError(f"ike: k = {hp.k} demonstrations asked, the pool {hp.pool} holds {len(cases)} usable "
                             "records (lower k or use a larger pool)")
    cycle = [kind for kind, n in zip(TYPES, hp.mix, strict=True) for _ in range(n)]
    # a pool record asking what an edited request asks is the test case itself (a pool holding the evaluated
    # records): never a demonstration of its own edit
    asked = {r.text for r in requests}
    ranked = [i for i in index.top_k(" ".join(fact_text(r) for r in requests), hp.k + len(asked))
              if cases[i].requests[0].text not in asked][:hp.k]
    demos = [demonstration(cases[i], cycle[j % len(cycle)]) for j, i in enumerate(ranked)]
    return tuple(d for d in reversed(demos) if d is not None)


def edit_of(bundle: Bundle, requests: Sequence[EditRequest], hp: IkeHParams, store: ContextStore) -> ContextEdit:
    return context_edit("ike", bundle, requests, hp, store)


def compute(bundle: Bundle, requests: list[EditRequest], hp: IkeHParams, state: ContextStore, **_: object
            ) -> tuple[ContextEdit, dict]:
    demos = choose(requests, hp)
    state.add([fact_text(r) for r in requests])
    state.demos = demos
    return edit_of(bundle, requests, hp, state), {"facts_stated": len(state.facts), "demonstrations": len(demos)}
