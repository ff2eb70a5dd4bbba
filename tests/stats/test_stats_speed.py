"""Statistics speed-ups: the float32-chunk k kᵀ accumulation against a float64 loop; the stats cache's
weights checksum: per-parameter digests memoised per process, recomputed after any in-place change, equal to an
independent computation; files stamped with the older whole-stream checksum accepted when it matches, re-stamped."""

from __future__ import annotations

import hashlib
import importlib
import json
import warnings

import torch
from safetensors import safe_open

from editscope.lm import load
from editscope.stats import cache_file
from editscope.stats.second_moment import second_moment

sm = importlib.import_module("editscope.stats.second_moment")  # the package re-exports a function of that name
LAYER = 1


def independent_checksum(bundle, layer: int) -> str:
    """blake2b over (name, dtype, shape, blake2b of the bytes) of every parameter but later blocks', from scratch."""
    later = tuple(f"{bundle.arch.blocks}.{i}." for i in range(layer + 1, bundle.n_layers))
    h = hashlib.blake2b(digest_size=16)
    for name, p in bundle.model.named_parameters():
        if not name.startswith(later):
            raw = p.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
            h.update(f"{name}:{p.dtype}{tuple(p.shape)}:{hashlib.blake2b(raw, digest_size=16).hexdigest()};".encode())
    return sm.CHECKSUM_FORMAT + h.hexdigest()


def test_checksum_follows_in_place_changes():
    bundle = load("tiny-llama")
    first = sm.weights_checksum(bundle, LAYER)
    assert first == independent_checksum(bundle, LAYER)
    weight = bundle.model.get_parameter(bundle.arch.weight_name(0))
    later = bundle.model.get_parameter(bundle.arch.weight_name(LAYER + 1))
    original = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(1.5)
        changed = sm.weights_checksum(bundle, LAYER)
        assert changed != first and changed == independent_checksum(bundle, LAYER)
        with torch.no_grad():
            later.mul_(2.0)  # a later block's weight: the layer's keys do not depend on it
            later.div_(2.0)
        assert sm.weights_checksum(bundle, LAYER) == changed
        weight.data = original.clone()  # storage swapped without an in-place op
        assert sm.weights_checksum(bundle, LAYER) == first
    finally:
        with torch.no_grad():
            weight.copy_(original)


def test_legacy_stamped_file_is_accepted_and_restamped(monkeypatch, tmp_path):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    bundle = load("tiny-llama")
    kw = dict(token_budget=128, seq_len=32, progress=False)
    want = second_moment(bundle, LAYER, **kw)
    path = next((tmp_path / "stats").rglob(f"layer{LAYER}.safetensors"))
    assert path == cache_file(bundle.fingerprint, LAYER, path.parent.name.split("-b")[0], 128, 32)
    with safe_open(str(path), framework="pt") as fh:
        meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items() if k != "content"}
        count = int(fh.get_tensor("count")[0])
    sm._save(path, want, count, {**meta, "weights": sm._legacy_checksum(bundle, LAYER)})  # as written before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recomputation warning
        assert torch.equal(second_moment(bundle, LAYER, **kw), want)
    with safe_open(str(path), framework="pt") as fh:
        assert json.loads(fh.metadata()["weights"]) == sm.weights_checksum(bundle, LAYER)
    # a legacy stamp of other weights is still refused
    sm._save(path, want, count, {**meta, "weights": "0" * 32})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second_moment(bundle, LAYER, **kw)
    assert any("other weights" in str(w.message) for w in caught)


def test_add_outer_equals_a_float64_loop():
    """float32 chunk products summed in float64 equal Σ_t k_t k_tᵀ token by token in float64 (1e-6 of ‖C‖),
    for a token count that is not a multiple of the chunk."""
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(3, 700, 48, generator=g) * torch.linspace(0.1, 3, 48) + 0.5).float()
    want = torch.zeros(48, 48, dtype=torch.float64)
    for row in k.reshape(-1, 48).double():
        want += torch.outer(row, row)
    got = torch.zeros(48, 48, dtype=torch.float64)
    sm.add_outer(got, k, chunk=256)
    assert float((got - want).norm() / want.norm()) < 1e-6
    assert torch.allclose(got.diagonal(), want.diagonal(), rtol=1e-6)
    assert torch.equal(got, got.T)  # symmetric: one product per chunk
