"""``editscope stats``: compute on a small corpus (folder of .txt and JSONL field), list, export, import into an
empty cache (round trip bit-exact, read back by second_moments without recomputing), and one-line errors for a
file of another model, wrong dimensions and damaged content."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.stats import second_moments
from editscope.stats.artefact import corpus_from, export_stats, import_stats, list_cached

TEXT = "\n".join(f"The city number {i} lies on the river and has {i * 7} bridges." for i in range(200))
BUDGET, SEQ = 512, 32


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT + "\n")
    return folder


def naive_mom2(bundle, layer, corpus):
    """Independent C: a plain HF forward with output of the MLP down projection's input captured by a hook."""
    from editscope.lm.engine import ScoringEngine
    from editscope.stats import corpus_rows

    rows = corpus_rows(ScoringEngine(bundle), corpus, BUDGET, SEQ)
    keys = []
    down = bundle.model.get_submodule(bundle.arch.layer_module_path(layer, "mlp_out"))
    handle = down.register_forward_pre_hook(lambda _m, a: keys.append(a[0].detach().reshape(-1, a[0].shape[-1])))
    with torch.no_grad():
        bundle.model(input_ids=rows.to(bundle.device))
    handle.remove()
    k = torch.cat(keys).double()
    return (k.T @ k / k.shape[0]).cpu()  # where second_moments returns C


def test_round_trip(corpus_dir, tmp_path, monkeypatch, capsys):
    bundle = load("tiny-llama")
    assert main(["stats", "compute", "--model", "tiny-llama", "--layers", "0", "1", "--corpus", str(corpus_dir),
                 "--budget", str(BUDGET), "--seq-len", str(SEQ)]) == 0
    corpus = corpus_from([corpus_dir])
    first = second_moments(bundle, [0, 1], corpus=corpus, token_budget=BUDGET, seq_len=SEQ, progress=False)
    torch.testing.assert_close(first[1], naive_mom2(bundle, 1, corpus), rtol=1e-4, atol=1e-6)  # fp32, other batches
    listed = list_cached(bundle.fingerprint)
    assert sorted(s.layer for s in listed) == [0, 1]
    assert all(s.tokens == BUDGET and s.corpus == corpus.digest and s.bytes > 0 for s in listed)
    capsys.readouterr()
    assert main(["stats", "list", "--json"]) == 0
    assert sorted(row["layer"] for row in json.loads(capsys.readouterr().out)) == [0, 1]

    out = tmp_path / "stats.safetensors"
    assert main(["stats", "export", "--model", "tiny-llama", "--out", str(out), "--layers", "1"]) == 0
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "other-home"))
    assert list_cached() == []
    assert main(["stats", "import", str(out), "--model", "tiny-llama"]) == 0
    assert [s.layer for s in list_cached()] == [1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a recompute would warn or at least not be read from the cache
        again = second_moments(bundle, [1], corpus=corpus, token_budget=BUDGET, seq_len=SEQ, progress=False)
    assert torch.equal(again[1], first[1])
    assert list_cached()[0].seconds == pytest.approx(next(s for s in listed if s.layer == 1).seconds)


def test_jsonl_field_corpus(corpus_dir, tmp_path):
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": line, "id": i}) + "\n" for i, line in enumerate(TEXT.splitlines())))
    assert corpus_from([jsonl], "text").digest == corpus_from([corpus_dir]).digest  # same text, same corpus key
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(EditscopeError, match=r"bad.jsonl:line 1: field 'text'"):
        corpus_from([bad], "text")


def test_import_refuses_other_models_and_damage(corpus_dir, tmp_path):
    bundle = load("tiny-llama")
    corpus = corpus_from([corpus_dir])
    second_moments(bundle, [1], corpus=corpus, token_budget=BUDGET, seq_len=SEQ, progress=False)
    out = tmp_path / "s.safetensors"
    export_stats(bundle.fingerprint, out)
    with pytest.raises(EditscopeError, match="fingerprint"):
        import_stats(load("tiny-gpt2"), out)
    tensors = load_file(str(out))
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as fh:
        meta = fh.metadata()
    damaged = tmp_path / "damaged.safetensors"
    save_file({**tensors, "layer1.mom2": tensors["layer1.mom2"] * 1.0001}, str(damaged), metadata=meta)
    with pytest.raises(EditscopeError, match=r"tensor 'layer1.mom2' does not match the recorded content digest"):
        import_stats(bundle, damaged)
    from editscope.integrity import DIGEST_KEY, seal

    small = tmp_path / "small.safetensors"  # past the digest (resealed), the shape check holds
    changed = {**tensors, "layer1.mom2": tensors["layer1.mom2"][:4, :4].contiguous()}
    save_file(changed, str(small), metadata=seal(meta, changed))
    with pytest.raises(EditscopeError, match="matrix"):
        import_stats(bundle, small)
    old = tmp_path / "old.safetensors"  # exported by an earlier editscope: no digest
    save_file(tensors, str(old), metadata={k: v for k, v in meta.items() if k != DIGEST_KEY})
    with pytest.raises(EditscopeError, match="has no content digest.*--trust-unverified"):
        import_stats(bundle, old)
    written = import_stats(bundle, old, trust_unverified=True)
    with safe_open(str(written[0]), framework="pt") as fh:
        assert json.loads(fh.metadata()["unverified_source"]) == str(old)
    empty = tmp_path / "x.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(EditscopeError, match="unreadable safetensors"):
        import_stats(bundle, empty)


def test_export_picks_by_token_budget_when_one_layer_is_cached_at_two(corpus_dir, tmp_path, capsys):
    """After ``make demo`` and an edit, one layer is cached at two budgets: ``export`` names both settings with the
    option that picks each, and ``--budget`` exports the chosen one (its tensor, bit-exact)."""
    bundle = load("tiny-llama")
    corpus = corpus_from([corpus_dir])
    small = second_moments(bundle, [1], corpus=corpus, token_budget=BUDGET, seq_len=SEQ, progress=False)[1]
    second_moments(bundle, [1], corpus=corpus, token_budget=2 * BUDGET, seq_len=SEQ, progress=False)
    out = tmp_path / "stats.safetensors"
    with pytest.raises(EditscopeError, match=rf"2 statistics settings .*--budget {BUDGET} \(rows of {SEQ} tokens; "
                                             rf"layers \[1\]\); --budget {2 * BUDGET} "):
        export_stats(bundle.fingerprint, out, layers=[1])
    capsys.readouterr()
    assert main(["stats", "export", "--model", "tiny-llama", "--out", str(out), "--layers", "1",
                 "--budget", str(BUDGET)]) == 0
    assert f"{BUDGET} tokens" in capsys.readouterr().out
    assert torch.equal(load_file(str(out))["layer1.mom2"], small.to(load_file(str(out))["layer1.mom2"].dtype))
