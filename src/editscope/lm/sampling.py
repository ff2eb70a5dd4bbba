"""Top-k sampling whose draws do not depend on the device the model runs on.

transformers' sampling draws with ``torch.multinomial`` on the logits' device, so after ``torch.manual_seed(s)`` a
CUDA model draws from CUDA's generator and samples other tokens than the same model on the CPU: other ROME/MEMIT
context templates, other GE continuations, for the same seed. :class:`HostTopK` makes the draw itself on the host,
from a CPU generator of its own, and hands ``generate`` a one-hot score that greedy decoding picks. On the CPU it is
the very computation transformers' top-k sampling does (top-k filter, softmax, one multinomial per step), and a
generator seeded with s draws what torch's default generator draws after ``torch.manual_seed(s)``; the default
(global) generator is never touched, so a probe moves no other draw of a run. On a GPU only a probability that
rounds across a draw's boundary can change a token.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, TopKLogitsWarper


class HostTopK(LogitsProcessor):
    """Keep the ``k`` best tokens, draw one per row from their softmax on the host with ``generator`` (a seeded CPU
    generator), return it as the only finite score (use with greedy decoding)."""

    def __init__(self, k: int, generator: torch.Generator) -> None:
        self.top_k = TopKLogitsWarper(int(k))  # transformers' own filter, so the CPU draws stay its draws
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(self.top_k(input_ids, scores), dim=-1)
        pick = torch.multinomial(probs.cpu(), num_samples=1, generator=self.generator).to(scores.device)
        return torch.full_like(scores, float("-inf")).scatter_(-1, pick, 0.0)
