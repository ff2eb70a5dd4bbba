"""The chain checkpoint file: the folded ΔW restores the chained weights bit for bit (also where W₀ + ΔW rounds
differently from the chained sum), an altered file is refused, and the editor states round-trip through their
declared state_dict."""

from __future__ import annotations

import pytest
import torch

from editscope.edit.alphaedit import AlphaEditState
from editscope.edit.patch import Patch, tensor_checksum
from editscope.edit.prune import PruneState
from editscope.edit.state import NoState
from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.run.chain import ChainCheckpoint


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().view(torch.int32)


def patch_on(bundle, deltas: dict[str, torch.Tensor]) -> Patch:
    params = dict(bundle.model.named_parameters())
    return Patch(deltas=deltas, method="synthetic", hparams={}, fingerprint=bundle.fingerprint,
                 checksums={n: tensor_checksum(params[n]) for n in deltas})


def test_checkpoint_restores_a_folded_chain_bit_exact(tmp_path):
    bundle = load("tiny-llama")
    names = [bundle.arch.weight_name(layer) for layer in range(bundle.n_layers)]
    params = dict(bundle.model.named_parameters())
    loaded = {n: bits(params[n]) for n in params}
    gen = torch.Generator().manual_seed(5)
    digests = []
    state = PruneState({"x": torch.randn(3, 4, dtype=torch.float64, generator=gen)},
                       {"x": torch.randn(3, 4, dtype=torch.float64, generator=gen)}, {"x": 1.25})
    with bundle.folding():
        for i in range(8):  # several patches per parameter, |Δ| from 1e-4·|W| to larger than W
            name = names[i % len(names)]
            scale = params[name].detach().abs().mean() * 10.0 ** (i % 5 - 3)
            delta = torch.randn(params[name].shape, generator=gen).to(scale.device) * scale
            patch = patch_on(bundle, {name: delta})
            patch.apply(bundle)
            digests.append(patch.digest)
            bundle.fold(patch)
        chained = {n: bits(params[n]) for n in params}
        assert len(bundle.applied) == 1  # the folded patches are one entry, not one per patch
        fingerprint = bundle.fingerprint
        ckpt = ChainCheckpoint.capture(bundle, state, {"round": 8, "edits_applied": 8})
    # the naive rebuild W₀ + ΔW misses some entries by an ulp: the file keeps those exactly
    assert sum(index.numel() for index, _ in ckpt.exact.values()) > 0
    path = ckpt.save(tmp_path / "c.safetensors")
    assert all(torch.equal(bits(params[n]), loaded[n]) for n in params)
    back = ChainCheckpoint.load(path)
    with bundle.folding():
        back.restore(bundle, str(path), digests)
        assert all(torch.equal(bits(params[n]), chained[n]) for n in params)
        assert bundle.fingerprint == fingerprint  # the restored weights keep the chain's name
    assert all(torch.equal(bits(params[n]), loaded[n]) for n in params)
    restored = PruneState.from_state_dict(back.state_tensors, back.state_meta, "c")
    assert restored.sigma_max == {"x": 1.25}
    assert all(torch.equal(restored.accumulated[k], state.accumulated[k]) for k in state.accumulated)
    assert all(torch.equal(restored.applied[k], state.applied[k]) for k in state.applied)
    # the folded ΔW is a patch on the loaded weights: it refuses other weights
    with torch.no_grad():
        params[names[0]].add_(1.0)
    with bundle.folding(), pytest.raises(EditscopeError, match="not in the state this patch was computed on"):
        back.restore(bundle, str(path))


def test_an_altered_checkpoint_is_refused(tmp_path):
    bundle = load("tiny-llama")
    name = bundle.arch.weight_name(0)
    with bundle.folding():
        patch = patch_on(bundle, {name: torch.full_like(dict(bundle.model.named_parameters())[name], 1e-3)})
        patch.apply(bundle)
        bundle.fold(patch)
        path = ChainCheckpoint.capture(bundle, NoState(), {"round": 1, "edits_applied": 1}).save(tmp_path / "c.st")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # a byte of the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(EditscopeError, match="does not match the recorded content digest"):
        ChainCheckpoint.load(path)
    (tmp_path / "junk").write_text("not safetensors")
    with pytest.raises(EditscopeError, match="not a readable chain checkpoint"):
        ChainCheckpoint.load(tmp_path / "junk")


def test_alphaedit_state_round_trips_and_checks_its_entries():
    gen = torch.Generator().manual_seed(1)
    state = AlphaEditState({3: torch.randn(4, 4, dtype=torch.float64, generator=gen)},
                           {3: torch.randn(4, 4, dtype=torch.float64, generator=gen)}, {3: 2}, 12)
    tensors, meta = state.state_dict()
    assert set(tensors) == {"projection.3", "cache_c.3"} and meta == {"null_dims": {"3": 2}, "n_edits": 12}
    back = AlphaEditState.from_state_dict(tensors, meta, "f")
    assert (back.null_dims, back.n_edits) == ({3: 2}, 12)
    assert torch.equal(back.projections[3], state.projections[3]) and torch.equal(back.cache_c[3], state.cache_c[3])
    with pytest.raises(EditscopeError, match=r"f: editor state: missing tensor\(s\) \['cache_c.3'\]"):
        AlphaEditState.from_state_dict({"projection.3": tensors["projection.3"]}, meta, "f")
    with pytest.raises(EditscopeError, match="metadata key 'n_edits' is missing"):
        AlphaEditState.from_state_dict(tensors, {"null_dims": {"3": 2}}, "f")
    with pytest.raises(EditscopeError, match="unexpected tensor"):
        NoState.from_state_dict({"x": torch.zeros(1)}, {}, "f")


def test_stored_pre_probes_come_back_equal_and_only_under_their_key(tmp_path):
    """The pre probes a chained group stores read back equal (numpy scalars as the numbers they hold), under the key
    they were stored with only; a probe with a non-finite value is not stored; a file that is not one is named."""
    import numpy as np

    from editscope.run.chain import load_pre_probes, pre_path, save_pre_probes
    from editscope.run.trial import Probes

    path = pre_path(tmp_path, "counterfact", 3)
    assert path.parent.name == "chains" and path.suffix == ".json"
    probes = Probes({"counterfact": [{"lp": [-1.25, -0.1], "n": np.int64(4), "ids": (7, 8)}, None],
                     "wild": [{"answer": "Paris"}, None]}, 0.5)
    key = ["digest", "fingerprint", "counterfact", 3, ("a", "b"), (0,), 2]
    assert load_pre_probes(path, key) == (None, None)  # no file yet
    assert save_pre_probes(path, key, probes)
    got, problem = load_pre_probes(path, key)
    assert problem is None and got.seconds == 0.5
    assert got.by_suite == {"counterfact": [{"lp": [-1.25, -0.1], "n": 4, "ids": [7, 8]}, None],
                            "wild": [{"answer": "Paris"}, None]}
    assert load_pre_probes(path, key[:-1] + [3]) == (None, "stored for another config, model, group or case set")
    path.write_text("[1, 2]")
    assert load_pre_probes(path, key) == (None, "not a JSON object")
    path.unlink()
    assert not save_pre_probes(path, key, Probes({"counterfact": [{"lp": [float("-inf")]}]}, 0.1))
    assert not path.exists()
