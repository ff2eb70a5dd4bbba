"""CounterFact loaders: the shared EasyEdit files, the ROME-format fixture, and malformed copies."""

from __future__ import annotations

import json
import re

import pytest

from editscope.data import load_cases
from editscope.data.counterfact import load_counterfact
from editscope.data.records import Case, EditRequest
from editscope.errors import DataError

EDIT = "counterfact/counterfact-edit.json"


@pytest.fixture(scope="module")
def edit_cases() -> list[Case]:
    return load_cases("counterfact")


@pytest.fixture(scope="module")
def cases_1k() -> list[Case]:
    return load_cases("counterfact-1k")


def test_counts_match_manifest(edit_cases, cases_1k, manifest_records):
    assert len(edit_cases) == manifest_records(EDIT) == 10_000
    assert len(cases_1k) == manifest_records("counterfact/counterfact-edit-1k.json") == 1_000
    assert len(load_cases("counterfact-train")) == manifest_records("counterfact/counterfact-train.json")


def test_case_0_values(edit_cases):
    case = edit_cases[0]
    assert case.case_id == "0"
    assert case.source == "counterfact"
    assert case.request == EditRequest(
        prompt="The mother tongue of {} is", subject="Danielle Darrieux", target_new="English", target_true="French"
    )
    assert case.request.text == "The mother tongue of Danielle Darrieux is"
    assert case.paraphrase_prompts == ["Where Danielle Darrieux is from, people speak the language of"]
    assert case.neighborhood == [("Michel Rocard is a native speaker of", "French")]
    assert case.valid_answers == case.hard_false == case.random_false == case.generation_prompts == []


def test_every_template_rebuilds_its_published_prompt(edit_cases, shared_records):
    raw = shared_records(EDIT)
    assert [c.request.text for c in edit_cases] == [r["prompt"] for r in raw]
    assert [c.case_id for c in edit_cases] == [str(r["case_id"]) for r in raw]
    assert all(c.request.prompt.count("{}") == 1 for c in edit_cases)


def test_1k_is_a_subset_of_the_edit_split(edit_cases, cases_1k):
    by_id = {c.case_id: c for c in edit_cases}
    first = cases_1k[0]
    assert first.case_id == "3087"
    assert first.request.prompt == "{} professionally plays the sport"
    assert first.request.target_new == "baseball"
    for case in cases_1k:
        full = by_id[case.case_id]
        assert (case.requests, case.paraphrase_prompts, case.neighborhood) == (
            full.requests,
            full.paraphrase_prompts,
            full.neighborhood,
        )


def test_template_from_a_prompt_that_starts_with_the_subject(write_json, shared_records):
    records = shared_records(EDIT, 2)
    records[1] = dict(records[0], case_id=1, prompt="Danielle Darrieux, a native speaker of")
    (_, case) = load_counterfact(write_json(records))
    assert case.request.prompt == "{}, a native speaker of"
    assert case.source == "data.json"


def test_only_the_first_occurrence_of_the_subject_becomes_the_slot(write_json, shared_records):
    records = shared_records(EDIT, 1)
    records[0].update(subject="Paris", prompt="Paris, the city of Paris, is in")
    (case,) = load_counterfact(write_json(records))
    assert case.request.prompt == "{}, the city of Paris, is in"


# -- ROME's original format ------------------------------------------------------------------------------


def test_rome_format_fixture(fixtures_dir):
    cases = load_cases(fixtures_dir / "counterfact_rome_sample.json")
    assert [c.case_id for c in cases] == ["0", "1", "2"]
    first = cases[0]
    assert first.request == EditRequest("The mother tongue of {} is", "Danielle Darrieux", "English", "French")
    assert first.paraphrase_prompts[1] == "She later moved to the countryside. Danielle Darrieux spoke the language"
    assert first.neighborhood == [
        ("Michel Rocard is a native speaker of", "French"),
        ("The mother tongue of Jacques Chaban-Delmas is", "French"),
        ("Raymond Barre, a native", "French"),
    ]
    assert first.extra == {
        "attribute_prompts": [
            ("Ringo Starr is a native speaker of", "English"),
            ("The mother tongue of Ian Fleming is", "English"),
        ],
        "relation_id": "P103",
        "pararel_idx": 2796,
    }
    assert first.generation_prompts == [
        "Danielle Darrieux's mother tongue is",
        "Where Danielle Darrieux is from, people speak the language of",
    ]
    # {"prompt", "target"} neighbours keep their own answer; plain strings take target_true
    assert cases[1].neighborhood == [
        ("The headquarters of Symantec are in", "Mountain View"),
        ("Infinite Loop Software is based in", "Cupertino"),
    ]
    # string case id, stripped target, optional lists absent
    last = cases[2]
    assert last.request.target_new == "violin"
    assert last.extra == {"attribute_prompts": []}
    assert last.generation_prompts == []


def test_rome_format_errors(write_json, fixtures_dir):
    base = json.loads((fixtures_dir / "counterfact_rome_sample.json").read_text(encoding="utf-8"))

    def error_of(mutate) -> str:
        records = json.loads(json.dumps(base))
        mutate(records)
        path = write_json(records)
        with pytest.raises(DataError) as info:
            load_counterfact(path)
        return str(info.value).removeprefix(f"{path}:")

    def no_slot(r):
        r[1]["requested_rewrite"]["prompt"] = "Apple is headquartered in"

    def bare_target(r):
        r[0]["requested_rewrite"]["target_new"] = "English"

    def no_str(r):
        del r[2]["requested_rewrite"]["target_true"]["str"]

    def empty_paraphrases(r):
        r[1]["paraphrase_prompts"] = []

    def bad_neighbour(r):
        r[1]["neighborhood_prompts"][0] = {"prompt": "The headquarters of Symantec are in"}

    def numeric_generation(r):
        r[0]["generation_prompts"][1] = 7

    assert error_of(no_slot) == (
        "record 1: field requested_rewrite.prompt: expected a template with exactly one '{}', "
        "got 'Apple is headquartered in'"
    )
    assert error_of(bare_target) == "record 0: field requested_rewrite.target_new: expected an object, got string"
    assert error_of(no_str) == "record 2: field requested_rewrite.target_true.str: missing"
    assert error_of(empty_paraphrases) == (
        "record 1: field paraphrase_prompts: expected a non-empty list, got an empty list"
    )
    assert error_of(bad_neighbour) == "record 1: field neighborhood_prompts[0].target: missing"
    assert error_of(numeric_generation) == (
        "record 0: field generation_prompts[1]: expected a non-empty string, got int"
    )


# -- malformed EasyEdit copies ---------------------------------------------------------------------------


@pytest.fixture
def twenty(shared_records) -> list[dict]:
    return shared_records(EDIT, 20)


def load_error(path) -> str:
    """The DataError message of loading ``path`` through the registry entry point."""
    with pytest.raises(DataError) as info:
        load_cases(path)
    return str(info.value)


def test_wrong_type_message_is_the_documented_one(write_json, twenty):
    twenty[17]["target_new"] = ["English"]
    path = write_json(twenty, "counterfact-edit.json")
    assert load_error(path) == f"{path}:record 17: field target_new: expected a non-empty string, got list"


def test_missing_field(write_json, twenty):
    del twenty[3]["subject"]
    path = write_json(twenty)
    assert load_error(path) == f"{path}:record 3: field subject: missing"


def test_empty_and_blank_strings(write_json, twenty):
    twenty[5]["ground_truth"] = ""
    path = write_json(twenty)
    assert load_error(path) == f"{path}:record 5: field ground_truth: expected a non-empty string, got an empty string"
    twenty[5]["ground_truth"] = "French"
    twenty[6]["locality_ground_truth"] = "  "
    path = write_json(twenty)
    msg = f"{path}:record 6: field locality_ground_truth: expected a non-empty string, got a blank string"
    assert load_error(path) == msg


def test_subject_missing_from_prompt(write_json, twenty):
    prompt = twenty[2]["prompt"]
    twenty[2]["subject"] = twenty[2]["subject"].upper()
    path = write_json(twenty)
    subject = twenty[2]["subject"]
    assert load_error(path) == f"{path}:record 2: field prompt: the subject {subject!r} does not occur in {prompt!r}"


def test_duplicate_case_id(write_json, twenty):
    twenty[9]["case_id"] = twenty[4]["case_id"]
    path = write_json(twenty)
    assert load_error(path) == (
        f"{path}:record 9: field case_id: duplicate case id '{twenty[4]['case_id']}' (first at record 4)"
    )


def test_bad_case_id_and_non_object_record(write_json, twenty):
    twenty[8]["case_id"] = 8.5
    path = write_json(twenty)
    assert load_error(path) == f"{path}:record 8: field case_id: expected an int or a non-empty string, got float"
    twenty[8]["case_id"] = 8
    twenty[11] = ["not", "a", "record"]
    path = write_json(twenty)
    assert load_error(path) == f"{path}:record 11: expected an object, got list"


def test_a_bad_record_after_the_slice_still_fails(write_json, twenty):
    twenty[19]["rephrase_prompt"] = None
    path = write_json(twenty)
    with pytest.raises(
        DataError, match=re.escape("record 19: field rephrase_prompt: expected a non-empty string, got null")
    ):
        load_cases(path, limit=2)


def test_a_users_file_without_case_ids_is_numbered_by_position(tmp_path):
    records = [{"prompt": f"{s} is a citizen of", "subject": s, "target_new": "Japan", "ground_truth": "France",
                "rephrase_prompt": f"{s} holds a passport of", "locality_prompt": "Paris is in",
                "locality_ground_truth": "France"} for s in ("Ann Lee", "Bo Chen", "Cy Young")]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(records))
    cases = load_cases(path)
    assert [c.case_id for c in cases] == ["0", "1", "2"] and cases[1].request.subject == "Bo Chen"
