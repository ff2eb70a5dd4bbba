"""Patch files carry a content digest over every tensor and metadata entry, and a checksum of every ΔW: altered or
corrupted bytes, or NaN/inf deltas, are refused on load (naming the file and what did not match) before any weight
changes; files saved without the digest apply only with ``--trust-unverified`` (recorded in the edited folder)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from editscope.cli import main
from editscope.edit import Patch
from editscope.edit.patch import tensor_checksum
from editscope.errors import EditscopeError
from editscope.integrity import DIGEST_KEY, seal


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(model, snapshot) -> bool:
    return all(torch.equal(p.detach(), snapshot[n]) for n, p in model.named_parameters())


@pytest.fixture
def bundle(tiny_bundles):
    return tiny_bundles["llama"]


@pytest.fixture
def patch(bundle) -> Patch:
    params = dict(bundle.model.named_parameters())
    names = [bundle.arch.weight_name(1), bundle.arch.weight_name(2)]
    gen = torch.Generator().manual_seed(0)
    deltas = {n: 1e-3 * torch.randn(params[n].shape, generator=gen) for n in names}
    return Patch(deltas=deltas, method="rome", hparams={}, fingerprint=bundle.fingerprint,
                 checksums={n: tensor_checksum(params[n]) for n in names}, model_name=bundle.name,
                 bases={n: params[n].detach().clone() for n in names})


def _read(path):
    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata()), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def _rewrite(path, change, *, reseal=False):
    """Rewrite a patch file after ``change(meta, tensors)`` (everything else kept as saved); ``reseal``: with a
    content digest recomputed over the changed content (what gets past the digest: the checks behind it)."""
    meta, tensors = _read(path)
    change(meta, tensors)
    save_file(tensors, str(path), metadata=seal(meta, tensors) if reseal else meta)
    return path


def test_saved_patch_records_a_checksum_per_delta(patch, tmp_path):
    meta, tensors = _read(patch.save(tmp_path / "p.safetensors"))
    recorded = json.loads(meta["delta_checksums"])
    assert recorded == {n: tensor_checksum(d) for n, d in patch.deltas.items()}
    assert Patch.load(tmp_path / "p.safetensors").names == patch.names


def test_altered_delta_bytes_are_refused_before_any_weight_changes(bundle, patch, tmp_path):
    name = patch.names[0]

    def one_value(_meta, tensors):
        tensors[name] = tensors[name].clone()
        tensors[name][3, 5] += 0.25  # one changed value, the old metadata kept

    path = _rewrite(patch.save(tmp_path / "p.safetensors"), one_value)
    before = _snapshot(bundle.model)
    with pytest.raises(EditscopeError, match=rf"^{path}: patch: tensor '{name}' does not match the recorded content "
                       "digest") as err:
        Patch.load(path).apply(bundle)
    assert "\n" not in str(err.value)
    out = tmp_path / "edited"
    assert main(["patch", "apply", str(path), "--model", "tiny-llama", "--out", str(out)]) == 2
    assert not out.exists() and not list(tmp_path.glob(".edited.*"))
    assert _same(bundle.model, before) and not bundle.applied


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("with_checksums", [True, False], ids=["checksums-recomputed", "old-format"])
def test_non_finite_delta_is_refused_even_with_a_matching_checksum(bundle, patch, tmp_path, value, with_checksums):
    name = patch.names[1]

    def poison(meta, tensors):  # with a checksum that fits the poisoned bytes, or none at all
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] = value
        meta.pop("delta_checksums")
        if with_checksums:
            meta["delta_checksums"] = json.dumps({n: tensor_checksum(tensors[n]) for n in patch.names})

    path = _rewrite(patch.save(tmp_path / "p.safetensors"), poison, reseal=with_checksums)
    if not with_checksums:
        _rewrite(path, lambda meta, _tensors: meta.pop(DIGEST_KEY))
    before = _snapshot(bundle.model)
    with pytest.raises(EditscopeError, match=rf"^{path}: tensor '{name}': ΔW holds 1 NaN/inf value"):
        Patch.load(path, trust_unverified=True)
    assert _same(bundle.model, before)


def test_in_memory_patch_with_nan_is_refused_before_any_weight_changes(bundle, patch):
    patch.deltas[patch.names[1]][2, 2] = float("nan")  # the second: the first must not have been added either
    before = _snapshot(bundle.model)
    with pytest.raises(EditscopeError, match=rf"patch parameter '{patch.names[1]}': ΔW holds 1 NaN/inf"):
        patch.apply(bundle)
    assert _same(bundle.model, before) and not patch.applied and not bundle.applied


def test_altered_base_tensor_is_refused(patch, tmp_path):
    name = patch.names[0]

    def alter(_meta, tensors):
        tensors["base::" + name] = tensors["base::" + name].clone()
        tensors["base::" + name][1, 1] += 1.0

    path = _rewrite(patch.save(tmp_path / "p.safetensors"), alter)
    with pytest.raises(EditscopeError, match=rf"^{path}: patch: tensor 'base::{name}' does not match the recorded "):
        Patch.load(path)
    _rewrite(path, lambda _meta, _tensors: None, reseal=True)  # past the digest, the pre-edit checksum still holds
    with pytest.raises(EditscopeError, match=rf"^{path}: tensor 'base::{name}': content does not match the pre-edit"):
        Patch.load(path)


def test_delta_checksums_naming_other_tensors_are_refused(patch, tmp_path):
    path = _rewrite(patch.save(tmp_path / "p.safetensors"),
                    lambda meta, _tensors: meta.update(delta_checksums=json.dumps({"x": "y"})), reseal=True)
    with pytest.raises(EditscopeError, match=rf"^{path}: patch metadata: key 'delta_checksums' names \['x'\]"):
        Patch.load(path)


def _old_format(meta, _tensors):  # as an earlier editscope saved it: no content digest, no delta checksums
    meta.pop("delta_checksums")
    meta.pop(DIGEST_KEY)


def test_a_removed_digest_or_delta_checksums_key_is_refused(bundle, patch, tmp_path):
    """Removing a key is damage too: the digest names the missing key; without the digest the file is refused unless
    the user says to trust it, and the message says how to proceed."""
    path = _rewrite(patch.save(tmp_path / "p.safetensors"), lambda meta, _tensors: meta.pop("delta_checksums"))
    with pytest.raises(EditscopeError, match=rf"^{path}: patch: metadata key 'delta_checksums' is missing"):
        Patch.load(path)
    path = _rewrite(patch.save(tmp_path / "q.safetensors"), _old_format)
    with pytest.raises(EditscopeError, match=rf"^{path}: patch has no content digest .* pass --trust-unverified"):
        Patch.load(path)
    out = tmp_path / "edited"
    assert main(["patch", "apply", str(path), "--model", "tiny-llama", "--out", str(out)]) == 2
    assert not out.exists()


def test_patch_requests_and_hparams_are_covered_by_the_digest(patch, tmp_path):
    patch.requests = [{"prompt": "{} is in", "subject": "Paris", "target_new": "Rome"}]
    patch.hparams = {"layers": [1]}
    for key, value in (("requests", json.dumps([{"prompt": "{} is in", "subject": "Paris", "target_new": "Roma"}])),
                       ("hparams", json.dumps({"layers": [2]})), ("method", "memit")):
        path = _rewrite(patch.save(tmp_path / f"{key}.safetensors"),
                        lambda meta, _t, k=key, v=value: meta.update({k: v}))
        with pytest.raises(EditscopeError, match=rf"^{path}: patch: metadata key '{key}' does not match the recorded"):
            Patch.load(path)


def test_old_format_patch_applies_only_when_trusted(bundle, patch, tmp_path):
    path = _rewrite(patch.save(tmp_path / "p.safetensors"), _old_format)
    assert "delta_checksums" not in _read(path)[0]
    before = _snapshot(bundle.model)
    loaded = Patch.load(path, trust_unverified=True)
    loaded.apply(bundle)
    try:
        params = dict(bundle.model.named_parameters())
        for name, delta in patch.deltas.items():
            assert torch.equal(params[name].detach().cpu(), before[name].cpu() + delta.cpu())
    finally:
        loaded.revert(bundle)
    assert _same(bundle.model, before)
    out = tmp_path / "edited"  # and through the CLI, which writes the folder atomically
    assert main(["patch", "apply", str(path), "--model", "tiny-llama", "--out", str(out), "--trust-unverified"]) == 0
    assert json.loads((out / "editscope-patch.json").read_text())["unverified_files"] == [str(path)]
    assert not list(tmp_path.glob(".edited.*"))


def test_patch_apply_writes_its_output_folder_atomically(patch, tmp_path, monkeypatch):
    import transformers

    path = patch.save(tmp_path / "p.safetensors")
    real = transformers.PreTrainedModel.save_pretrained

    def half_then_fail(self, folder, *args, **kwargs):
        real(self, folder, *args, **kwargs)  # the weights land in the temporary folder...
        raise OSError(28, "No space left on device")  # ...then the disk fills up

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", half_then_fail)
    out = tmp_path / "edited"
    assert main(["patch", "apply", str(path), "--model", "tiny-llama", "--out", str(out)]) == 2
    assert not out.exists() and not list(tmp_path.glob(".edited.*"))  # no partial folder, no leftover temp folder
    monkeypatch.undo()
    assert main(["patch", "apply", str(path), "--model", "tiny-llama", "--out", str(out)]) == 0
    assert Patch.load(path).names == patch.names and (out / "config.json").is_file()
