"""KnowEdit loader: the field shapes of EasyEdit's KnowEdit files (the dataset card's examples,
tests/fixtures/knowedit_small.json) map onto Cases; a malformed record is one line naming file, record, field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editscope.data import detect_format, load_cases
from editscope.data.knowedit import load_knowedit
from editscope.errors import DataError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "knowedit_small.json"


def test_fixture_maps_onto_cases():
    cases = load_cases(FIXTURE)  # detected from the first record's keys
    assert [c.case_id for c in cases] == ["0", "1", "2"]
    recent, cf, zsre = cases
    assert recent.request.prompt == "The place of death of {} is" and recent.request.target_true is None
    assert recent.extra["portability"]["Reasoning"] == [
        ["The name of the head of government of the place of death of Leo Arons is", "Kai Wegner"],
        ["The name of the continent which the place of death of Leo Arons is part of is", "Europe"]]
    assert recent.extra["portability"]["Logical_Generalization"] == [["Is Leo Arons still alive?", "no"]]
    assert cf.request.target_new == "Archbishop of León, Mexico" and cf.request.target_true == "mayor of Vienna"
    assert cf.extra["locality"]["Forgetfulness"][0][1] == "mayor of Vienna"
    assert cf.neighborhood == [("The gender of Frederic Piesch is", "male"),
                               tuple(cf.extra["locality"]["Forgetfulness"][0])]
    assert zsre.request.prompt == "Which family does {} belong to?" and zsre.request.target_true == "Aspidoceratidae"
    assert zsre.paraphrase_prompts == ["What family are Epaspidoceras?"]
    assert zsre.extra["portability"]["Reasoning"] == [
        ["What is the common name for the family Epaspidoceras belongs to?", "Owlet moths"]]
    assert detect_format(json.loads(FIXTURE.read_text())[0], "f").name == "knowedit"


def _broken(tmp_path, change) -> Path:
    records = json.loads(FIXTURE.read_text())
    change(records)
    path = tmp_path / "ke.json"
    path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize("change,where", [
    (lambda r: r[1].pop("prompt"), r"record 1: field prompt: missing"),
    (lambda r: r[0].__setitem__("subject", "Nobody"), r"record 0: field prompt: the subject 'Nobody' does not occur"),
    (lambda r: r[2]["portability"].__setitem__("Multi_Hop", []),
     r"record 2: field portability\.Multi_Hop: unknown portability type \(known: Reasoning, Subject_Aliasing"),
    (lambda r: r[0]["portability"]["Reasoning"][1].__setitem__("ground_truth", []),
     r"record 0: field portability\.Reasoning\[1\]\.ground_truth: expected a non-empty list"),
    (lambda r: r[0]["portability"]["Reasoning"][0]["ground_truth"][0].__setitem__(1, 7),
     r"record 0: field portability\.Reasoning\[0\]\.ground_truth\[0\]\[1\]: expected a non-empty string, got int"),
    (lambda r: r[1]["locality"]["Relation_Specificity"][0].pop("prompt"),
     r"record 1: field locality\.Relation_Specificity\[0\]\.prompt: missing"),
    (lambda r: r[2].__setitem__("locality", {"Relation_Specificity": {"prompt": "x"}}),
     r"record 2: field locality\.Relation_Specificity: expected a list of objects, got object"),
    (lambda r: r[1].__setitem__("ground_truth", 3.5),
     r"record 1: field ground_truth: expected an answer string, a list of strings or a list of alias lists, "
     r"got float"),
])
def test_bad_record_is_one_line(tmp_path, change, where):
    path = _broken(tmp_path, change)
    with pytest.raises(DataError, match=where) as info:
        load_knowedit(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)

