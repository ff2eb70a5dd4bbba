"""The token view of a (prompt, subject, answer) that every locating method shares."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine


@dataclass(frozen=True)
class LocatePrompt:
    """``text`` = the template with the subject filled in; ``ids`` its tokens as the engine encodes the context;
    ``subject_span`` [start, end) of the subject's tokens (None without a subject); ``answer_id`` the first token
    of the answer after the prompt (rule 2 boundary), or the model's greedy next token when no answer is given
    (KLoB-u sentences have none); ``answer`` the answer text scored."""

    text: str
    ids: tuple[int, ...]
    subject_span: tuple[int, int] | None
    answer_id: int
    answer: str

    @property
    def last(self) -> int:
        """Index of the last prompt token (where the answer is predicted)."""
        return len(self.ids) - 1


def subject_span(engine: ScoringEngine, template: str, subject: str) -> tuple[int, int]:
    """[start, end) token indices of ``subject`` inside ``template`` filled with it.

    The end is one past the subject's last token (as ROME's ``find_token_range``: the tokens of the text up to
    the subject's end); the start is the token count of the text before the subject with trailing spaces
    dropped, since BPE tokenizers glue the space to the subject's first token.
    """
    if template.count("{}") != 1:
        raise EditscopeError(f"prompt template must contain exactly one '{{}}': {template!r}")
    head = template[: template.index("{}")]
    end = len(engine.encode(head + subject))
    start = len(engine.encode(head.rstrip())) if head.strip() else len(engine.encode(""))
    if not 0 <= start < end:
        raise EditscopeError(f"subject {subject!r} has no tokens of its own in {template.replace('{}', subject)!r}")
    return start, end


def encode_prompt(engine: ScoringEngine, template: str, subject: str | None, answer: str | None) -> LocatePrompt:
    """Encode a locating query. ``template`` holds one ``{}`` for ``subject`` (or no slot when ``subject`` is
    None); ``answer`` None means: score the model's own greedy next token."""
    if subject is None:
        text, span = template, None
    else:
        span = subject_span(engine, template, subject)
        text = template.replace("{}", subject)
    if answer is None:
        ids = engine.context_ids(text)
        answer_id = int(engine.next_token_logprobs([text])[0].argmax())
        answer = engine.tokenizer.decode([answer_id])
    else:
        ids, cont = engine.encode_pair(text, answer)
        answer_id = int(cont[0])
    if span is not None and span[1] > len(ids):
        raise EditscopeError(f"subject {subject!r} runs past the prompt {text!r}")
    return LocatePrompt(text, tuple(int(i) for i in ids), span, answer_id, answer)


def answer_prob(engine: ScoringEngine, ids: torch.Tensor, answer_id: int) -> torch.Tensor:
    """P(answer token | prompt) for each row of ``ids`` [B, L] (same length, no padding), differentiable;
    hooks installed by the caller apply. Reads the LM head at the last position only."""
    base = engine.model.get_submodule(engine.arch.base)
    hidden = base(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
    return engine.logits_from_hidden(hidden).float().softmax(-1)[:, answer_id]
