"""EVK instances: embedding-virtualized knowledge (paper 004, ../shared/papers/004, §3.1.1, eqs 4-8).

A prompt is a template with one ``{}`` slot filled with a subject. Its tokens (eq 4-5: E = [e_1..e_n]) split
into the subject span I_s (tokens overlapping the subject's characters), the relation span I_r (every other
token of the template's words, eq 6) and the whole prompt. A drift Δ ~ N(0, σ²I) (eq 7) is added to the input
embeddings of one span (eq 8: Subject, Relation or All drift); the surface text is unchanged.

Spans come from the model's own tokenization of the filled template (:meth:`Scorer.encode`, the same ids the
engine scores), never from a separate tokenizer. Special tokens a tokenizer puts before every text (Llama's
BOS) belong to no span: they are not words of the prompt, and All drift leaves them alone.

Noise is drawn from a ``torch.Generator`` seeded by :func:`instance_seed` (a hash of a base seed, the case,
the prompt, the drift type, σ and the instance index), so the same case gives the same instances before and
after an edit, in any order, on any process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer

if TYPE_CHECKING:
    import torch

DRIFTS = ("subject", "relation", "all")
"""The drift types of eq 8, in the paper's order."""


@dataclass(frozen=True)
class PromptSpans:
    """Token index sets of one filled prompt (indices into ``ids``)."""

    text: str
    ids: tuple[int, ...]
    subject: tuple[int, ...]
    relation: tuple[int, ...]
    all: tuple[int, ...]

    def span(self, drift: str) -> tuple[int, ...]:
        """I_s, I_r or all prompt tokens for ``drift`` in :data:`DRIFTS`."""
        if drift not in DRIFTS:
            raise EditscopeError(f"drift type must be one of {', '.join(DRIFTS)}, not {drift!r}")
        return {"subject": self.subject, "relation": self.relation, "all": self.all}[drift]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prompt_spans(engine: Scorer, template: str, subject: str) -> PromptSpans:
    """Subject / relation / all token spans of ``template`` filled with ``subject`` (paper 004, eq 6).

    The subject starts after the tokens of the text before the slot (trailing whitespace removed: byte-level
    BPE and SentencePiece both attach the space to the next word) and ends with the last token of the text up
    to the subject's end (ROME's ``subject_last`` rule). A token that merges text on both sides of a subject
    boundary counts as a subject token. The relation is every other non-special token.
    """
    if template.count("{}") != 1:
        raise EditscopeError(f"prompt template must contain exactly one '{{}}': {template!r}")
    if not subject.strip():
        raise EditscopeError(f"empty subject for template {template!r}")
    text = template.replace("{}", subject)
    ids = engine.encode(text)
    n_special = len(engine.encode(""))  # tokens every encoding starts with (BOS), part of no span
    before = template[: template.index("{}")].rstrip()
    head_ids = engine.encode(before) if before else engine.encode("")
    start = max(_common_prefix(ids, head_ids), n_special)
    upto = engine.encode(template[: template.index("{}")] + subject)
    shared = _common_prefix(ids, upto)
    end = shared if shared == len(upto) else shared + 1  # a token straddling the subject's end is a subject token
    end = min(end, len(ids))
    if end <= start:
        raise EditscopeError(f"subject {subject!r} has no token inside {text!r}")
    subject_span = tuple(range(start, end))
    everything = tuple(range(n_special, len(ids)))
    relation = tuple(i for i in everything if i not in subject_span)
    return PromptSpans(text, tuple(ids), subject_span, relation, everything)


def instance_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from a base seed and identifying parts (case id, prompt, drift, σ, index): stable across
    processes (no Python ``hash``)."""
    key = repr((int(seed), *parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def drift_embeddings(embeds: torch.Tensor, span: Sequence[int], sigma: float, generator: torch.Generator
                     ) -> torch.Tensor:
    """Ẽ (eq 8): a copy of ``embeds`` [n, d] with Δ ~ N(0, σ²I) (eq 7) added to the rows in ``span`` only."""
    import torch  # here: the evk suite imports this module, and the summary and the report import every suite

    if sigma < 0:
        raise EditscopeError(f"drift strength sigma must be >= 0, got {sigma}")
    out = embeds.detach().clone()
    rows = torch.tensor(list(span), dtype=torch.long)
    if len(rows) == 0 or sigma == 0:
        return out
    noise = torch.randn((len(rows), embeds.shape[1]), generator=generator, dtype=torch.float32) * sigma
    out[rows] = out[rows] + noise.to(out)  # host generator's noise, on the embeddings' device
    return out


@dataclass(frozen=True)
class EvkInstance:
    """One EVK instance: the prompt, its drift type, σ, index and the perturbed embeddings [n_tokens, d]."""

    text: str
    drift: str
    sigma: float
    index: int
    embeds: torch.Tensor


def evk_instances(engine: Scorer, template: str, subject: str, *, sigma: float, n: int,
                  drifts: Sequence[str] = DRIFTS, seed: int = 0, key: object = "") -> list[EvkInstance]:
    """``n`` EVK instances per drift type of one prompt (paper 004, eqs 4-8), seeded by
    (``seed``, ``key``, prompt, drift, σ, index): ``key`` names the case so different cases draw different noise."""
    import torch  # as in drift_embeddings

    if n < 0:
        raise EditscopeError(f"number of EVK instances must be >= 0, got {n}")
    spans = prompt_spans(engine, template, subject)
    clean = engine.embed(list(spans.ids))
    out = []
    for drift in drifts:
        span = spans.span(drift)
        for i in range(n):
            gen = torch.Generator().manual_seed(instance_seed(seed, key, spans.text, drift, float(sigma), i))
            out.append(EvkInstance(spans.text, drift, float(sigma), i, drift_embeddings(clean, span, sigma, gen)))
    return out


__all__ = ["DRIFTS", "EvkInstance", "PromptSpans", "drift_embeddings", "evk_instances", "instance_seed",
           "prompt_spans"]
