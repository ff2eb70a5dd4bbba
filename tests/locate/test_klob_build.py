"""KLoB builders: three Table 3 prompts per KLoB-c fact, entity-sharing KLoB-r pairs, KLoB-u prompts."""

from __future__ import annotations

import pytest

from editscope.data.klob import KlobSentence
from editscope.data.klob_build import Fact, build_klob, klob_c, klob_r, klob_u, peak_facts
from editscope.data.klob_templates import KLOB_C_TEMPLATES
from editscope.data.records import Case, EditRequest


def test_table3_has_32_relations_of_three_templates():
    assert len(KLOB_C_TEMPLATES) == 32
    assert KLOB_C_TEMPLATES["P19"][1] == ("{} was born in", "The place of birth for {} is",
                                          "The birth of {} occurred in")
    for _label, templates in KLOB_C_TEMPLATES.values():
        assert len(templates) == 3 and all(t.count("{}") == 1 for t in templates)


def test_klob_c_three_prompts_per_fact():
    facts = [Fact("P19", "Alan Turing", "London", "{} was born in", "x:0"),
             Fact("P19", "Alan Turing", "London", "{} was born in", "x:1"),  # duplicate: kept once
             Fact("P47", "Turkey", "Syria", "{} shares border with", "x:2"),  # no Table 3 templates: dropped
             Fact("P36", "Paris", "France", "{} is the capital of", "x:3")]
    examples = klob_c(facts)
    assert [e.relation for e in examples] == ["P19", "P36"]
    assert [p.text for p in examples[0].prompts] == [
        "Alan Turing was born in", "The place of birth for Alan Turing is", "The birth of Alan Turing occurred in"]
    assert {p.answer for p in examples[1].prompts} == {"France"}


def test_peak_reverse_relations_become_forward_facts():
    case = Case("1", "peak-cf", (EditRequest("{} is the author of", "Bertrand Russell", "Dune",
                                             "Power: A New Social Analysis"),), extra={"relation_id": "re_P50"})
    (fact,) = peak_facts([case])
    assert (fact.relation, fact.subject, fact.answer) == ("P50", "Power: A New Social Analysis", "Bertrand Russell")
    (example,) = klob_c([fact])
    assert example.prompts[0].text == "The author of Power: A New Social Analysis is"


def test_klob_r_pairs_share_an_entity():
    chain = [Fact("P175", "Hey Jude", "The Beatles", "{} was performed by", "m:0"),
             Fact("P1037", "The Beatles", "Brian Epstein", "The director of {} is", "m:1"),
             Fact("P27", "Brian Epstein", "United Kingdom", "{} is a citizen of", "m:2")]
    pairs = klob_r([chain])
    assert len(pairs) == 2
    first, second = pairs[0].prompts
    assert first.answer == second.subject == "The Beatles"
    assert first.template == KLOB_C_TEMPLATES["P175"][1][0]
    assert second.text == "The director of The Beatles is"
    # a relation without Table 3 templates keeps its dataset prompt
    assert pairs[1].prompts[0].text == "The director of The Beatles is"


def test_klob_u_prompt_and_subject():
    (example,) = klob_u([KlobSentence(3, "pumice preministry matureness _")])
    (prompt,) = example.prompts
    assert (prompt.text, prompt.subject, prompt.answer) == ("pumice preministry matureness", "pumice", None)


@pytest.mark.slow
def test_build_klob_from_shared_data():
    sets = build_klob(u_limit=20)
    assert len(sets["c"]) > 500 and len(sets["r"]) > 300 and len(sets["u"]) == 20
    for example in sets["c"]:
        assert tuple(p.template for p in example.prompts) == KLOB_C_TEMPLATES[example.relation][1]
    for example in sets["r"]:
        assert example.prompts[0].answer == example.prompts[1].subject
