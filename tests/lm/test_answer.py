"""The wild protocol's answers (``engine.answer``): batched, left-padded greedy decoding with per-row stops equals a
plain one-prompt-at-a-time greedy loop, for stop strings, EOS and ``max_new_tokens``."""

from __future__ import annotations

import re

import pytest
import torch

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine, cut_at_stop

PROMPTS = ["The capital of France is", "Danielle Darrieux is a citizen of", "Q: Who wrote Hamlet?\nA:",
           "The Eiffel Tower is located in the city of"]


def greedy_loop(bundle, engine: ScoringEngine, prompt: str, max_new: int, stop: tuple[str, ...]) -> str:
    """One prompt, no padding, no cache: argmax token after token until EOS, max_new tokens, or a stop string in
    the new text; the text before the first stop string."""
    ids = list(engine.context_ids(prompt))
    eos = bundle.tokenizer.eos_token_id
    new: list[int] = []
    text = ""
    for _ in range(max_new):
        with torch.no_grad():
            logits = bundle.model(torch.tensor([ids + new])).logits[0, -1]
        token = int(logits.argmax())
        if token == eos:
            break
        new.append(token)
        text = bundle.tokenizer.decode(new, skip_special_tokens=True)
        if any(s in text for s in stop):
            break
    if stop:
        text = re.split("|".join(re.escape(s) for s in stop), text, maxsplit=1)[0]
    return text.strip()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_answers_equal_a_plain_greedy_loop(tiny_bundles, family):
    bundle = tiny_bundles[family]
    engine = ScoringEngine(bundle, token_budget=64)  # 64 tokens: the prompts go in several batches
    free = [greedy_loop(bundle, engine, p, 12, ()) for p in PROMPTS]
    assert engine.answer(PROMPTS, max_new_tokens=12, stop=()) == free
    assert all(len(engine.tokenizer(a)["input_ids"]) >= 6 for a in free)  # random weights: no early EOS here
    # stop strings that occur part-way into some answers (a random model's own words), so rows stop one by one
    # inside a batch while the others go on
    stop = tuple(dict.fromkeys(a.split()[2] for a in free[:2]))
    expected = [greedy_loop(bundle, engine, p, 12, stop) for p in PROMPTS]
    assert engine.answer(PROMPTS, max_new_tokens=12, stop=stop) == expected
    assert any(len(e) < len(f) for e, f in zip(expected, free, strict=True))
    assert engine.answer(PROMPTS[:1], max_new_tokens=3, stop=()) == [greedy_loop(bundle, engine, PROMPTS[0], 3, ())]


def test_answer_stops_at_eos(tiny_bundles):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    ids = list(engine.context_ids(PROMPTS[0]))
    with torch.no_grad():
        first = int(bundle.model(torch.tensor([ids])).logits[0, -1].argmax())
    with torch.no_grad():
        second = int(bundle.model(torch.tensor([ids + [first]])).logits[0, -1].argmax())
    saved = bundle.model.generation_config.eos_token_id
    bundle.model.generation_config.eos_token_id = second  # the answer's second token now ends it
    try:
        engine = ScoringEngine(bundle)
        assert engine.answer(PROMPTS, max_new_tokens=8, stop=())[0] == engine.tokenizer.decode([first]).strip()
    finally:
        bundle.model.generation_config.eos_token_id = saved


def test_cut_at_stop_and_bad_settings(tiny_bundles):
    assert cut_at_stop(" Paris. It is big\nyes", (".", "\n")) == "Paris"
    assert cut_at_stop("Tokyo\nJapan.", (".", "\n")) == "Tokyo"
    assert cut_at_stop("  no stop here ", (".",)) == "no stop here"
    assert cut_at_stop("\nleading newline", ("\n",)) == ""  # the protocol is strict: an empty answer
    engine = ScoringEngine(tiny_bundles["llama"])
    with pytest.raises(EditscopeError, match="max_new_tokens must be >= 1"):
        engine.answer(PROMPTS, max_new_tokens=0)
    with pytest.raises(EditscopeError, match="empty stop string"):
        engine.answer(PROMPTS, stop=("",))
