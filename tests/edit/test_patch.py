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


@pytest.mark.parametrize("method", sorted(n for n, e in EDITORS.items() if e.kind == "weights"))
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


def test_exact_index_and_write_exact_restore_bit_for_bit():
    from editscope.edit.patch import exact_index, write_exact

    nan_a = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)  # two NaNs with other payloads
    nan_b = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
    target = torch.cat([torch.tensor([1.0, -0.0, 0.1]), nan_a, torch.tensor([3.0])])
    computed = torch.cat([torch.tensor([1.0, 0.0, 0.1 + 1e-9]), nan_b, torch.tensor([3.0])])
    index = exact_index(computed, target)
    assert index.tolist() == [1, 3]  # -0.0 vs 0.0 and the NaN payload differ; 0.1 + 1e-9 rounds to 0.1
    values = target.reshape(-1)[index]
    write_exact(computed, index.to(torch.int32), values)  # an index stored narrower, as a patch keeps it
    assert torch.equal(computed.view(torch.int32), target.view(torch.int32))
    # a patch's round trip (W + Δ) - Δ misses W at a few entries; those entries put it back exactly
    w = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    d = 3 * torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    back = (w + d) - d
    index = exact_index(back, w)
    assert 0 < index.numel() < w.numel() and not torch.equal(back.view(torch.int32), w.view(torch.int32))
    write_exact(back, index, w.reshape(-1)[index])
    assert torch.equal(back.view(torch.int32), w.view(torch.int32))
