"""Patches hold ΔW plus the few original entries float subtraction does not restore, not a copy of W (so a
long chain of edits costs little memory), and still revert bit-exactly: 50 sequential patches, every dtype, deltas
from tiny to larger than W."""

from __future__ import annotations

import pytest
import torch

from editscope.edit import EditSession, Patch
from editscope.edit.patch import _Restore, tensor_checksum
from editscope.errors import EditscopeError
from editscope.lm import load

INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().view(INT[t.dtype])


def patch_on(bundle, deltas: dict[str, torch.Tensor]) -> Patch:
    """A patch computed on the bundle's weights as they are now (what an editor's patch records)."""
    params = dict(bundle.model.named_parameters())
    return Patch(deltas=deltas, method="synthetic", hparams={}, fingerprint=bundle.fingerprint,
                 checksums={n: tensor_checksum(params[n]) for n in deltas})


def test_fifty_sequential_patches_revert_bit_exact_and_hold_no_copy_of_w():
    bundle = load("tiny-llama")
    names = [bundle.arch.weight_name(layer) for layer in range(bundle.n_layers)] + ["model.embed_tokens.weight"]
    params = dict(bundle.model.named_parameters())
    before = {n: bits(params[n]) for n in names}
    gen = torch.Generator().manual_seed(0)
    patches, fixed = [], 0
    for i in range(50):
        name = names[i % len(names)]
        w = params[name].detach()
        scale = 10.0 ** (-4 + (i % 5))  # |Δ| from 1e-4·|W| to ~1·|W|: 0.04 % to 30 % of entries round
        rank1 = torch.outer(torch.randn(w.shape[0], generator=gen), torch.randn(w.shape[1], generator=gen))
        rank1 = rank1.to(w.device)
        delta = rank1 * scale * w.abs().mean()
        naive = (w + delta) - delta
        fixed += int((naive.view(torch.int32) != w.view(torch.int32)).sum())
        patch = patch_on(bundle, {name: delta})
        patch.apply(bundle)
        patches.append(patch)
        assert patch.revert_bytes < w.numel() * w.element_size()  # less than a copy, also at |Δ| ≈ |W|
    assert fixed > 1000  # subtracting Δ alone would not have been bit-exact
    small = [p for i, p in enumerate(patches) if i % 5 == 0]  # |Δ| = 1e-4·|W|
    assert all(p.revert_bytes < 0.01 * 4 * next(iter(p.deltas.values())).numel() for p in small)
    session = EditSession(bundle)
    assert len(session.patches) == 50
    session.revert_all()
    assert not bundle.applied and bundle.fingerprint == bundle.base_fingerprint
    for n in names:
        assert torch.equal(bits(params[n]), before[n]), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1e-4, 1e-2, 1.0, 100.0])
def test_restore_is_bit_exact_in_every_dtype(dtype, scale):
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(64, 96, generator=gen) * 0.02).to(dtype)
    w[0, :4] = torch.tensor([0.0, -0.0, 1e-30, -1e-30]).to(dtype)  # signed zeros and underflow survive
    delta = (torch.randn(64, 96, generator=gen) * 0.02 * scale).to(dtype)
    original = bits(w)
    param = w.clone()
    restore = _Restore.of(param.clone(), param.add_(delta), delta)
    assert restore.nbytes <= w.numel() * w.element_size()
    restore.restore(param, delta)
    assert torch.equal(param.view(INT[dtype]), original)


def test_sequential_rome_edits_revert_bit_exact(request_a, request_b):
    bundle = load("tiny-llama")
    before = {n: bits(p) for n, p in bundle.model.named_parameters()}
    with EditSession(bundle) as session:
        for request in [request_a, request_b] * 3:
            session.apply("rome", request)
        held = sum(p.revert_bytes for p in session.patches)
        deltas = sum(d.numel() * d.element_size() for p in session.patches for d in p.deltas.values())
        # the old patches each held a full copy (held == deltas); tiny random weights get edits as large as W
        assert held < deltas / 2
    after = {n: bits(p) for n, p in bundle.model.named_parameters()}
    assert all(torch.equal(after[n], before[n]) for n in before)


def test_folded_chain_holds_one_original_per_parameter_and_restores_bit_exact():
    """Bundle.folding: the weights after each folded patch equal a plain running sum, the
    fingerprint equals the unfolded chain's, no patch keeps its ΔW, unpatched() shows the loaded weights, and the
    end of the block restores them bit for bit."""
    bundle = load("tiny-llama")
    names = [bundle.arch.weight_name(layer) for layer in range(bundle.n_layers)]
    params = dict(bundle.model.named_parameters())
    before = {n: bits(params[n]) for n in names}
    expected = {n: params[n].detach().clone() for n in names}  # the naive chain: W + Δ₁ + Δ₂ + ...
    gen = torch.Generator().manual_seed(3)
    digests = []
    with bundle.folding():
        for i in range(12):
            name = names[i % len(names)]
            delta = (torch.randn(params[name].shape, generator=gen) * 10.0 ** (-3 + i % 4)).to(params[name].device)
            patch = patch_on(bundle, {name: delta})
            patch.apply(bundle)
            expected[name] += delta
            digests.append(patch.digest)
            bundle.fold(patch)
            assert patch.released and patch.deltas[name].is_meta and patch.revert_bytes == 0
            assert torch.equal(params[name].detach(), expected[name])
        assert len(bundle._originals) == len(names)  # one copy per edited parameter, not one per patch
        from editscope.lm.bundle import patched_fingerprint
        assert bundle.fingerprint == patched_fingerprint(bundle.base_fingerprint, digests)
        with pytest.raises(EditscopeError, match="folded"):
            patch.revert(bundle)
        loose = patch_on(bundle, {names[0]: torch.ones_like(params[names[0]])})  # an unfolded patch on top
        loose.apply(bundle)
        with bundle.unpatched():
            assert all(torch.equal(bits(params[n]), before[n]) for n in names)
            assert bundle.fingerprint == bundle.base_fingerprint
        assert torch.equal(params[names[0]].detach(), expected[names[0]] + 1)
        assert all(torch.equal(params[n].detach(), expected[n]) for n in names[1:])
        assert bundle.fingerprint == patched_fingerprint(bundle.base_fingerprint, digests + [loose.digest])
    # the loose patch is reverted by the end of the block (an error path), then the originals are written back
    assert not bundle.applied and bundle.fingerprint == bundle.base_fingerprint
    assert all(torch.equal(bits(params[n]), before[n]) for n in names)


def test_folding_restores_on_error_and_refuses_misuse():
    bundle = load("tiny-llama")
    name = bundle.arch.weight_name(0)
    param = dict(bundle.model.named_parameters())[name]
    before = bits(param)
    with pytest.raises(RuntimeError, match="boom"), bundle.folding():
        patch = patch_on(bundle, {name: torch.full_like(param, 0.5)})
        patch.apply(bundle)
        bundle.fold(patch)
        raise RuntimeError("boom")
    assert torch.equal(bits(param), before) and not bundle.applied
    patch = patch_on(bundle, {name: torch.full_like(param, 0.5)})
    patch.apply(bundle)
    with pytest.raises(EditscopeError, match="only valid inside"):
        bundle.fold(patch)
    with pytest.raises(EditscopeError, match="no patch applied"), bundle.folding():
        pass
    patch.revert(bundle)
    assert torch.equal(bits(param), before)
