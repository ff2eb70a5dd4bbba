"""Greedy decoding of many prompts at once, each row leaving the batch as soon as it has ended.

``model.generate`` keeps every row of a batch until the last one stops: a row whose answer ended after two tokens is
still computed (as padding) for as many steps as the longest answer takes. In the wild protocol most answers end
within a few tokens and a few run to ``max_new_tokens``, so most of that work is wasted. Here the rows that ended
(EOS, a stop string in their new text, or ``max_new_tokens``) are dropped from the batch and from the key/value
cache (``Cache.batch_select_indices``) after every step, so each step computes only the rows still speaking.

The result is the plain greedy loop's, row by row (left padding with its attention mask and position ids, the
argmax of the last position's logits), which ``tests/lm/test_answer.py`` checks against one prompt at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache

from editscope.lm.stops import answer_start, first_stop

#: ``step(ids [B, T], attention_mask [B, past + T], position_ids [B, T], cache)`` -> logits of the last position
#: [B, V]; fills ``cache`` with the new keys/values.
Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache], torch.Tensor]


def greedy_rows(step: Step, ids: torch.Tensor, mask: torch.Tensor, *, max_new_tokens: int,
                ended: Callable[[list[int]], bool], eos_ids: frozenset[int],
                on_select: Callable[[torch.Tensor], None] | None = None,
                cache: DynamicCache | None = None) -> list[list[int]]:
    """New token ids of each left-padded row of ``ids`` (``mask`` 1 on real tokens), greedily decoded: a row ends
    at an EOS id (not kept), when ``ended(its new ids)`` is true (the token that ended it kept), or after
    ``max_new_tokens`` tokens. ``on_select`` is told the batch rows kept whenever rows leave (a module memory's
    per-row choice follows them). ``cache`` may already hold the keys/values of a prefix every row opens with (one
    copy per row); ``mask`` then covers the prefix too."""
    cache = DynamicCache() if cache is None else cache  # full (non-sliding) layers: the mask sets any window
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, mask.shape[1] - ids.shape[1]:]
    logits = step(ids, mask, positions, cache)
    out: list[list[int]] = [[] for _ in range(ids.shape[0])]
    alive = list(range(ids.shape[0]))  # the original row of each batch row
    for n in range(max_new_tokens):
        tokens = logits.argmax(-1)
        keep = []
        for b, token in enumerate(tokens.tolist()):
            row = alive[b]
            if token in eos_ids:
                continue
            out[row].append(token)
            if not ended(out[row]):
                keep.append(b)
        if not keep or n + 1 == max_new_tokens:
            break
        if len(keep) < len(alive):
            index = torch.tensor(keep, device=ids.device)
            cache.batch_select_indices(index)
            if on_select is not None:
                on_select(index)
            tokens, mask = tokens[index], mask[index]
            alive = [alive[b] for b in keep]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        logits = step(tokens[:, None], mask, mask.sum(-1, keepdim=True) - 1, cache)
    return out


def stop_check(decode: Callable[[Sequence[int]], str], stop: Sequence[str], *, blank_start: str = "stop",
               full_stop: str = "any") -> Callable[[list[int]], bool]:
    """``ended`` for :func:`greedy_rows`: true once the decoded new text, from its :func:`answer_start` on, ends by
    :func:`first_stop` (a newline before the answer, or after a lead-in, does not end it unless ``blank_start`` is
    ``stop``)."""
    if not stop:
        return lambda new: False

    def ended(new: list[int]) -> bool:
        text = decode(new)
        return first_stop(text[answer_start(text, blank_start):], stop, full_stop=full_stop, final=False) is not None

    return ended


__all__ = ["Step", "greedy_rows", "stop_check"]
