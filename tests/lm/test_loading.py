"""Model loading, architecture detection and hooks."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig

from editscope.errors import EditscopeError
from editscope.lm import ARCHS, arch_for_config, load
from editscope.lm.hooks import capture, hooks
from editscope.lm.bundle import fingerprint_model, package_dir


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(EditscopeError, match="unknown model 'no-such-model'.*smollm2-135m"):
        load("no-such-model")


def test_missing_wheel_names_the_package():
    with pytest.raises(EditscopeError, match="'not-a-wheel' is not installed"):
        package_dir("not_a_wheel_pkg", "not-a-wheel")


def test_unsupported_architecture_lists_supported():
    with pytest.raises(EditscopeError, match="model_type='bert'.*gpt2.*llama"):
        arch_for_config(BertConfig())


@pytest.mark.parametrize("family", ["gpt2", "gptj", "llama", "mistral", "qwen2", "gemma3"])
def test_arch_map_paths_exist(family):
    bundle = load(f"tiny-{family}")
    model, arch = bundle.model, bundle.arch
    params = dict(model.named_parameters())
    for layer in range(bundle.n_layers):
        for part in ("attn", "attn_out", "mlp", "mlp_in", "mlp_out"):
            model.get_submodule(arch.layer_module_path(layer, part))
        w = arch.as_out_in(params[arch.weight_name(layer)])
        assert tuple(w.shape) == (bundle.hidden_size, arch.mlp_size(model.config))
    for path in (arch.embed, arch.final_norm, arch.lm_head, arch.base):
        model.get_submodule(path)
    assert ARCHS[arch.family] is arch


def test_fingerprint_tracks_weights(tiny_bundles):
    bundle = load("tiny-llama")
    before = fingerprint_model(bundle.model)
    assert before == bundle.fingerprint == tiny_bundles["llama"].fingerprint
    with torch.no_grad():
        bundle.model.lm_head.weight[0, 0] += 1.0
    assert fingerprint_model(bundle.model) != before


def test_local_folder_round_trip(tmp_path, tiny_bundles):
    bundle = tiny_bundles["gpt2"]
    bundle.model.save_pretrained(tmp_path)
    bundle.tokenizer.save_pretrained(tmp_path)
    again = load(str(tmp_path))
    ids = torch.tensor([bundle.tokenizer("Hello world")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids).logits, bundle.model(ids).logits)
    assert again.fingerprint == bundle.fingerprint


def test_hooks_are_removed_on_exit_and_on_error(tiny):
    model, arch = tiny.model, tiny.arch
    ids = torch.tensor([[10, 20, 30]])

    def n_hooks():  # transformers installs hooks of its own; count ours by difference
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    baseline = n_hooks()
    with torch.no_grad():
        clean = model(ids).logits
    with hooks(model, arch, {"blocks.1.mlp_out": lambda x: x * 0}), torch.no_grad():
        assert not torch.allclose(model(ids).logits, clean)
        assert n_hooks() == baseline + 1
    with pytest.raises(RuntimeError), hooks(model, arch, {"blocks.0.resid_post": lambda x: x + 1}):
        raise RuntimeError("boom")
    assert n_hooks() == baseline
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, clean)


def test_capture_equals_output_hidden_states(tiny):
    ids = torch.tensor([[5, 6, 7, 8]])
    with capture(tiny.model, tiny.arch, ["embed", "blocks.0.resid_post"]) as store, torch.no_grad():
        hs = tiny.model(ids, output_hidden_states=True).hidden_states
    with torch.no_grad():  # token embeddings only (GPT-2 adds positions after this point)
        torch.testing.assert_close(store["embed"], tiny.model.get_input_embeddings()(ids))
    torch.testing.assert_close(store["blocks.0.resid_post"], hs[1])


def test_bad_hook_point_is_a_clear_error(tiny):
    with pytest.raises(EditscopeError, match="unknown hook point"), hooks(tiny.model, tiny.arch, {"mlp": abs}):
        pass
    with pytest.raises(EditscopeError, match="out of range"), hooks(tiny.model, tiny.arch, {"blocks.99.mlp_out": abs}):
        pass
