"""Patches: bit-exact revert for every editor, apply/revert cycles, safetensors round trip, refusals."""

from __future__ import annotations

import hashlib

import pytest
import torch

from editscope.edit import EDITORS, Patch, edited, get_editor
from editscope.errors import EditscopeError
from editscope.lm import load


def checksums(model) -> dict[str, str]:
    return {n: hashlib.sha256(p.detach().cpu().numpy().tobytes()).hexdigest() for n, p in model.named_parameters()}


@pytest.mark.parametrize("method", sorted(EDITORS))
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_revert_is_bit_exact_for_every_editor(tiny_bundles, request_a, method, family):
    bundle = tiny_bundles[family]
    before = checksums(bundle.model)
    editor = get_editor(method)
    patch = editor.apply(bundle, request_a, state=editor.new_state())
    after = checksums(bundle.model)
    changed = {n for n in before if before[n] != after[n]}
    assert changed == set(patch.deltas) and changed  # exactly the patched parameters changed
    assert all(bundle.arch.weight_name(layer) in patch.deltas for layer in editor.load_hparams(bundle).layers)
    patch.revert(bundle)
    assert checksums(bundle.model) == before
    # re-apply gives the same edited weights, revert again restores
    patch.apply(bundle)
    assert checksums(bundle.model) == after
    patch.revert(bundle)
    assert checksums(bundle.model) == before


def test_edited_context_manager_reverts_on_error(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    before = checksums(bundle.model)
    with pytest.raises(RuntimeError), edited(bundle, "rome", request_a) as patch:
        assert checksums(bundle.model) != before and patch.applied
        raise RuntimeError("boom")
    assert checksums(bundle.model) == before and not patch.applied


def test_save_load_round_trip(tiny_bundles, request_a, tmp_path):
    bundle = tiny_bundles["llama"]
    before = checksums(bundle.model)
    patch = EDITORS["memit"].compute_patch(bundle, request_a)
    assert checksums(bundle.model) == before  # compute_patch leaves the model alone
    path = patch.save(tmp_path / "p.safetensors")
    loaded = Patch.load(path)
    assert loaded.method == "memit" and loaded.fingerprint == bundle.fingerprint
    assert loaded.hparams == patch.hparams and loaded.requests[0]["subject"] == "Danielle Darrieux"
    assert set(loaded.deltas) == set(patch.deltas)
    assert all(torch.equal(loaded.deltas[n].cpu(), patch.deltas[n].cpu()) for n in patch.deltas)
    originals = {n: p.detach().clone() for n, p in bundle.model.named_parameters() if n in patch.deltas}
    loaded.apply(bundle)
    params = dict(bundle.model.named_parameters())
    name = next(iter(patch.deltas))
    assert torch.equal(params[name].cpu(), originals[name].cpu() + patch.deltas[name].cpu())
    with pytest.raises(EditscopeError, match="already applied"):
        loaded.apply(bundle)
    # a second patch computed on the original state refuses the edited state
    with pytest.raises(EditscopeError, match="not in the state"):
        Patch.load(path).apply(bundle)
    loaded.revert(bundle)
    assert checksums(bundle.model) == before


def test_patch_refuses_a_different_model(tiny_bundles, request_a, tmp_path):
    bundle = tiny_bundles["llama"]
    path = EDITORS["rome"].compute_patch(bundle, request_a).save(tmp_path / "p.safetensors")
    other = load("tiny-llama", seed=1)
    assert other.fingerprint != bundle.fingerprint
    with pytest.raises(EditscopeError, match="fingerprint"):
        Patch.load(path).apply(other)
    with pytest.raises(EditscopeError, match="does not exist|shape"):
        Patch.load(path).apply(tiny_bundles["gpt2"], check=False)


def test_load_rejects_non_patch_files(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(EditscopeError, match="not a safetensors patch"):
        Patch.load(bad)
    with pytest.raises(EditscopeError, match="not found"):
        Patch.load(tmp_path / "missing.safetensors")
