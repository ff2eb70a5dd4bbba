"""What suites need from a model: the :class:`Scorer` protocol and its request/result types.

Like lm-evaluation-harness's ``LM`` interface (``loglikelihood``, ``generate_until``), suites depend on this
protocol, never on how the scores are computed; :class:`editscope.lm.engine.ScoringEngine` implements it.
Editor-only helpers (context templates, subject positions) live in :mod:`editscope.edit.context`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # the protocol names tensors; importing it (as every suite does) must not load torch
    import torch


@dataclass(frozen=True)
class ScoreRequest:
    """Score ``continuation`` after ``context``; ``context_embeds`` ([n_ctx_tokens, d]) replaces the
    embeddings of the context's tokens when given."""

    context: str
    continuation: str
    context_embeds: torch.Tensor | None = None


@dataclass
class ContinuationScore:
    """Log-probs of one continuation's tokens (natural log)."""

    context: str
    continuation: str
    token_ids: list[int]
    token_logprobs: np.ndarray
    token_is_argmax: np.ndarray
    #: the argmax token id at each continuation position (teacher-forced), where the scorer provides it
    token_argmax: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sum(self) -> float:
        return float(self.token_logprobs.sum())

    @property
    def mean(self) -> float:
        return float(self.token_logprobs.mean())

    def to_dict(self) -> dict:
        return {
            "continuation": self.continuation,
            "n_tokens": self.n_tokens,
            "logprob_sum": self.sum,
            "token_logprobs": [float(x) for x in self.token_logprobs],
            "token_is_argmax": [bool(x) for x in self.token_is_argmax],
        }


@runtime_checkable
class Scorer(Protocol):
    """Batched scoring of one model. Log-probs are natural logs; an empty context ("") is scored from the
    model's start token (BOS, else EOS), so ``score([("", text)])`` is the unconditional log-prob of ``text``."""

    @property
    def n_layers(self) -> int:
        """Number of transformer blocks (``hidden_states`` layers are 0..n_layers-1)."""
        ...

    @property
    def fingerprint(self) -> str:
        """Fingerprint of the weights scored, as they are now (it changes with every applied patch): what caches
        of scores key on."""
        ...

    @property
    def base_fingerprint(self) -> str:
        """Fingerprint of the weights as loaded (equal to :attr:`fingerprint` while no patch is applied)."""
        ...

    @property
    def prompt_format(self) -> dict[str, str] | None:
        """How prompts are shown to the model when not as plain text (a chat template: recorded with the numbers,
        and part of what a cache of scored prompts keys on), else None."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the model sees it (a prompt: with a chat template, the start of a user turn)."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a document (not a prompt), never wrapped in a chat template."""
        ...

    def embed(self, text_or_ids: str | Sequence[int]) -> torch.Tensor:
        """Input embeddings [n_tokens, d] of a text or token ids (EVK perturbs them, paper 004 eq 4)."""
        ...

    def score(self, requests: Sequence[ScoreRequest | tuple[str, str]], *,
              progress: Callable[[int], None] | None = None) -> list[ContinuationScore]:
        """Log-probs of each continuation given its context, in request order; ``progress(done)`` after each
        batched forward, with the number of requests scored so far."""
        ...

    def next_token_logprobs(self, contexts: Sequence[str], *, top_k: int | None = None,
                            context_embeds: Sequence[torch.Tensor | None] | None = None):
        """Next-token log-probs after each context: [B, V], or (values, indices) [B, k] with ``top_k``."""
        ...

    def hidden_states(self, contexts: Sequence[str], layers: Sequence[int], *, kind: str = "resid_post",
                      positions: Sequence[int] | None = None,
                      context_embeds: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """States [B, n_layers, dim] at one token position per context (default: the last token)."""
        ...

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int = 20, top_k: int | None = None,
                 seed: int | None = None) -> list[str]:
        """Greedy, or seeded top-k sampled, continuations of each prompt."""
        ...

    def answer(self, prompts: Sequence[str], *, max_new_tokens: int = 50,
               stop: Sequence[str] = (".", "\n"), blank_start: str = "stop", full_stop: str = "any") -> list[str]:
        """Greedy answers, each ended at EOS, ``max_new_tokens`` or its first stop string (evaluation in the
        wild): the text before that stop string, whitespace stripped (``blank_start``: where the stop strings start
        counting, ``stop`` / ``skip`` / ``lead_in``; ``full_stop``: every "." ends it, ``any``, or one that ends a
        sentence, ``sentence``)."""
        ...
