"""PEAK-CF and PEAK-T: the shared files (keys misspelled as published), spelling variants, malformed copies."""

from __future__ import annotations

import pytest

from editscope.data import load_cases
from editscope.data.peak import load_peak
from editscope.data.records import Case, EditRequest
from editscope.errors import DataError

CF = "peak/PEAK_counter.json"
T = "peak/PEAK_time.json"


@pytest.fixture(scope="module")
def cf_cases() -> list[Case]:
    return load_cases("peak-cf")


@pytest.fixture(scope="module")
def t_cases() -> list[Case]:
    return load_cases("peak-t")


def test_counts_match_manifest(cf_cases, t_cases, manifest_records):
    assert len(cf_cases) == manifest_records(CF) == 1962
    assert len(t_cases) == manifest_records(T) == 993
    assert [c.case_id for c in cf_cases[:3]] == ["0", "1", "2"]


def test_peak_cf_case_0(cf_cases):
    case = cf_cases[0]
    assert case.source == "peak-cf"
    assert case.request == EditRequest("{} shares border with", "Turkey", "Central African", "Armenian",
                                       correct_answers=tuple(case.valid_answers), hard_false=tuple(case.hard_false))
    assert len(case.valid_answers) == 18
    assert case.valid_answers[:3] == ["Armenian", "Syria", "Hellenic"]
    assert case.hard_false[0] == "Zambia" and len(case.hard_false) == 10
    assert case.random_false[0] == "Craig Robinson" and len(case.random_false) == 10
    assert case.paraphrase_prompts == ["Turkey is adjacent to"]
    assert case.neighborhood[0] == ("Vasif Talibov is a citizen of", "Azerbaijan")
    assert len(case.neighborhood) == 9
    assert case.extra == {"relation_id": "P47"}


def test_peak_t_case_0_has_the_same_schema(t_cases):
    case = t_cases[0]
    assert case.request == EditRequest(
        "{}, which recently employ a new player", "HC 's-Hertogenbosch", "Alexander Stadler", "Dylan Wotherspoon",
        correct_answers=tuple(case.valid_answers), hard_false=tuple(case.hard_false)
    )
    assert case.paraphrase_prompts == [
        "HC 's-Hertogenbosch, that recently brought in a new team member",
        "Lately, HC 's-Hertogenbosch hires a player named",
    ]
    assert case.valid_answers[-1] == "Piet-Hein Geeris"
    assert case.hard_false[-1] == "Tobias Walter"
    assert case.neighborhood[1] == ("Argentina has the citizen", "Lucas Vila")
    assert case.extra == {"relation_id": "re_<playsFor>"}


def test_target_true_is_always_a_valid_answer(cf_cases, t_cases):
    assert all(c.request.target_true in c.valid_answers for c in cf_cases + t_cases)


def test_published_overlap_of_positive_and_hard_false_lists_is_kept(cf_cases):
    overlapping = [c.case_id for c in cf_cases if set(c.valid_answers) & set(c.hard_false)]
    assert len(overlapping) == 35
    assert overlapping[:4] == ["220", "249", "255", "405"]


def test_correct_spellings_are_accepted(write_json, shared_records):
    records = shared_records(CF, 2)
    for old, new in [
        ("postive_list", "positive_list"),
        ("negtive_list", "negative_list"),
        ("negtive_random_list", "negative_random_list"),
        ("para_add_prompts", "paraphrase_prompts"),
    ]:
        records[1][new] = records[1].pop(old)
    published, corrected = load_peak(write_json(records))
    assert corrected.valid_answers == records[1]["positive_list"]
    assert corrected.hard_false == records[1]["negative_list"]
    assert corrected.random_false == records[1]["negative_random_list"]
    assert corrected.paraphrase_prompts == records[1]["paraphrase_prompts"]
    assert published.valid_answers[0] == "Armenian"


def test_both_spellings_in_one_record_is_an_error(write_json, shared_records):
    records = shared_records(CF, 3)
    records[2]["positive_list"] = records[2]["postive_list"]
    path = write_json(records)
    with pytest.raises(DataError) as info:
        load_cases(path)
    assert (
        str(info.value)
        == f"{path}:record 2: field postive_list: both 'postive_list' and 'positive_list' are given; keep one"
    )


@pytest.mark.parametrize(
    ("index", "mutate", "problem"),
    [
        (1, lambda r: r.pop("negtive_list"), "field negtive_list: missing (also accepted: 'negative_list')"),
        (
            2,
            lambda r: r.update(negtive_random_list=[]),
            "field negtive_random_list: expected a non-empty list, got an empty list",
        ),
        (0, lambda r: r.update(postive_list={"a": 1}), "field postive_list: expected a list of strings, got object"),
        (
            3,
            lambda r: r["neighborhood_prompts"].__setitem__(1, ["only a prompt"]),
            "field neighborhood_prompts[1]: expected a [prompt, answer] pair, got list of 1",
        ),
        (
            3,
            lambda r: r["neighborhood_prompts"].__setitem__(2, ["a prompt", ""]),
            "field neighborhood_prompts[2][1]: expected a non-empty string, got an empty string",
        ),
        (1, lambda r: r["requested_rewrite"].pop("subject"), "field requested_rewrite.subject: missing"),
        (
            2,
            lambda r: r["requested_rewrite"].update(prompt="{} and {}"),
            "field requested_rewrite.prompt: expected a template with exactly one '{}', got '{} and {}'",
        ),
        (3, lambda r: r.update(case_id=0), "field case_id: duplicate case id '0' (first at record 0)"),
    ],
)
def test_malformed_copies(write_json, shared_records, index, mutate, problem):
    records = shared_records(T, 4)
    mutate(records[index])
    path = write_json(records)
    with pytest.raises(DataError) as info:
        load_cases(path)
    assert str(info.value) == f"{path}:record {index}: {problem}"
