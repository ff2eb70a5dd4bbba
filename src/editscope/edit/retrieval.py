"""Retrieval: a lifelong edit memory of stated facts; before each prompt, the ``k`` stored facts an offline retriever
ranks first for it (the retrieval-augmented baseline of WikiBigEdit, Thede et al. ICML 2025, §4).

Every edit's facts go into the store (the sequential state, :class:`~editscope.edit.context_edit.ContextStore`); the
retriever is ``bm25`` (Okapi BM25 over the stored facts, default) or ``hidden`` (cosine of the model's own mean-pooled
final hidden states), both on CPU without a hub (:mod:`editscope.edit.retrievers`); which one is recorded with the
hparams in every row. The retrieved facts go before the prompt in EasyEdit's PROMPT layout, the best nearest the
prompt. While the store holds fewer than ``k`` facts, all of them are stated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from editscope.data.records import EditRequest
from editscope.edit.context_edit import ContextEdit, ContextHParams, ContextStore, context_edit, fact_text
from editscope.edit.retrievers import check_retriever, mean_hidden
from editscope.lm.bundle import Bundle


@dataclass
class RetrievalHParams(ContextHParams):
    """``k``: facts retrieved per prompt; ``retriever``: ``bm25`` or ``hidden``."""

    method = "retrieval"
    k: int = 1
    retriever: str = "bm25"

    RANGES: ClassVar[dict[str, str]] = {"k": "[1, 1024]"}
    TUNABLE: ClassVar[dict[str, tuple]] = {"k": (1, 2, 4)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        check_retriever(self.retriever, where)


def edit_of(bundle: Bundle, requests: Sequence[EditRequest], hp: RetrievalHParams, store: ContextStore
            ) -> ContextEdit:
    """The edit retrieving from every fact ``store`` holds."""
    return context_edit("retrieval", bundle, requests, hp, store, top_k=hp.k, retriever=hp.retriever,
                        embeddings=store.embeddings if hp.retriever == "hidden" else None)


def compute(bundle: Bundle, requests: list[EditRequest], hp: RetrievalHParams, state: ContextStore, **_: object
            ) -> tuple[ContextEdit, dict]:
    facts = [fact_text(r) for r in requests]
    state.add(facts, mean_hidden(bundle, facts) if hp.retriever == "hidden" else None)
    return edit_of(bundle, requests, hp, state), {"facts_stored": len(state.facts)}
