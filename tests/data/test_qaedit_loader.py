"""QAEdit: the shared 1k sample, hand-checked records, the subject's place in the question, and malformed copies
that fail with one line naming file, record and field."""

from __future__ import annotations

from collections import Counter

import pytest

from editscope.data import DATASETS, detect_format, load_cases
from editscope.data.qaedit import load_qaedit, subject_position
from editscope.data.records import Case, EditRequest
from editscope.errors import DataError

QAEDIT = "qaedit/QAEdit_inter_1k.json"


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load_cases("qaedit")


def test_count_ids_and_sources(cases, manifest_records):
    assert "qaedit" in DATASETS and DATASETS["qaedit"].file == QAEDIT
    assert len(cases) == manifest_records(QAEDIT) == 1000
    assert len({c.case_id for c in cases}) == 1000
    assert Counter(c.extra["qa_source"] for c in cases) == {"SQA": 389, "TQA": 364, "NQ": 247}
    assert all(c.source == "qaedit" for c in cases)
    assert all(len(c.neighborhood) == 5 and len(c.paraphrase_prompts) == 1 for c in cases)


def test_record_0_values(cases):
    case = cases[0]
    assert case.case_id == "NQ-1104"
    assert case.request == EditRequest(
        prompt="who has the {}?",
        subject="most 70 point games in nba history",
        target_new="Wilt Chamberlain *",  # published with the footnote mark; kept
        target_true=None,
    )
    assert case.request.subject_in_prompt
    assert case.request.text == "who has the most 70 point games in nba history?"
    assert case.paraphrase_prompts == [
        "Which NBA player holds the record for the most games scoring 70 points or more?"]
    assert case.neighborhood == [
        ("who is the saint that protects police officers", "Michael"),
        ("who does spencer end up with in the books", "Toby"),
        ("who wrote i could fall in love by selena", "Keith Thomas"),
        ("when did the us host the world cup", "1994"),
        ("name 5 aircraft used by the indian army", "MiG-21"),
    ]
    assert case.extra == {"qa_source": "NQ", "qaedit_id": 1104}


def test_record_1_and_the_last_record(cases):
    sqa = cases[1]
    assert sqa.case_id == "SQA-2334"
    assert sqa.request.prompt == "What was the only year the {} was released?"
    assert (sqa.request.subject, sqa.request.target_new) == ("LEGO part with ID gal56", "2002")
    assert sqa.neighborhood[4] == ("when was the first us space shuttle launched", "12 April 1981")
    last = cases[-1]
    assert last.case_id == "TQA-3384"
    assert last.request.prompt == "In Indian cuisine, the term {} refers to what aspect of meat/vegetable cooking?"
    assert last.neighborhood[3] == ("what chapter does diamond no ace season 2 end", 'Seek Diamonds!"')


def test_ids_repeat_across_sources_and_case_ids_tell_them_apart(cases):
    assert (cases[56].case_id, cases[726].case_id) == ("SQA-4324", "TQA-4324")
    assert cases[56].extra["qaedit_id"] == cases[726].extra["qaedit_id"] == 4324
    assert sum(n > 1 for n in Counter(c.extra["qaedit_id"] for c in cases).values()) == 37


def test_targets_are_stripped(cases):
    assert cases[28].request.target_new == "24,303.04"  # published as " 24,303.04"
    assert cases[565].request.target_new == "In 1976."  # published as "In 1976. "
    assert all(c.request.target_new == c.request.target_new.strip() for c in cases)


def test_every_published_prompt_contains_its_subject(cases):
    assert sum(not c.request.subject_in_prompt for c in cases) == 0
    assert all(c.request.prompt.count("{}") == 1 for c in cases)


def test_the_subject_slot_prefers_a_whole_word(cases):
    tandoor = cases[326].request
    assert tandoor.subject == "tandoor"
    assert tandoor.prompt == ("In Indian cookery, dishes known as 'tandoori' are so named because their preparation "
                              "involves a {}. What is a tandoor ?")
    # a subject run into the next word (a typo of the published question) is found where it is
    hardy = cases[983].request
    assert hardy.prompt == "In which {}novel does the character 'John Loveday' appear?"
    assert subject_position("cells divide to make new cells", "cells") == 0
    assert subject_position("Ernie by Ernest", "Ernie") == 0
    assert subject_position("catalogue of cat", "cat") == 13
    assert subject_position("catalogue of cats", "cat") == 0  # no whole-word occurrence: the first one
    assert subject_position("Who?", "Paris") is None


def test_a_prompt_without_its_subject_keeps_both(write_json, shared_records):
    records = shared_records(QAEDIT, 2)
    records[1]["subject"] = "The LEGO Group"
    cases = load_qaedit(write_json(records))
    request = cases[1].request
    assert request.subject_in_prompt is False
    assert request.subject == "The LEGO Group"  # as published, not replaced by anything found in the question
    assert request.prompt == request.text == "What was the only year the LEGO part with ID gal56 was released?"
    assert "{}" not in request.prompt
    assert cases[0].request.subject_in_prompt is True
    records[1]["subject"] = "lego part with id gal56"  # the match is case-sensitive
    assert load_qaedit(write_json(records))[1].request.subject_in_prompt is False


def test_edit_request_without_a_subject_slot_is_checked():
    with pytest.raises(ValueError, match="has no '{}' slot"):
        EditRequest("Who wrote {}?", "Hamlet", "Shakespeare", subject_in_prompt=False)
    with pytest.raises(ValueError, match="exactly one"):
        EditRequest("Who wrote Hamlet?", "Hamlet", "Shakespeare")
    with pytest.raises(ValueError, match="subject_in_prompt: expected a bool"):
        EditRequest("Who wrote {}?", "Hamlet", "Shakespeare", subject_in_prompt=1)


def test_format_detection_and_load_by_path(write_json, shared_records):
    records = shared_records(QAEDIT, 3)
    assert detect_format(records[0], "x").name == "qaedit"
    path = write_json(records, "sample.json")
    cases = load_cases(path)
    assert [c.case_id for c in cases] == ["NQ-1104", "SQA-2334", cases[2].case_id]
    assert [c.source for c in cases] == ["sample.json"] * 3
    by_name = load_cases("qaedit", limit=3)
    for a, b in zip(by_name, cases, strict=True):
        b.source = a.source
        assert a == b


def test_a_case_id_field_wins(write_json, shared_records):
    records = shared_records(QAEDIT, 2)
    records[0]["case_id"] = "mine"
    assert [c.case_id for c in load_qaedit(write_json(records))] == ["mine", "SQA-2334"]


def _set(key, value):
    return lambda r: r.__setitem__(key, value)


@pytest.mark.parametrize(("change", "field", "problem"), [
    (lambda r: r.pop("target"), "target", "missing"),
    (lambda r: r.pop("subject"), "subject", "missing"),
    (lambda r: r.pop("rephrase"), "rephrase", "missing"),
    (lambda r: r.pop("source"), "source", "missing"),
    (lambda r: r.pop("id"), "id", "missing"),
    (_set("rephrase", 7), "rephrase", "expected a non-empty string, got int"),
    (_set("prompt", ["who?"]), "prompt", "expected a non-empty string, got list"),
    (_set("target", "   "), "target", "expected a non-empty string, got a blank string"),
    (_set("subject", ""), "subject", "expected a non-empty string, got an empty string"),
    (_set("id", True), "id", "expected an int or a non-empty string, got bool"),
    (_set("source", None), "source", "expected a non-empty string, got null"),
    (_set("locality", []), "locality", "expected a non-empty list, got an empty list"),
    (_set("locality", {"loc": "q", "loc_ans": "a"}), "locality", "expected a list of objects, got object"),
    (_set("locality", ["q"]), "locality[0]", "expected an object, got string"),
    (lambda r: r["locality"][2].pop("loc_ans"), "locality[2].loc_ans", "missing"),
    (lambda r: r["locality"][4].__setitem__("loc", 3.5), "locality[4].loc", "expected a non-empty string, got float"),
    (lambda r: r["locality"][0].__setitem__("loc_ans", ""), "locality[0].loc_ans",
     "expected a non-empty string, got an empty string"),
    (_set("prompt", "who has the {} most 70 point games in nba history?"), "prompt",
     "already holds '{}', cannot make a template of 'who has the {} most 70 point games in nba history?'"),
    (_set("rephrase", "bad \ud83d text"), "rephrase",
     "contains a lone surrogate U+D83D at character 4 (not valid text)"),
])
def test_a_malformed_record_names_file_record_and_field(write_json, shared_records, change, field, problem):
    records = shared_records(QAEDIT, 3)
    change(records[1])
    path = write_json(records)
    with pytest.raises(DataError) as info:
        load_cases(path)
    assert str(info.value) == f"{path}:record 1: field {field}: {problem}"
    assert (info.value.record, info.value.field) == (1, field)
    with pytest.raises(DataError) as direct:
        load_qaedit(path)
    assert str(direct.value) == str(info.value)


def test_a_repeated_source_and_id_is_refused(write_json, shared_records):
    records = shared_records(QAEDIT, 3)
    records[2]["source"], records[2]["id"] = "NQ", 1104
    path = write_json(records)
    with pytest.raises(DataError) as info:
        load_qaedit(path)
    assert str(info.value) == f"{path}:record 2: field id: duplicate case id 'NQ-1104' (first at record 0)"
