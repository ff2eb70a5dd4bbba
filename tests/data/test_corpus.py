"""data.corpus.Corpus: one class for the layer statistics and the suites, each reader with its own key."""

from __future__ import annotations

import pytest

from editscope.data.corpus import Corpus
from editscope.errors import EditscopeError


def test_paragraphs_and_passages_keep_their_rules(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text(" = Title = \n\nFirst paragraph.\n = National record \n  Second one. \n", encoding="utf-8")
    corpus = Corpus.from_files([text])
    assert list(corpus.paragraphs()) == ["First paragraph.", "Second one."]
    assert corpus.passages == ["First paragraph.", "= National record", "Second one."]
    assert corpus.passages_with("Second") == ["Second one."]
    assert corpus.passages_with("Sec") == []  # word boundaries


def test_keys_depend_on_content_and_order(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n")
    b.write_text("two\n")
    ab, ba = Corpus([a, b]), Corpus([b, a])
    assert ab.digest != ba.digest and ab.sha256 != ba.sha256
    assert len(ab.digest) == 24 and len(ab.sha256) == 64
    assert Corpus([a, b]).files == (a, b)


def test_missing_file_fails_when_read_or_at_once_with_from_files(tmp_path):
    lazy = Corpus([tmp_path / "missing.txt"])  # a suite that never reads its corpus needs no file
    with pytest.raises(EditscopeError, match="corpus file not found: .*missing.txt"):
        _ = lazy.passages
    with pytest.raises(EditscopeError, match="corpus file not found"):
        Corpus.from_files([tmp_path / "missing.txt"])
    with pytest.raises(EditscopeError, match="corpus: no files given"):
        Corpus.from_files([])


def test_the_shipped_default_corpus_is_the_data_folders_wikitext_byte_for_byte():
    """The package's gzip copies give the same text, digests and readings as the shared data folder's files, so
    statistics cached from either serve the other."""
    from editscope.data.corpus import DEFAULT_FILES
    from editscope.paths import data_dir

    shipped = Corpus.default()
    folder = Corpus.from_files([data_dir() / "corpus" / p.name.removesuffix(".gz") for p in DEFAULT_FILES])
    assert all(p.suffix == ".gz" and p.is_file() for p in shipped.files)
    assert (shipped.digest, shipped.sha256) == (folder.digest, folder.sha256)
    assert shipped.passages == folder.passages and list(shipped.paragraphs()) == list(folder.paragraphs())
