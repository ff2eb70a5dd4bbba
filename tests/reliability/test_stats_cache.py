"""The statistics cache verifies what it reads: a truncated file, a file whose matrix
holds NaN, one whose bytes or metadata no longer match its content digest, or one without a digest (an earlier
editscope's) is recomputed with a warning, never used."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from editscope.stats.second_moment import cache_file, second_moment

BUDGET, SEQ, LAYER = 256, 32, 1


@pytest.fixture
def cached(tiny_llama, monkeypatch, tmp_path):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    fresh = second_moment(tiny_llama, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False)
    files = list((tmp_path / "stats").rglob(f"layer{LAYER}.safetensors"))
    assert len(files) == 1 and cache_file(tiny_llama.fingerprint, LAYER, files[0].parent.name.split("-b")[0],
                                          BUDGET, SEQ) == files[0]
    assert not [p for p in files[0].parent.iterdir() if p.name.endswith(".tmp")]  # written atomically
    return tiny_llama, files[0], fresh


def _rewrite(path, mom2):
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        count = fh.get_tensor("count")
    save_file({"mom2": mom2, "count": count}, str(path), metadata=meta)


def _read_again(bundle, match):
    with pytest.warns(UserWarning, match=match):
        return second_moment(bundle, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False)


def test_truncated_file_is_recomputed(cached):
    bundle, path, fresh = cached
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert torch.equal(_read_again(bundle, "unreadable"), fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten file is sound again
        assert torch.equal(second_moment(bundle, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False), fresh)


def test_nan_file_is_recomputed(cached):
    bundle, path, fresh = cached
    bad = fresh.clone()
    bad[0, 0] = float("nan")
    _rewrite(path, bad)  # keeps the old metadata, so the content checksum no longer matches
    assert torch.equal(_read_again(bundle, "tensor 'mom2' does not match the recorded content digest"), fresh)


@pytest.mark.parametrize("key", ["count", "weights", "content_digest"])
def test_altered_or_missing_metadata_is_recomputed(cached, key):
    from editscope.integrity import DIGEST_KEY

    bundle, path, fresh = cached
    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata())
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    if key == "count":
        tensors["count"] = tensors["count"] + 1  # the sample count: not covered by the old content checksum
        match = "tensor 'count' does not match"
    elif key == "weights":
        meta["weights"] = json.dumps("p1:" + "0" * 32)
        match = "metadata key 'weights' does not match"
    else:
        meta.pop(DIGEST_KEY)
        match = "has no content digest \\(written by an earlier editscope\\); recomputing"
    save_file(tensors, str(path), metadata=meta)
    assert torch.equal(_read_again(bundle, match), fresh)


def test_nan_file_with_a_matching_checksum_is_recomputed(cached):
    from editscope.stats.second_moment import _content_checksum

    bundle, path, fresh = cached
    bad = fresh.clone()
    bad[1, 2] = float("inf")
    with safe_open(str(path), framework="pt") as fh:
        meta = dict(fh.metadata())
        count = fh.get_tensor("count")
    from editscope.integrity import seal

    meta["content"] = json.dumps(_content_checksum(bad))
    tensors = {"mom2": bad, "count": count}
    save_file(tensors, str(path), metadata=seal(meta, tensors))  # past the digest: the finiteness check
    got = _read_again(bundle, "non-finite")
    assert torch.isfinite(got).all() and torch.equal(got, fresh)
