"""KN (Dai et al. 2022): neuron selection by hand from IG attributions, the update's closed form, untouched entries
bit-identical, bit-exact revert, plug-ins refused, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from editscope.cli import main
from editscope.data.records import EditRequest
from editscope.edit import EDITORS
from editscope.edit.kn import KNHParams, select_neurons
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.locate import encode_prompt
from editscope.locate.attribution import knowledge_neurons


def _hand_neurons(bundle, request, hp: KNHParams) -> set[tuple[int, int]]:
    """Dai et al. §3.3 as a plain loop: per prompt, Attr > t·max; kept when coarse in more than p·n prompts."""
    engine = ScoringEngine(bundle)
    counts: dict[tuple[int, int], int] = {}
    for prefix in hp.prefixes:
        prompt = encode_prompt(engine, prefix + request.prompt, request.subject, request.target_true)
        attr = knowledge_neurons(engine, prompt, steps=hp.steps, layers=hp.layers).neurons
        top = max(attr[layer].max() for layer in hp.layers)
        for layer in hp.layers:
            for i in range(attr.shape[1]):
                if attr[layer, i] > hp.adaptive_threshold * top:
                    counts[(layer, i)] = counts.get((layer, i), 0) + 1
    return {key for key, c in counts.items() if c > hp.share * len(hp.prefixes)}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_kn_changes_only_selected_value_vectors_by_the_update_formula(tiny_bundles, request_a, family):
    bundle = tiny_bundles[family]
    editor = EDITORS["kn"]
    hp = editor.load_hparams(bundle).replace(layers=[1, 2], share=0.0)
    before = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    patch = editor.apply(bundle, request_a, hp)
    try:
        neurons = {tuple(x) for x in patch.info["neurons"][0]}
        assert neurons
        after = dict(bundle.model.named_parameters())
        for name, w0 in before.items():
            if name not in patch.deltas:
                assert torch.equal(after[name], w0), name
        engine = ScoringEngine(bundle)
        old_id = engine.encode_pair(request_a.text, request_a.target_true)[1][0]
        new_id = engine.encode_pair(request_a.text, request_a.target_new)[1][0]
        assert patch.info["old_token"] == [old_id] and patch.info["new_token"] == [new_id]
        emb = bundle.model.get_output_embeddings().weight.detach()
        move = 2.0 * emb[new_id] - 2.0 * emb[old_id]
        keys = {}  # the first prompt's key activations at its last token, from a plain module hook
        hook = lambda layer: (lambda _m, args: keys.__setitem__(layer, args[0][0, -1].detach()))  # noqa: E731
        handles = [bundle.arch.layer_module(bundle.model, lay, "mlp_out").register_forward_pre_hook(hook(lay))
                   for lay in hp.layers]
        patch.revert(bundle)
        try:
            with torch.no_grad():
                ids = engine.context_ids(hp.prefixes[0] + request_a.text)
                bundle.model(input_ids=torch.tensor([ids], device=bundle.device))
        finally:
            for h in handles:
                h.remove()
            patch.apply(bundle)
        for layer in hp.layers:
            name = bundle.arch.weight_name(layer)
            w0 = before[name] if family != "gpt2" else before[name].T  # GPT-2 Conv1D stores (in, out)
            w1 = after[name].detach() if family != "gpt2" else after[name].detach().T
            chosen = sorted(i for (lay, i) in neurons if lay == layer)
            others = [i for i in range(w0.shape[1]) if i not in chosen]
            assert torch.equal(w1[:, others], w0[:, others])  # every other entry bit-identical
            for i in chosen:
                torch.testing.assert_close(w1[:, i], w0[:, i] + torch.sign(keys[layer][i]) * move, rtol=0, atol=1e-6)
                assert not torch.equal(w1[:, i], w0[:, i])
    finally:
        patch.revert(bundle)
    assert all(torch.equal(p, before[n]) for n, p in bundle.model.named_parameters())


def test_kn_neurons_equal_a_hand_selection(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    editor = EDITORS["kn"]
    for share in (0.0, 0.5):  # union of the prompts' coarse neurons, then only those coarse in both prompts
        hp = editor.load_hparams(bundle).replace(layers=[1, 2], share=share)
        patch = editor.compute_patch(bundle, request_a, hp)
        got = {tuple(x) for x in patch.info["neurons"][0]}
        assert got == _hand_neurons(bundle, request_a, hp) and got
    assert len(_hand_neurons(bundle, request_a, hp.replace(share=0.0))) >= len(got)


def test_select_neurons_threshold_share_and_cap():
    hp = KNHParams(layers=[3, 5], adaptive_threshold=0.5, share=0.5)
    a = np.array([[1.0, 0.6, 0.4], [0.0, -2.0, 0.55]])  # max 1: coarse > 0.5 -> (3,0), (3,1), (5,2)
    b = np.array([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]])    # max 1: coarse -> (3,1), (5,2)
    assert select_neurons([a, b], hp) == [(5, 2), (3, 1)]  # shared by both, strongest summed attribution first
    assert select_neurons([a, b], hp.replace(share=0.0)) == [(5, 2), (3, 1), (3, 0)]
    assert select_neurons([a, b], hp.replace(share=0.0, max_neurons=1)) == [(5, 2)]
    assert select_neurons([-np.abs(a)], hp) == []  # no positive attribution: no neuron


def test_kn_reference_convention_uses_the_greedy_token(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    hp = EDITORS["kn"].load_hparams(bundle).replace(old_answer="argmax", embedding="input", share=0.0,
                                                         activation_sign=False)
    patch = EDITORS["kn"].compute_patch(bundle, request_a, hp)
    engine = ScoringEngine(bundle)
    greedy = int(engine.next_token_logprobs([request_a.text])[0].argmax())
    assert patch.info["old_token"] == [greedy]
    emb = bundle.model.get_input_embeddings().weight.detach()
    layer, neuron = patch.info["neurons"][0][0]
    expected = 2.0 * emb[patch.info["new_token"][0]] - 2.0 * emb[greedy]
    torch.testing.assert_close(patch.deltas[bundle.arch.weight_name(layer)][:, neuron], expected, rtol=0, atol=0)


def test_kn_refuses_plugins_and_bad_hparams(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    with pytest.raises(EditscopeError, match="kn does not optimise a loss"):
        EDITORS["kn"].apply(bundle, request_a, plugins=["app"])
    with pytest.raises(EditscopeError, match="'share'"):
        EDITORS["kn"].load_hparams(bundle, overrides={"share": 1.0})
    with pytest.raises(EditscopeError, match="'old_answer'"):
        EDITORS["kn"].load_hparams(bundle, overrides={"old_answer": "x"})


def test_kn_through_the_cli(tiny_bundles, capsys):
    code = main(["edit", "--model", "tiny-llama", "--method", "kn", "--prompt", "{} is a citizen of",
                 "--subject", "Danielle Darrieux", "--target", " Japan", "--target-true", " France", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "kn" and out["label"] == "KN"
    assert out["post"]["target"] != out["pre"]["target"]
    assert main(["edit", "--model", "tiny-llama", "--method", "kn", "--prompt", "{} is a citizen of",
                 "--subject", "Danielle Darrieux", "--target", " Japan", "--target-true", " France",
                 "--plugin", "app"]) == 2
    assert "does not optimise a loss" in capsys.readouterr().err


def test_kn_attribution_cache_reuses_ig_only_on_the_same_weights(tiny_bundles, request_a, tmp_path, monkeypatch):
    """The cached attributions give the ΔW a fresh computation gives (another λ included: ΔW is linear in λ by
    Dai et al. §5.1), and edited weights (another fingerprint) do not hit the cache."""
    from editscope.edit import kn

    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    bundle = tiny_bundles["llama"]
    editor = EDITORS["kn"]
    hp = editor.load_hparams(bundle).replace(layers=[1, 2], share=0.0)
    calls = []
    real = kn._attributions
    monkeypatch.setattr(kn, "_attributions", lambda *a: calls.append(1) or real(*a))
    first = editor.compute_patch(bundle, request_a, hp)
    again = editor.compute_patch(bundle, request_a, hp.replace(lambda_old=0.5, lambda_new=0.25))
    assert len(calls) == 1
    assert first.info["attributions_cached"] == [False] and again.info["attributions_cached"] == [True]
    assert first.info["neurons"] == again.info["neurons"]
    emb = bundle.model.get_output_embeddings().weight.detach()
    old, new = first.info["old_token"][0], first.info["new_token"][0]
    for name, delta in again.deltas.items():  # closed form at the new λ on the same neurons, signs from the first ΔW
        for layer, neuron in again.info["neurons"][0]:
            if bundle.arch.weight_name(layer) != name:
                continue
            sign = torch.sign(first.deltas[name][:, neuron] @ (emb[new] - emb[old]))
            torch.testing.assert_close(delta[:, neuron], sign * (0.25 * emb[new] - 0.5 * emb[old]),
                                       rtol=1e-6, atol=1e-7)
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "fresh"))  # no cache: IG again, the same ΔW
    fresh = editor.compute_patch(bundle, request_a, hp.replace(lambda_old=0.5, lambda_new=0.25))
    assert len(calls) == 2 and fresh.info["neurons"] == again.info["neurons"]
    for name in fresh.deltas:
        torch.testing.assert_close(fresh.deltas[name], again.deltas[name], rtol=0, atol=0)
    other = EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch")
    patch = editor.apply(bundle, other, hp)
    try:  # the same request on edited weights: another fingerprint, so IG runs again
        editor.compute_patch(bundle, request_a, hp)
        assert len(calls) == 4
    finally:
        patch.revert(bundle)
    editor.compute_patch(bundle, request_a, hp)  # reverted: the unedited weights' entry again
    assert len(calls) == 4
