"""Hook points as data: every declared point resolves and captures what an independent computation from the
module weights gives; capture's stop, gradient and cleanup behaviour (ROME's nethook.Trace)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.archs import ARCHS, MATRIX_POINTS
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture, hooks, point_names, run_until

TEXT = "The Eiffel Tower is located in the city of"


def ids_of(bundle, text: str = TEXT) -> torch.Tensor:
    return torch.tensor([bundle.tokenizer(text)["input_ids"]], device=bundle.device)


def capture_all(bundle, names=None, **kw):
    names = names or point_names(bundle.arch, bundle.n_layers)
    with capture(bundle.model, bundle.arch, names, **kw) as store, torch.no_grad():
        logits = bundle.model(ids_of(bundle)).logits
    return store, logits


def hook_counts(model) -> list[int]:
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
    return [len(getattr(module, kind)) for module in model.modules() for kind in kinds]


def test_every_point_captures_a_tensor_of_the_declared_shape(tiny):
    arch, config = tiny.arch, tiny.config
    names = point_names(arch, tiny.n_layers)
    per_block = 8 + (2 if arch.mlp_gate else 0)  # residual x2, attention x2, MLP key/out, up in/out, gate in/out
    assert len(names) == 2 + per_block * tiny.n_layers  # and embed, final
    store, _ = capture_all(tiny)
    n_tokens = ids_of(tiny).shape[1]
    d, mlp, heads, head_dim = tiny.hidden_size, arch.mlp_size(config), arch.n_heads(config), arch.head_dim(config)
    for name in names:
        kind = name.rsplit(".", 1)[-1]
        shapes = {"mlp_key": (1, n_tokens, mlp), "attn_heads": (1, n_tokens, heads, head_dim),
                  "up_out": (1, n_tokens, mlp * arch.mlp_in_parts), "gate_out": (1, n_tokens, mlp)}
        expected = shapes.get(kind, (1, n_tokens, d))
        assert tuple(store[name].shape) == expected, name


def test_matrix_points_are_the_input_and_output_of_their_weights(tiny):
    """Each MLP matrix's output point is its weight applied to its key point (plus a bias where it has one),
    computed here from the stored parameters."""
    arch = tiny.arch
    store, _ = capture_all(tiny)
    params = dict(tiny.model.named_parameters())
    for matrix in arch.matrices():
        key, out = (p.replace("{i}", "1") for p in MATRIX_POINTS[matrix])
        part = arch.matrix_part(matrix)
        weight = arch.as_out_in(params[arch.weight_name(1, part)])
        bias = params.get(arch.layer_module_path(1, part) + ".bias")
        expected = store[key] @ weight.T + (0 if bias is None else bias)
        torch.testing.assert_close(store[out], expected, rtol=1e-5, atol=1e-5)


def test_a_matrix_the_family_lacks_is_named():
    gpt2 = ARCHS["gpt2"]
    assert gpt2.matrices() == ["up", "down"]
    with pytest.raises(EditscopeError, match="gpt2 architecture has no separate gate projection"):
        gpt2.matrix_part("gate")
    assert ARCHS["phi3"].matrices() == ["up", "down"] and ARCHS["llama"].matrices() == ["gate", "up", "down"]


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_points_resolve_for_other_llama_family_types(family):
    bundle = load(f"tiny-{family}")
    store, _ = capture_all(bundle)
    assert set(store) == set(point_names(bundle.arch, bundle.n_layers))


def test_residual_stream_is_consistent_across_points(tiny):
    """resid_pre(i+1) == resid_post(i); resid_post == resid_pre + attention and MLP contributions (through
    Gemma3's post norms, the quirk declared on the map); the final norm and head of the last resid_post give
    the model's logits."""
    arch, model = tiny.arch, tiny.model
    store, logits = capture_all(tiny)
    for i in range(tiny.n_layers):
        if i + 1 < tiny.n_layers:
            torch.testing.assert_close(store[f"blocks.{i + 1}.resid_pre"], store[f"blocks.{i}.resid_post"])
        attn, mlp = store[f"blocks.{i}.attn_out"], store[f"blocks.{i}.mlp_out"]
        block = arch.block(model, i)
        with torch.no_grad():
            if arch.mlp_post_norm is not None:
                attn = block.post_attention_layernorm(attn)  # Gemma3's attention post norm
                mlp = block.get_submodule(arch.mlp_post_norm)(mlp)
        expected = store[f"blocks.{i}.resid_pre"] + attn + mlp
        torch.testing.assert_close(store[f"blocks.{i}.resid_post"], expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        final = model.get_submodule(arch.final_norm)(store[f"blocks.{tiny.n_layers - 1}.resid_post"])
        ours = ScoringEngine(tiny).logits_from_hidden(final)
    torch.testing.assert_close(ours, logits, atol=1e-4, rtol=1e-4)


def test_final_point_is_hf_last_hidden_state(tiny):
    """``final`` = the final norm's output: equal to HF's ``output_hidden_states[-1]`` at every position, and to
    the final norm applied by hand to the last block's residual state; the engine's ``kind="final"`` reads it at
    the last token (also through inputs_embeds) and refuses any layer but the last."""
    store, _ = capture_all(tiny, ["final", f"blocks.{tiny.n_layers - 1}.resid_post"])
    with torch.no_grad():
        hf = tiny.model(ids_of(tiny), output_hidden_states=True).hidden_states
        by_hand = tiny.model.get_submodule(tiny.arch.final_norm)(store[f"blocks.{tiny.n_layers - 1}.resid_post"])
    assert len(hf) == tiny.n_layers + 1
    torch.testing.assert_close(store["final"], hf[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(store["final"], by_hand, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(store["final"], store[f"blocks.{tiny.n_layers - 1}.resid_post"], atol=1e-3)
    engine = ScoringEngine(tiny)
    last = tiny.n_layers - 1
    ours = engine.hidden_states([TEXT, "Paris is"], [last], kind="final")
    torch.testing.assert_close(ours[0, 0], hf[-1][0, -1], atol=1e-5, rtol=1e-5)
    embeds = engine.embed("Paris is")
    torch.testing.assert_close(engine.hidden_states(["Paris is"], [last], kind="final", context_embeds=[embeds]),
                               ours[1:], atol=1e-5, rtol=1e-5)
    with pytest.raises(EditscopeError, match="layer must be"):
        engine.hidden_states([TEXT], [0], kind="final")


def test_embed_point_applies_the_declared_scaling(tiny):
    store, _ = capture_all(tiny, ["embed"])
    table = tiny.model.get_submodule(tiny.arch.embed).weight
    expected = table[ids_of(tiny)[0]] * tiny.arch.embed_multiplier(tiny.config)
    torch.testing.assert_close(store["embed"][0], expected.detach())
    assert (tiny.arch.embed_multiplier(tiny.config) != 1.0) == (tiny.arch.family in ("gemma2", "gemma3"))


def test_attn_heads_are_the_output_projections_input_split_by_head(tiny):
    arch = tiny.arch
    store, _ = capture_all(tiny, ["blocks.1.attn_heads", "blocks.1.attn_out"])
    proj = arch.layer_module(tiny.model, 1, "attn_out")
    w = arch.as_out_in(proj.weight)
    flat = store["blocks.1.attn_heads"].flatten(-2)
    expected = flat @ w.T + (proj.bias if proj.bias is not None else 0)
    torch.testing.assert_close(store["blocks.1.attn_out"], expected.detach(), atol=1e-5, rtol=1e-5)


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_mlp_key_equals_a_hand_computation(tiny_bundles, family):
    """The key k is act(gate) * up (LLaMA) or gelu(fc) (GPT-2) of the normed mid-block residual, computed from
    the module weights with plain tensor ops."""
    bundle = tiny_bundles[family]
    layer = 2
    names = [f"blocks.{layer}.resid_pre", f"blocks.{layer}.attn_out", f"blocks.{layer}.mlp_key"]
    store, _ = capture_all(bundle, names)
    mid = store[names[0]] + store[names[1]]
    block = bundle.arch.block(bundle.model, layer)
    with torch.no_grad():
        if family == "llama":
            norm = block.post_attention_layernorm
            x = rms(mid, norm.weight, norm.variance_epsilon)
            key = F.silu(x @ block.mlp.gate_proj.weight.T) * (x @ block.mlp.up_proj.weight.T)
        else:
            ln = block.ln_2
            x = (mid - mid.mean(-1, keepdim=True)) / torch.sqrt(mid.var(-1, keepdim=True, unbiased=False) + ln.eps)
            x = x * ln.weight + ln.bias
            key = F.gelu(x @ block.mlp.c_fc.weight + block.mlp.c_fc.bias, approximate="tanh")
    torch.testing.assert_close(store[names[2]], key, atol=1e-5, rtol=1e-4)


def test_stop_after_skips_later_blocks_and_captures_the_same_values(tiny):
    arch, model = tiny.arch, tiny.model
    names = ["blocks.1.mlp_key", "blocks.0.resid_post"]
    full, _ = capture_all(tiny, names)
    calls = {"later": 0, "head": 0}

    def count(key):
        def fn(_x):
            calls[key] += 1
        return fn

    last = f"blocks.{tiny.n_layers - 1}.resid_post"
    with hooks(model, arch, {"blocks.2.resid_pre": count("later"), last: count("later")}):
        head = model.get_submodule(arch.lm_head).register_forward_hook(lambda *_: calls.__setitem__("head", 1))
        try:
            reached = []
            with capture(model, arch, names, stop_after=True) as store, torch.no_grad():
                model(ids_of(tiny))
                reached.append(True)  # skipped: the forward raised StopForward, swallowed at the block's end
            # and around an engine call
            engine = ScoringEngine(tiny)
            via_engine = run_until(model, arch, names, lambda: engine.next_token_logprobs([TEXT]))
        finally:
            head.remove()
    assert calls == {"later": 0, "head": 0} and reached == []
    for name in names:
        torch.testing.assert_close(store[name], full[name])
        torch.testing.assert_close(via_engine[name], full[name])


def test_grad_capture_equals_autograd_grad(tiny):
    """Gradients recorded at hook points (no graph to the weights needed) equal torch.autograd.grad of the same
    scalar w.r.t. the states captured with ``detach=False`` from a forward whose input embeddings need grad."""
    arch, model = tiny.arch, tiny.model
    for p in model.parameters():  # the session's shared model as loaded: only this test's own gradients are checked
        p.grad = None
        p.requires_grad_(False)
    names = ["blocks.1.resid_post", "blocks.2.mlp_key", "blocks.2.attn_heads"]
    ids = ids_of(tiny)
    target = int(ids[0, -1])

    def loss_of(logits):
        return logits[0, -2].log_softmax(-1)[target]

    with capture(model, arch, names, grad=True) as store:
        loss_of(model(ids).logits).backward()
    grads = dict(store.grads)
    assert set(grads) == set(names)

    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with capture(model, arch, names, detach=False) as kept:
        loss = loss_of(model(inputs_embeds=embeds).logits)
        refs = torch.autograd.grad(loss, [kept[name] for name in names], retain_graph=True)
        loss.backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0  # the gradient flows through kept states
    for name, ref in zip(names, refs, strict=True):
        assert grads[name].shape == kept[name].shape
        torch.testing.assert_close(grads[name], ref, atol=1e-6, rtol=1e-4)
    assert all(p.grad is None for p in model.parameters())


def test_all_hooks_are_removed_on_error(tiny):
    model = tiny.model
    before = hook_counts(model)
    names = point_names(tiny.arch, tiny.n_layers)
    with pytest.raises(RuntimeError, match="boom"), capture(model, tiny.arch, names, grad=True) as store:
        assert hook_counts(model) != before
        model(ids_of(tiny))
        raise RuntimeError("boom")
    assert hook_counts(model) == before
    assert all(not store[name]._backward_hooks for name in names)  # tensor hooks removed too
    with pytest.raises(RuntimeError, match="boom"), capture(model, tiny.arch, names, stop_after=True):
        raise RuntimeError("boom")
    assert hook_counts(model) == before


def test_unknown_point_and_layer_out_of_range_are_clear_errors(tiny_bundles):
    bundle = tiny_bundles["llama"]
    unknown = r"unknown hook point 'blocks.0.mlp'.*blocks.N.resid_pre.*attn_heads"
    with pytest.raises(EditscopeError, match=unknown), capture(bundle.model, bundle.arch, ["blocks.0.mlp"]):
        pass
    for name in ("blocks.4.resid_pre", "blocks.4.mlp_out"):
        with pytest.raises(EditscopeError, match="layer 4 out of range"), hooks(bundle.model, bundle.arch, {name: abs}):
            pass
