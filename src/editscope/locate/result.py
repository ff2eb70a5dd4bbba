"""One result format for every knowledge-locating method (paper 001 §3.4: "a score per parameter or neuron")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: kinds of per-(layer, token) maps a method may define (ROME's causal-tracing panels)
STATE_KINDS = ("residual", "mlp", "attn")


@dataclass
class LocateResult:
    """Where one method locates the knowledge behind ``prompt`` -> ``answer``.

    - ``neurons``: a score per MLP neuron, [layers, mlp] (the key activations k of each block's MLP down
      projection); higher = more responsible. Every method defines it: it is what KLoB compares.
    - ``states``: per-(layer, token) maps [layers, tokens] for kinds in :data:`STATE_KINDS`, where the method
      defines them (causal tracing: the probability of the answer with that state restored).
    - ``tokens``: the prompt's tokens as text; ``subject_span``: [start, end) of the subject's tokens (None
      when the prompt has no subject, e.g. KLoB-u); ``answer_token``: the token id scored.
    - ``meta``: method options and scalars (clean/corrupted probability, noise level, steps, seed...).
    """

    method: str
    prompt: str
    answer: str
    neurons: np.ndarray
    states: dict[str, np.ndarray] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    subject_span: tuple[int, int] | None = None
    answer_token: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.neurons.shape[0])

    def layer_scores(self) -> np.ndarray:
        """One score per layer: the sum of its neuron scores (for 'top layers')."""
        return self.neurons.sum(axis=1)

    def top_neurons(self, n: int = 10) -> list[tuple[int, int, float]]:
        """The ``n`` highest-scoring neurons as (layer, neuron, score)."""
        flat = self.neurons.ravel()
        order = np.argsort(-flat, kind="stable")[:n]
        width = self.neurons.shape[1]
        return [(int(i // width), int(i % width), float(flat[i])) for i in order]

    def to_dict(self, *, with_neurons: bool = False) -> dict[str, Any]:
        """JSON-ready view; the [layers, mlp] neuron scores only when asked (they are large)."""
        out: dict[str, Any] = {
            "method": self.method, "prompt": self.prompt, "answer": self.answer, "tokens": self.tokens,
            "subject_span": list(self.subject_span) if self.subject_span else None,
            "answer_token": self.answer_token, "meta": self.meta,
            "states": {k: v.tolist() for k, v in self.states.items()},
            "layer_scores": self.layer_scores().tolist(),
        }
        if with_neurons:
            out["neurons"] = self.neurons.tolist()
        return out
