"""Prompts wrapped in the tokenizer's chat template (``ScoringEngine(chat_template=True)``), against a naive
computation: the template rendered by the tokenizer itself, the answer's tokens appended, one plain forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from editscope.edit.context import subject_last_token_index
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.tiny import build_tiny

# A ChatML template with a system turn (as SmolLM2's): the head holds more than the user's role line.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SYSTEM = "<|im_start|>system\nYou answer briefly.<|im_end|>\n"


@pytest.fixture(scope="module")
def chat_bundle():
    bundle = build_tiny("llama", seed=3)  # its own tokenizer object: the shared fixtures stay template-free
    bundle.tokenizer.chat_template = SYSTEM.replace("\n", "\\n").join(["{{ '", "' }}"]) + CHATML
    return bundle


def naive(bundle, prompt: str, answer: str) -> list[float]:
    tok = bundle.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ctx = tok(text, add_special_tokens=False)["input_ids"]
    cont = tok(answer, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lp = bundle.model(torch.tensor([ctx + cont], device=bundle.device)).logits[0].double().log_softmax(-1)
    return [float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)]


def test_rendered_turn_holds_system_and_generation_prompt(chat_bundle):
    engine = ScoringEngine(chat_bundle, chat_template=True)
    assert engine.chat.head == SYSTEM + "<|im_start|>user\n"
    assert engine.chat.tail == "<|im_end|>\n<|im_start|>assistant\n"
    assert engine.prompt_format["chat_template"] == engine.chat.digest
    assert ScoringEngine(chat_bundle).prompt_format is None  # off unless asked for


@pytest.mark.parametrize("side", ["right", "left"])
def test_chat_scores_equal_naive(chat_bundle, side):
    engine = ScoringEngine(chat_bundle, chat_template=True, padding_side=side)
    pairs = [("The capital of France is", "Paris"), ("The capital of France is ", " Paris"),
             ("Hamlet was written by", "William Shakespeare")]
    for (prompt, answer), score in zip(pairs, engine.score(pairs), strict=True):
        ref = naive(chat_bundle, prompt.rstrip(), answer.lstrip())  # the answer opens the assistant turn
        np.testing.assert_allclose(score.token_logprobs, ref, atol=1e-4)
    plain = ScoringEngine(chat_bundle).score(pairs[:1])[0]
    assert abs(plain.sum - engine.score(pairs[:1])[0].sum) > 1e-3  # the template changes the number


def test_empty_context_is_scored_raw(chat_bundle):
    text = "A document, not a prompt."
    chat = ScoringEngine(chat_bundle, chat_template=True).score([("", text)])[0]
    plain = ScoringEngine(chat_bundle).score([("", text)])[0]
    np.testing.assert_allclose(chat.token_logprobs, plain.token_logprobs, atol=1e-6)


def test_subject_position_is_in_the_wrapped_sequence(chat_bundle):
    engine = ScoringEngine(chat_bundle, chat_template=True)
    template, subject = "{} is located in", "The Eiffel Tower"
    index = subject_last_token_index(engine, template, subject)
    tok = chat_bundle.tokenizer
    ids = engine.context_ids(template.format(subject))
    # the subject's last token by hand: tokens of the rendered head + subject, counted in the wrapped row
    assert index == len(tok(engine.chat.head + subject, add_special_tokens=False)["input_ids"]) - 1
    assert tok.decode(ids[index]).strip() == "Tower"
    states = engine.hidden_states([template.format(subject)], [1], kind="resid_post", positions=[index])
    with torch.no_grad():
        ref = chat_bundle.model(torch.tensor([ids], device=chat_bundle.device),
                                output_hidden_states=True).hidden_states[2][0, index]
    torch.testing.assert_close(states[0, 0], ref, atol=1e-4, rtol=1e-4)


def test_context_embeds_get_the_tail(chat_bundle):
    engine = ScoringEngine(chat_bundle, chat_template=True)
    prompt = "The capital of France is"
    embeds = engine.embed(prompt)  # head + prompt: the engine adds the tail
    assert embeds.shape[0] == len(engine.encode(prompt)) < len(engine.context_ids(prompt))
    from editscope.lm.engine import ScoreRequest

    a = engine.score([ScoreRequest(prompt, "Paris", embeds)])[0]
    b = engine.score([(prompt, "Paris")])[0]
    np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=1e-5)


def test_plain_block_switches_the_template_off(chat_bundle):
    engine = ScoringEngine(chat_bundle, chat_template=True)
    with engine.plain():
        assert engine.encode("The") == chat_bundle.tokenizer("The")["input_ids"]
    assert engine.chat is not None


def test_tokenizer_without_template_is_one_line_error(tiny_bundles):
    with pytest.raises(EditscopeError, match="has no chat template") as err:
        ScoringEngine(tiny_bundles["gpt2"], chat_template=True)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_smollm2_template_scores_equal_naive(smollm2):
    """The real instruct template: its <|im_start|>/<|im_end|> are special tokens, its system turn is implicit."""
    engine = ScoringEngine(smollm2, chat_template=True)
    ids = engine.context_ids("The capital of France is")
    assert ids[0] == smollm2.tokenizer.convert_tokens_to_ids("<|im_start|>")  # one special token, not text
    pairs = [("The capital of France is", "Paris"), ("The mother tongue of Danielle Darrieux is", "French")]
    for (prompt, answer), score in zip(pairs, engine.score(pairs), strict=True):
        np.testing.assert_allclose(score.token_logprobs, naive(smollm2, prompt, answer), atol=1e-4)


def test_cli_chat_template_without_template_is_one_line_error(capsys):
    from editscope.cli import main

    code = main(["score", "--model", "tiny-gpt2", "--chat-template", "--prompt", "x is", "--candidates", "y"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "has no chat template" in err and "\n" not in err
