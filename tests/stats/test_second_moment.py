"""Layer key statistics: values against a naive per-token loop, cache equality and keys, early stop."""

from __future__ import annotations

import time

import pytest
import torch

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture, hooks
from editscope.stats import Corpus, accumulate, cache_file, corpus_rows, second_moments
from editscope.stats.second_moment import second_moment

BUDGET, SEQ = 256, 32


@pytest.fixture
def stats_home(tiny_bundles, monkeypatch, tmp_path):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    return tmp_path


def naive_second_moment(bundle, rows: torch.Tensor, layer: int) -> torch.Tensor:
    """One full forward per row, then Σ_t k_t k_tᵀ token by token (float64) / N."""
    dim = bundle.arch.mlp_size(bundle.config)
    total = torch.zeros(dim, dim, dtype=torch.float64, device=bundle.device)
    n = 0
    name = f"blocks.{layer}.mlp_key"
    for row in rows:
        with torch.no_grad(), capture(bundle.model, bundle.arch, [name]) as store:
            bundle.model(input_ids=row[None].to(bundle.device))
        for k in store[name][0]:
            total += torch.outer(k.double(), k.double())
            n += 1
    return (total / n).cpu()  # where second_moments returns C


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_matches_naive_loop(tiny_bundles, stats_home, family):
    bundle = tiny_bundles[family]
    rows = corpus_rows(ScoringEngine(bundle), Corpus.default(), BUDGET, SEQ)
    assert rows.shape == (BUDGET // SEQ, SEQ)
    got = second_moments(bundle, [1, 2], token_budget=BUDGET, seq_len=SEQ, progress=False)
    for layer in (1, 2):
        want = naive_second_moment(bundle, rows, layer)
        assert got[layer].dtype == torch.float64
        assert torch.allclose(got[layer], want, rtol=1e-5, atol=1e-7)
        assert torch.allclose(got[layer], got[layer].T)
        assert torch.linalg.eigvalsh(got[layer]).min() > -1e-8  # PSD


def test_cache_equals_fresh_and_is_instant(tiny_bundles, stats_home):
    bundle = tiny_bundles["llama"]
    first = second_moment(bundle, 2, token_budget=BUDGET, seq_len=SEQ, progress=False)
    path = cache_file(bundle.fingerprint, 2, Corpus.default().digest, BUDGET, SEQ)
    assert path.is_file() and path.read_bytes()[:8] != b"\x80\x04\x95"  # safetensors, not a pickle
    t0 = time.perf_counter()
    cached = second_moment(bundle, 2, token_budget=BUDGET, seq_len=SEQ, progress=False)
    assert time.perf_counter() - t0 < 0.5
    fresh = second_moment(bundle, 2, token_budget=BUDGET, seq_len=SEQ, progress=False, use_cache=False)
    assert torch.equal(first, cached) and torch.equal(cached, fresh)
    # the budget is part of the key: another budget is another file and another value
    other = second_moment(bundle, 2, token_budget=2 * BUDGET, seq_len=SEQ, progress=False)
    assert cache_file(bundle.fingerprint, 2, Corpus.default().digest, 2 * BUDGET, SEQ).is_file()
    assert not torch.equal(other, first)


def test_a_file_of_another_setting_copied_into_the_cache_is_recomputed(tiny_bundles, stats_home):
    """A sound, sealed statistics file of another token budget (or layer) copied into this setting's cache folder is
    not used: it records what it was built for, and the read compares it (one warning line, then recomputed)."""
    import shutil

    bundle = tiny_bundles["llama"]
    small = second_moment(bundle, 2, token_budget=BUDGET, seq_len=SEQ, progress=False)
    big = second_moment(bundle, 2, token_budget=2 * BUDGET, seq_len=SEQ, progress=False)
    assert not torch.equal(small, big)
    target = cache_file(bundle.fingerprint, 2, Corpus.default().digest, 2 * BUDGET, SEQ)
    shutil.copyfile(cache_file(bundle.fingerprint, 2, Corpus.default().digest, BUDGET, SEQ), target)
    with pytest.warns(UserWarning, match=r"was built for token_budget 256, not 512 \(a file of another setting\); "
                                         "recomputing"):
        again = second_moment(bundle, 2, token_budget=2 * BUDGET, seq_len=SEQ, progress=False)
    assert torch.equal(again, big)
    shutil.copyfile(cache_file(bundle.fingerprint, 2, Corpus.default().digest, BUDGET, SEQ),
                    cache_file(bundle.fingerprint, 1, Corpus.default().digest, BUDGET, SEQ))
    with pytest.warns(UserWarning, match="was built for layer 2, not 1"):
        second_moment(bundle, 1, token_budget=BUDGET, seq_len=SEQ, progress=False)


def test_corpus_hash_is_part_of_the_key(tiny_bundles, stats_home, tmp_path):
    bundle = tiny_bundles["llama"]
    text = tmp_path / "c.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 200)
    corpus = Corpus.from_files([text])
    a = second_moment(bundle, 1, corpus=corpus, token_budget=BUDGET, seq_len=SEQ, progress=False)
    b = second_moment(bundle, 1, token_budget=BUDGET, seq_len=SEQ, progress=False)
    assert corpus.digest != Corpus.default().digest
    assert not torch.allclose(a, b)
    text.write_text("Completely different text about rivers and mountains.\n" * 200)
    assert Corpus.from_files([text]).digest != corpus.digest


def test_forward_stops_after_last_layer(tiny_bundles):
    bundle = tiny_bundles["llama"]
    rows = torch.randint(0, 1000, (2, 16))
    calls = {"after": 0, "at": 0}

    def count(key):
        def fn(_x):
            calls[key] += 1

        return fn

    with hooks(bundle.model, bundle.arch, {"blocks.2.resid_post": count("after"), "blocks.1.resid_post": count("at")}):
        sums, n = accumulate(bundle, rows, [0, 1], batch_rows=1, progress=False)
    assert n == 32 and calls == {"after": 0, "at": 0}  # stopped inside block 1 (at its MLP key)
    with hooks(bundle.model, bundle.arch, {"blocks.2.resid_post": count("after")}):
        accumulate(bundle, rows, [2], batch_rows=2, progress=False)
    assert calls["after"] == 0


def test_errors(tiny_bundles, tmp_path):
    with pytest.raises(EditscopeError, match="corpus file not found"):
        Corpus.from_files([tmp_path / "missing.txt"])
    with pytest.raises(EditscopeError, match="out of range"):
        accumulate(tiny_bundles["llama"], torch.zeros(1, 4, dtype=torch.long), [9], progress=False)
