"""Locating methods on tiny random-init models, checked against independent computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import hooks
from editscope.locate import encode_prompt, locate
from editscope.locate.attribution import grad_x_activation, knowledge_neurons
from editscope.locate.causal_trace import CausalTracer, trace, window_layers
from editscope.metrics.klob import rsim_from_results

TEMPLATE, SUBJECT, ANSWER = "The {} is located in", "Eiffel Tower", " Paris"


def _prob_from_embeds(engine, embeds, answer_id):
    with torch.no_grad():
        logits = engine.model(inputs_embeds=embeds[None], use_cache=False).logits[0, -1]
    return float(logits.float().softmax(-1)[answer_id])


def test_restoring_everything_gives_clean_and_nothing_gives_corrupted(tiny):
    engine = ScoringEngine(tiny)
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    tracer = CausalTracer(engine, prompt, samples=3, seed=1)
    n_tokens = len(prompt.ids)
    every = [[(f"blocks.{layer}.resid_post", t) for t in range(n_tokens)] for layer in range(tiny.n_layers)]
    np.testing.assert_allclose(tracer.restored_probs(every), tracer.clean_prob, rtol=1e-5)
    # corrupted run, computed naively: one forward per noise sample with the noisy embeddings fed directly
    start, end = prompt.subject_span
    clean_embeds = engine.model.get_input_embeddings()(torch.tensor(prompt.ids, device=tiny.device)).detach()
    naive = []
    for s in range(tracer.samples):
        embeds = clean_embeds.clone()
        embeds[start:end] += tracer.noise[s]
        naive.append(_prob_from_embeds(engine, embeds, prompt.answer_id))
    assert tracer.corrupted_prob == pytest.approx(float(np.mean(naive)), rel=1e-5)
    # clean, naively
    assert tracer.clean_prob == pytest.approx(_prob_from_embeds(engine, clean_embeds, prompt.answer_id), rel=1e-5)
    assert tracer.clean_prob != pytest.approx(tracer.corrupted_prob, rel=1e-3)


def test_trace_maps_restore_single_states():
    from editscope.lm import load

    engine = ScoringEngine(load("tiny-llama"))
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    result = trace(engine, prompt, samples=2, window=3, seed=2)
    last_layer, last_token = engine.bundle.n_layers - 1, len(prompt.ids) - 1
    # the last block's output at the last token decides the answer alone: restoring it gives the clean probability
    assert result.states["residual"][last_layer, last_token] == pytest.approx(result.meta["clean_prob"], rel=1e-5)
    # restoring a state after the subject at layer 0 cannot see the noise... but a subject state can: check one
    # cell against a restoration run built by hand (MLP window around layer 1 at the subject's last token)
    tracer = CausalTracer(engine, prompt, samples=2, seed=2)
    subject_last = prompt.subject_span[1] - 1
    pattern = [(f"blocks.{lay}.mlp_out", subject_last) for lay in window_layers(1, 3, engine.bundle.n_layers)]
    assert result.states["mlp"][1, subject_last] == pytest.approx(tracer.restored_probs([pattern])[0], rel=1e-6)
    effect = result.states["mlp"][:, subject_last] - result.meta["corrupted_prob"]
    np.testing.assert_allclose(result.neurons[:, 0], effect)
    assert np.all(result.neurons == result.neurons[:, :1])


@pytest.mark.parametrize("rule, steps, tol", [("midpoint", 64, 0.01), ("right", 400, 0.02)])
def test_integrated_gradients_completeness(tiny, rule, steps, tol):
    if tiny.arch.mlp_post_norm:
        # Gemma3 norms the MLP output: f(αk) is flat for α > ~eps and jumps at 0, which no Riemann sum resolves
        pytest.skip("post-MLP norm makes f(αk) a step at α = 0 (see editscope.locate.attribution)")
    engine = ScoringEngine(tiny)
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    layers = [0, tiny.n_layers - 1]
    result = knowledge_neurons(engine, prompt, steps=steps, rule=rule, layers=layers)
    ids = torch.tensor([prompt.ids], device=tiny.device)
    with torch.no_grad():
        f_x = float(engine.model(input_ids=ids).logits[0, -1].float().softmax(-1)[prompt.answer_id])
    for layer in layers:
        def zero(x):
            x = x.clone()
            x[:, -1] = 0
            return x

        with torch.no_grad(), hooks(engine.model, engine.arch, {f"blocks.{layer}.mlp_key": zero}):
            f_0 = float(engine.model(input_ids=ids).logits[0, -1].float().softmax(-1)[prompt.answer_id])
        total = result.neurons[layer].sum()
        assert abs(total - (f_x - f_0)) <= tol * abs(f_x - f_0) + 1e-9, (layer, total, f_x - f_0)
        assert abs(f_x - f_0) > 0
    assert np.all(result.neurons[1:-1] == 0) or tiny.n_layers == 2


def test_ig_suffix_path_equals_whole_prompt_rows(tiny):
    """The cached-prefix IG (one-token rows) gives the numbers of running the whole prompt per (layer, α) row,
    and batching layers together changes nothing (token_budget small = one layer per forward)."""
    engine = ScoringEngine(tiny)
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    fast = knowledge_neurons(engine, prompt, steps=4).neurons
    whole = knowledge_neurons(engine, prompt, steps=4, suffix=False).neurons
    one_layer = knowledge_neurons(engine, prompt, steps=4, suffix=False, token_budget=1).neurons
    scale = np.abs(whole).max()
    assert scale > 0
    np.testing.assert_allclose(fast, whole, rtol=0, atol=1e-4 * scale)
    np.testing.assert_allclose(one_layer, whole, rtol=0, atol=1e-5 * scale)


MLP_OF = {"llama": lambda m, layer: m.model.layers[layer].mlp, "gpt2": lambda m, layer: m.transformer.h[layer].mlp}


@pytest.mark.parametrize("family", sorted(MLP_OF))
def test_window_restorations_equal_plain_hooked_runs(tiny_bundles, family):
    """Batched window restorations (a window of 3 MLPs at the subject's last token centred on every layer, and one
    MLP at the last token) equal a plain full forward per noise sample with torch hooks on the MLP modules: no
    editscope hook, no batching."""
    engine = ScoringEngine(tiny_bundles[family])
    model, n_layers = engine.model, engine.bundle.n_layers
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    tracer = CausalTracer(engine, prompt, samples=3, seed=5)
    subject_last = prompt.subject_span[1] - 1
    patterns = [[(f"blocks.{layer}.mlp_out", subject_last) for layer in window_layers(centre, 3, n_layers)]
                for centre in range(n_layers)] + [[(f"blocks.{n_layers - 1}.mlp_out", len(prompt.ids) - 1)]]
    ids = torch.tensor([prompt.ids], device=engine.bundle.device)
    clean_out = {}
    handles = [MLP_OF[family](model, layer).register_forward_hook(
        lambda _m, _a, out, layer=layer: clean_out.__setitem__(layer, out[0].detach().clone()))
        for layer in range(n_layers)]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    start, end = prompt.subject_span
    clean_embeds = model.get_input_embeddings()(ids)[0].detach()
    naive = []
    for pattern in patterns:
        restore = {int(name.split(".")[1]): token for name, token in pattern}

        def put_back(out, layer, token):
            out = out.clone()
            out[0, token] = clean_out[layer][token]
            return out

        handles = [MLP_OF[family](model, layer).register_forward_hook(
            lambda _m, _a, out, layer=layer, token=token: put_back(out, layer, token))
            for layer, token in restore.items()]
        try:
            probs = []
            for s in range(tracer.samples):
                embeds = clean_embeds.clone()
                embeds[start:end] += tracer.noise[s]
                probs.append(_prob_from_embeds(engine, embeds, prompt.answer_id))
        finally:
            for h in handles:
                h.remove()
        naive.append(np.mean(probs))
    np.testing.assert_allclose(tracer.restored_probs(patterns), naive, rtol=1e-4, atol=1e-7)
    assert len(set(np.round(np.log(naive), 4))) > 3  # the restorations differ, so each is checked


def test_trace_batched_restorations_equal_one_at_a_time():
    from editscope.lm import load

    engine = ScoringEngine(load("tiny-gpt2"))
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    batched = CausalTracer(engine, prompt, samples=3, seed=4)
    single = CausalTracer(engine, prompt, samples=3, seed=4, token_budget=1)  # one pattern per forward
    assert single.rows_per_forward == 3
    patterns = [[(f"blocks.{layer}.mlp_out", t)] for layer in range(engine.bundle.n_layers)
                for t in range(len(prompt.ids))]
    np.testing.assert_allclose(batched.restored_probs(patterns), single.restored_probs(patterns), rtol=1e-5)
    # and one pattern per call, one noise row per forward, averaged by hand
    rows = []
    for s in range(3):
        one = CausalTracer(engine, prompt, samples=1, seed=4)
        one.noise = batched.noise[s:s + 1]
        rows.append(one.restored_probs(patterns[:5]))
    np.testing.assert_allclose(batched.restored_probs(patterns[:5]), np.mean(rows, axis=0), rtol=1e-5)


def test_grad_x_act_is_one_step_ig():
    from editscope.lm import load

    engine = ScoringEngine(load("tiny-gpt2"))
    prompt = encode_prompt(engine, TEMPLATE, SUBJECT, ANSWER)
    one_step = knowledge_neurons(engine, prompt, steps=1, rule="right")
    scale = np.abs(one_step.neurons).max()
    assert scale > 0
    np.testing.assert_allclose(grad_x_activation(engine, prompt).neurons, one_step.neurons, rtol=0, atol=1e-3 * scale)
    with torch.no_grad():  # a caller's no_grad does not reach the gradients the attribution needs
        quiet = knowledge_neurons(engine, prompt, steps=1, rule="right"), grad_x_activation(engine, prompt)
    np.testing.assert_array_equal(quiet[0].neurons, one_step.neurons)
    np.testing.assert_array_equal(quiet[1].neurons, grad_x_activation(engine, prompt).neurons)


def test_random_baseline_rsim_is_about_zero():
    from editscope.lm import load

    engine = ScoringEngine(load("tiny-llama"))
    facts = [("{} is located in", s, " Paris") for s in ["Rome", "Berlin", "Madrid", "Oslo", "Vienna", "Bern"]]
    results = [[locate(engine, "random", t.replace("is located", form), s, a).neurons
                for form in ("is located", "can be found", "lies")] for t, s, a in facts]
    pool = [r for group in results for r in group]
    for k in (1, 5, 10):
        values = [rsim_from_results(group, pool, k) for group in results]
        assert np.mean(values) < 0.05
    # distinct sentences get distinct random scores; the same sentence the same
    assert not np.array_equal(results[0][0], results[0][1])
    np.testing.assert_array_equal(results[0][0], locate(engine, "random", *facts[0]).neurons)


@pytest.mark.slow
def test_smollm2_trace_eiffel(smollm2):
    engine = ScoringEngine(smollm2)
    prompt = encode_prompt(engine, "{} is located in", "Eiffel Tower", " Paris")
    last = len(prompt.ids) - 1
    result = trace(engine, prompt, kinds=("residual",), tokens=[last], samples=2)
    # SmolLM2 knows the fact; corrupting the subject destroys it; the last state alone restores it exactly
    assert result.meta["clean_prob"] > 0.2 > 10 * result.meta["corrupted_prob"]
    assert result.states["residual"][-1, last] == pytest.approx(result.meta["clean_prob"], rel=1e-4)


def test_layer_curve_resumes_from_saved_rows():
    from editscope.lm import load
    from editscope.locate.layers import layer_curve

    engine = ScoringEngine(load("tiny-llama"))
    facts = [("{} is located in", s, " Paris") for s in ("Eiffel Tower", "Big Ben", "Colosseum")]
    kwargs = dict(samples=2, window=1, known_only=False)
    full = layer_curve(engine, facts, **kwargs)
    saved: list[dict] = []
    layer_curve(engine, facts, limit=2, on_fact=saved.append, **kwargs)
    assert len(saved) == 2
    new: list[dict] = []
    resumed = layer_curve(engine, facts, done=saved, on_fact=new.append, **kwargs)
    assert [row["prompt"] for row in new] == ["Colosseum is located in"]  # only the missing fact is traced
    assert resumed.n_facts == full.n_facts == 3
    np.testing.assert_allclose(resumed.effect, full.effect, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(resumed.normalised, full.normalised, rtol=1e-6, atol=1e-9)
    assert np.abs(full.effect).max() > 0
