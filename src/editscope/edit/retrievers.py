"""Offline retrievers for context editors: which stored facts (or demonstrations) to put before a query.

Both run on CPU without a hub and rank a list of texts for a query; ties go to the earlier text, so a ranking is
reproducible.

- ``bm25``: Okapi BM25 (Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework: BM25 and Beyond", eq. 3.5
  with the non-negative idf of Lucene): score(q, d) = Σ_{t ∈ q} idf(t) · f(t,d)·(k1+1) / (f(t,d) + k1·(1 − b +
  b·|d|/avgdl)), idf(t) = ln(1 + (N − n(t) + 0.5)/(n(t) + 0.5)); k1 = 1.5, b = 0.75; words are lower-cased runs of
  letters and digits, each query word counted once per occurrence.
- ``hidden``: the model's own mean-pooled hidden states (the final normed hidden states, averaged over the text's
  tokens), ranked by cosine similarity; texts are embedded raw, outside any context edit.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from editscope.errors import EditscopeError

RETRIEVERS: tuple[str, ...] = ("bm25", "hidden")
"""The retriever names a context editor's ``retriever`` key accepts."""

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def words(text: str) -> list[str]:
    """BM25's terms: lower-cased runs of letters and digits."""
    return _WORD.findall(text.lower())


def check_retriever(name: str, where: str) -> None:
    if name not in RETRIEVERS:
        raise EditscopeError(f"{where}: key 'retriever': unknown retriever {name!r} (known: {', '.join(RETRIEVERS)})")


@dataclass
class BM25:
    """An inverted index over ``docs`` (built once); :meth:`top_k` ranks them for a query."""

    docs: Sequence[str]
    k1: float = 1.5
    b: float = 0.75
    _postings: dict[str, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
    _lengths: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for i, doc in enumerate(self.docs):
            counts = Counter(words(doc))
            self._lengths.append(sum(counts.values()))
            for term, n in counts.items():
                self._postings.setdefault(term, []).append((i, n))
        self._avgdl = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0

    def idf(self, term: str) -> float:
        n = len(self._postings.get(term, ()))
        return math.log(1.0 + (len(self.docs) - n + 0.5) / (n + 0.5))

    def scores(self, query: str) -> list[float]:
        """BM25 of every doc for ``query`` (0 for a doc sharing no word with it)."""
        out = [0.0] * len(self.docs)
        for term in words(query):
            idf = self.idf(term)
            for i, f in self._postings.get(term, ()):
                norm = self.k1 * (1.0 - self.b + self.b * self._lengths[i] / self._avgdl) if self._avgdl else 0.0
                out[i] += idf * f * (self.k1 + 1.0) / (f + norm)
        return out

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` best docs (fewer when there are fewer), best first; ties to the earlier doc."""
        return rank(self.scores(query), k)


def rank(scores: Sequence[float], k: int) -> list[int]:
    """The positions of the ``k`` highest scores, highest first, an earlier position first among equals."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return order[:k]


class HiddenStates:
    """Cosine ranking of stored embeddings (rows of ``vectors``) against a query embedded by ``embed``."""

    def __init__(self, vectors: torch.Tensor, embed: Callable[[list[str]], torch.Tensor]) -> None:
        self.vectors = torch.nn.functional.normalize(vectors.double(), dim=-1)
        self.embed = embed

    def scores(self, query: str) -> list[float]:
        q = torch.nn.functional.normalize(self.embed([query]).double(), dim=-1)[0]
        return (self.vectors @ q).tolist()

    def top_k(self, query: str, k: int) -> list[int]:
        return rank(self.scores(query), k)


@torch.no_grad()
def mean_hidden(bundle, texts: list[str], batch: int = 32) -> torch.Tensor:
    """[len(texts), hidden] float32: each text's final hidden states (after the last block and the final norm),
    mean-pooled over its tokens; raw text (no context edit, no chat template)."""
    tok, base = bundle.tokenizer, bundle.model.get_submodule(bundle.arch.base)
    out = []
    with bundle.without_context():
        for start in range(0, len(texts), batch):
            chunk = texts[start:start + batch]
            ids = [list(tok(t, add_special_tokens=True)["input_ids"]) or [0] for t in chunk]
            width = max(len(i) for i in ids)
            pad = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
            input_ids = torch.tensor([i + [pad] * (width - len(i)) for i in ids], device=bundle.device)
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device=bundle.device)
            hidden = base(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state.float()
            m = mask[..., None].to(hidden.dtype)
            out.append(((hidden * m).sum(1) / m.sum(1)).cpu())
    return torch.cat(out) if out else torch.zeros(0, bundle.hidden_size)  # host: stored with the facts
