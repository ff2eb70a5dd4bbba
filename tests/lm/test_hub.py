"""Models by hub id, offline: a snapshot-style hub cache folder (refs/main + snapshots/HASH,
written with save_pretrained) loads with HF_HUB_OFFLINE=1 and gives the same logits as the original; an id
not in the cache is a one-line error saying how to pass a local folder; no hparams file: derived (KN: --hparams)."""

from __future__ import annotations

import huggingface_hub.constants
import pytest
import torch

from editscope.edit import get_editor
from editscope.edit.hparams import DerivedHParamsWarning
from editscope.errors import EditscopeError
from editscope.lm import load

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_hub(tmp_path, monkeypatch, tiny_bundles):
    hub = tmp_path / "hub"
    repo = hub / "models--tinyorg--tiny-llama"
    snapshot = repo / "snapshots" / COMMIT
    tiny_bundles["llama"].model.save_pretrained(snapshot)
    tiny_bundles["llama"].tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))  # read at call time
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


def test_hub_id_loads_from_cache_offline(offline_hub, tiny_bundles):
    bundle = load("tinyorg/tiny-llama")
    assert bundle.name == "tinyorg/tiny-llama"
    ids = torch.tensor([[464, 3139, 286, 4881, 318]], device=bundle.device)
    with torch.no_grad():
        got = bundle.model(input_ids=ids).logits
        want = tiny_bundles["llama"].model(input_ids=ids).logits
    assert torch.equal(got, want)
    with pytest.warns(DerivedHParamsWarning, match=r"--hparams"):  # no shipped file: derived, floor(5 * 4 / 32)
        assert get_editor("rome").load_hparams(bundle).layers == [0]
    with pytest.raises(EditscopeError, match=r"--hparams"):  # KN has no derivation rule
        get_editor("kn").load_hparams(bundle)


def test_uncached_hub_id_offline_is_one_line(offline_hub):
    with pytest.raises(EditscopeError) as info:
        load("tinyorg/absent-model")
    message = str(info.value)
    assert "HF_HUB_OFFLINE=1" in message and "--model DIR" in message and "\n" not in message
