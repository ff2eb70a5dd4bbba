"""Co-occurrence counts for the 1-to-N gold distribution against a naive count on a hand-written corpus."""

from __future__ import annotations

import json
import re

import pytest

from editscope.data.corpus import Corpus
from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.suites.one_to_n import CooccurrenceCounter, OneToNSuite

pytestmark = pytest.mark.usefixtures("private_home")

CORPUS = """ = Europe =

 Turkey borders Greece and Bulgaria . Greece is Hellenic .
 Georgia is east of Turkey. Armenia too! Turkey's neighbour Iran borders Iraq .

 = = Other = =

 Turkeys are birds ; Greece is far from them .
 Bulgaria and Greece , not Turkey .
 Iran and Iraq border each other . Syria too .
"""

SUBJECT = "Turkey"
ANSWERS = ["Greece", "Bulgaria", "Georgia (country)", "Iran", "Iraq", "Syria", "Armenia", "Hellenic"]


def words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def contains(text: str, phrase: str) -> bool:
    """Naive: the phrase's words appear as a contiguous run of the text's words."""
    t, p = words(text), words(phrase)
    return any(t[i:i + len(p)] == p for i in range(len(t) - len(p) + 1))


def naive_counts(windows, subject, answers):
    bare = [a.split(" (")[0] for a in answers]
    return [sum(1 for w in windows if contains(w, subject) and contains(w, a)) for a in bare]


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def test_passage_counts_equal_naive(corpus_file):
    counter = CooccurrenceCounter(Corpus([corpus_file]), "passage")
    passages = [ln.strip() for ln in CORPUS.splitlines() if ln.strip() and not ln.strip().startswith("=")]
    assert counter.corpus.passages == passages
    got = counter.counts(SUBJECT, ANSWERS)
    assert got == naive_counts(passages, SUBJECT, ANSWERS)
    # by hand: Greece in passages 1 and 4 ("Turkeys" in 3 is not "Turkey"), Georgia via its qualifier-free form
    assert got == [2, 2, 1, 1, 1, 0, 1, 1]


def test_sentence_counts_equal_naive(corpus_file):
    counter = CooccurrenceCounter(Corpus([corpus_file]), "sentence")
    passages = Corpus([corpus_file]).passages
    sentences = [s for p in passages for s in re.split(r"(?<=[.!?])\s+", p) if s.strip()]
    got = counter.counts(SUBJECT, ANSWERS)
    assert got == naive_counts(sentences, SUBJECT, ANSWERS)
    assert got == [2, 2, 1, 1, 1, 0, 0, 0]  # "Greece is Hellenic ." has no Turkey; "Armenia too!" is its own


def test_counts_cached_on_disk_by_corpus_hash(corpus_file, tmp_path, monkeypatch):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    counter = CooccurrenceCounter(Corpus([corpus_file]))
    counter.counts(SUBJECT, ANSWERS)
    counter.flush()
    stored = json.loads(counter.path.read_text())
    assert counter.path.name.startswith(Corpus([corpus_file]).sha256)
    assert stored[f"{SUBJECT}\x1fGreece"] == 2
    # a new counter is served from disk (a planted value proves no recount happened)
    stored[f"{SUBJECT}\x1fGreece"] = 99
    counter.path.write_text(json.dumps(stored))
    assert CooccurrenceCounter(Corpus([corpus_file])).counts(SUBJECT, ["Greece"]) == [99]
    # another corpus has another key
    other = tmp_path / "other.txt"
    other.write_text(CORPUS + " Turkey and Greece .\n", encoding="utf-8")
    assert CooccurrenceCounter(Corpus([other])).counts(SUBJECT, ["Greece"]) == [3]


def test_gold_block_counts_and_uniform_fallback(corpus_file):
    suite = OneToNSuite(corpus=[corpus_file])
    case = Case("c", "test", (EditRequest("{} shares border with", "Turkey", "Chad", "Greece"),),
                valid_answers=["Greece", "Bulgaria", "Syria"])
    gold = suite.gold(case)
    assert gold["counts"] == [2, 2, 0] and gold["source"] == "counts"
    assert gold["weights"] == pytest.approx([0.5, 0.5, 0.0])
    nobody = Case("d", "test", (EditRequest("{} is in", "Atlantis", "X", "Y"),), valid_answers=["Greece", "Iran"])
    gold = suite.gold(nobody)
    assert gold["source"] == "uniform" and gold["weights"] == [0.5, 0.5]


def test_bad_window_is_an_error(corpus_file):
    with pytest.raises(EditscopeError, match="window"):
        CooccurrenceCounter(Corpus([corpus_file]), "paragraphs")  # type: ignore[arg-type]
