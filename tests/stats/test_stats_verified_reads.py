"""A statistics cache file is verified (seal and content checksum) once per process: a second read of the same,
unchanged file skips both digests and returns the same C; any write since, or a file modified just before it was
verified (a clock tick could hide a second write), is verified again."""

from __future__ import annotations

import importlib
import os
import time

import pytest
import torch

import editscope.integrity as integrity

sm = importlib.import_module("editscope.stats.second_moment")  # the package's `second_moment` is the function

BUDGET, SEQ, LAYER = 256, 32, 1


@pytest.fixture
def counted(tiny_bundles, monkeypatch, tmp_path):
    """A cache file written 10 s ago, and counters of the two digest computations (the real functions run)."""
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    monkeypatch.setattr(sm, "_VERIFIED", sm._VerifiedFiles())
    tiny_llama = tiny_bundles["llama"]
    fresh = sm.second_moment(tiny_llama, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False)
    (path,) = (tmp_path / "stats").rglob(f"layer{LAYER}.safetensors")
    _age(path, 10)
    calls = {"verify": 0, "content": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(sm, "verify", counting("verify", integrity.verify))
    monkeypatch.setattr(sm, "_content_checksum", counting("content", sm._content_checksum))
    return tiny_llama, path, fresh, calls


def _age(path, seconds: float) -> None:
    then = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(then, then))


def _read(bundle):
    return sm.second_moment(bundle, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False)


def test_a_second_read_of_an_unchanged_file_computes_no_digest(counted):
    bundle, _path, fresh, calls = counted
    first = _read(bundle)
    assert calls == {"verify": 1, "content": 1} and torch.equal(first, fresh)
    for _ in range(3):
        assert torch.equal(_read(bundle), fresh)
    assert calls == {"verify": 1, "content": 1}


def test_a_write_after_the_verified_read_is_verified_and_a_damaged_file_recomputed(counted):
    bundle, path, fresh, calls = counted
    _read(bundle)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a byte of C's data (the tensors follow the header)
    path.write_bytes(bytes(data))
    _age(path, 5)  # another (older) modification time: the stamp changed
    with pytest.warns(UserWarning, match="does not match"):
        again = _read(bundle)
    assert torch.equal(again, fresh) and calls["verify"] > 1  # verified again (twice: before and under the lock)


def test_a_file_modified_just_before_its_verification_is_verified_again(counted):
    bundle, path, fresh, calls = counted
    os.utime(path)  # modified now: within a clock tick of the read, so not remembered
    _read(bundle)
    _read(bundle)
    assert calls == {"verify": 2, "content": 2}
