"""The CounterFact stream: both files, de-duplicated by prompt (first kept), the held-out tail never in the stream,
and the general suite's known facts drawn from that tail (so never edited by a run of the stream)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from editscope.data import DATASETS, load_cases
from editscope.data import counterfact_stream as cs
from editscope.data.records import Case, EditRequest
from editscope.paths import data_file
from editscope.suites import get_suite


def raw(name: str) -> list[dict]:
    return json.loads(data_file(name).read_text(encoding="utf-8"))


def case(cid: str, prompt: str) -> Case:
    return Case(cid, "t", (EditRequest("{} x", prompt, "a", "b"),))


def test_dedupe_keeps_the_first_occurrence_in_order():
    cases = [case("1", "A"), case("2", "B"), case("3", "A"), case("4", "C"), case("5", "B")]
    kept, dropped = cs.dedupe_first(cases)
    assert [c.case_id for c in kept] == ["1", "2", "4"] and [c.case_id for c in dropped] == ["3", "5"]


def test_the_stream_is_both_files_first_occurrences_minus_the_held_out_tail():
    records = raw(cs.FILES[0]) + raw(cs.FILES[1])
    assert len(records) == 20000
    # an independent de-duplication of the raw records by their published prompt sentence
    first: dict[str, dict] = {}
    for r in records:
        first.setdefault(r["prompt"], r)
    expected = [str(r["case_id"]) for r in first.values()]
    assert len(expected) == 19732 and cs.dropped_count() == 268
    stream, held = load_cases(cs.STREAM), load_cases(cs.HELDOUT)
    assert [c.case_id for c in stream] == expected[:-cs.HELD_OUT] and len(stream) == 17732
    assert [c.case_id for c in held] == expected[-cs.HELD_OUT:] and len(held) == cs.HELD_OUT
    assert {c.source for c in stream} == {cs.STREAM} and {c.source for c in held} == {cs.HELDOUT}
    texts = Counter(c.request.text for c in stream + held)
    assert max(texts.values()) == 1  # no prompt edited twice, no held-out prompt in the stream
    # the 108 prompts in both files: the edit file's record is the one kept
    edit_prompts = {r["prompt"] for r in raw(cs.FILES[0])}
    both = edit_prompts & {r["prompt"] for r in raw(cs.FILES[1])}
    assert len(both) == 108
    edit_ids = {str(r["case_id"]) for r in raw(cs.FILES[0])}
    kept = {c.request.text: c.case_id for c in stream + held}
    assert all(kept[p] in edit_ids for p in both)
    # slicing as any registered dataset; the registry names the first file
    assert [c.case_id for c in load_cases(cs.STREAM, offset=100, limit=3)] == expected[100:103]
    assert DATASETS[cs.STREAM].path() == data_file(cs.FILES[0])


def test_the_general_suite_draws_its_known_facts_from_the_held_out_tail_only():
    suite = get_suite("general", fact_dataset=cs.HELDOUT, fact_pool=cs.HELD_OUT, facts=200)
    pool = suite.pool.facts()
    stream_prompts = {c.request.text for c in load_cases(cs.STREAM)}
    assert len(pool) == cs.HELD_OUT  # every held-out record has a true answer and a unique prompt
    assert not {f.prompt for f in pool} & stream_prompts
    assert all(f.source.startswith(f"{cs.HELDOUT}:") for f in pool)
    assert cs.HELDOUT in suite.protocol["note"]
    # the suite refuses to probe a run that edits one of its facts (here: a held-out case edited by hand)
    suite._known = [(pool[0].prompt, pool[0].answer)]
    with pytest.raises(Exception, match="edits a fact of the known-fact probe set"):
        suite.probe_many(None, load_cases(cs.HELDOUT, limit=1))  # type: ignore[arg-type]
