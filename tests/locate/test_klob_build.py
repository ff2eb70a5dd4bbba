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


def _naive_recalled(engine, text: str, answer: str) -> bool:
    """Greedy check one token at a time with plain forwards (independent of the engine's batched scoring)."""
    import torch

    ctx, cont = engine.encode_pair(text, answer)
    ids = list(ctx)
    for token in cont:
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([ids], device=engine.bundle.device)).logits[0, -1]
        if int(logits.argmax()) != token:
            return False
        ids.append(token)
    return True


@pytest.fixture(scope="module")
def tiny_engine():
    from editscope.lm import load
    from editscope.lm.engine import ScoringEngine

    return ScoringEngine(load("tiny-llama"))


def _greedy_answer(engine, text: str, n: int = 2) -> str:
    import torch

    ids = engine.context_ids(text)
    out = []
    for _ in range(n):
        with torch.no_grad():
            out.append(int(engine.model(input_ids=torch.tensor([ids + out], device=engine.bundle.device))
                           .logits[0, -1].argmax()))
    return engine.tokenizer.decode(out)


def test_recall_filter_keeps_exactly_the_recalled_facts(tiny_engine):
    from editscope.data.klob_build import KlobExample, KlobPrompt, recall_filter

    templates = KLOB_C_TEMPLATES["P19"][1]
    subjects = ["Alan Turing", "Ada Lovelace", "Marie Curie", "Niels Bohr", "Emmy Noether", "Kurt Godel"]
    examples, expected = [], {}
    for i, subject in enumerate(subjects):
        # even subjects: every template's answer is the model's own greedy continuation; odd: a fixed wrong one
        answers = [_greedy_answer(tiny_engine, t.replace("{}", subject)) if i % 2 == 0 else " zebra quantum"
                   for t in templates]
        prompts = tuple(KlobPrompt(t, subject, a) for t, a in zip(templates, answers, strict=True))
        examples.append(KlobExample("c", f"c:{i}", "P19", prompts, "test"))
        expected[f"c:{i}"] = [_naive_recalled(tiny_engine, p.text, p.answer) for p in prompts]
    hits = [h for v in expected.values() for h in v]
    assert any(hits) and not all(hits)  # the test separates something
    for mode, rule in (("any", any), ("all", all), ("first", lambda h: h[0])):
        kept = recall_filter(tiny_engine, examples, mode=mode, chunk=4)
        assert [e.example_id for e in kept] == [k for k, v in expected.items() if rule(v)]
    assert len(recall_filter(tiny_engine, examples, mode="none")) == len(examples)
    # KLoB-r: kept only when both facts are recalled; KLoB-u always passes; limit counts kept examples
    good = [p for e in examples for p in e.prompts if _naive_recalled(tiny_engine, p.text, p.answer)]
    bad = [p for e in examples for p in e.prompts if not _naive_recalled(tiny_engine, p.text, p.answer)]
    pairs = [KlobExample("r", "r:0", "P19", (good[0], bad[0]), "t"),
             KlobExample("r", "r:1", "P19", (good[0], good[1]), "t"),
             KlobExample("u", "u:0", "-", (KlobPrompt("{} x", "y", None),), "t")]
    pairs.append(KlobExample("r", "r:2", "P19", (bad[1], good[1]), "t"))
    assert [e.example_id for e in recall_filter(tiny_engine, pairs)] == ["r:1", "u:0"]
    assert [e.example_id for e in recall_filter(tiny_engine, pairs, limit=1)] == ["r:1"]
    # mode_r: the single (first) fact, either fact, or no filter for KLoB-r; KLoB-c's mode does not touch KLoB-r
    assert [e.example_id for e in recall_filter(tiny_engine, pairs, mode_r="first")] == ["r:0", "r:1", "u:0"]
    assert [e.example_id for e in recall_filter(tiny_engine, pairs, mode_r="any")] == ["r:0", "r:1", "u:0", "r:2"]
    assert [e.example_id for e in recall_filter(tiny_engine, pairs, mode="none")] == ["r:1", "u:0"]
    assert len(recall_filter(tiny_engine, pairs, mode_r="none")) == 4
    with pytest.raises(ValueError, match="mode_r"):
        recall_filter(tiny_engine, pairs, mode_r="both")


def test_recall_filter_few_shot_prefixes_same_template_demonstrations(tiny_engine):
    from editscope.data.klob_build import KlobExample, KlobPrompt, _with_demos, demonstrations, recall_filter

    template = "{} was born in"
    pool = [KlobExample("c", f"c:{i}", "P19", (KlobPrompt(template, s, a), KlobPrompt("{} lived in", s, a)), "t")
            for i, (s, a) in enumerate([("Ada", "London"), ("Bob", "Paris"), ("Cy", "Rome"), ("Di", "Oslo")])]
    pick = demonstrations(pool, 2)
    query = KlobPrompt(template, "Bob", "Paris")
    demos = pick(query)
    assert [d.text for d in demos] == ["Ada was born in", "Cy was born in"]  # same template, other subjects
    assert _with_demos(query, demos) == "Ada was born in London.\nCy was born in Rome.\nBob was born in"
    assert demonstrations(pool, 0)(query) == ()
    # the filter decides on the prefixed text: compare with the naive greedy check of that text
    answer = _greedy_answer(tiny_engine, _with_demos(query, demos), 1)
    example = KlobExample("c", "q", "P19", (KlobPrompt(template, "Bob", answer),), "t")
    with_shots = recall_filter(tiny_engine, [example], mode="all", shots=2, pool=pool)
    assert bool(with_shots) == _naive_recalled(tiny_engine, _with_demos(query, demos), answer)
    zero_shot = recall_filter(tiny_engine, [example], mode="all", shots=0, pool=pool)
    assert bool(zero_shot) == _naive_recalled(tiny_engine, query.text, answer)
    # the shared-block batch (context = demonstrations, continuation = sentence + answer) against naive checks
    from editscope.data.klob_build import recalled_many

    queries, naive = [], []
    for subject in ("Bob", "Eve", "Ada"):
        q = KlobPrompt(template, subject, "x")
        for ans in (_greedy_answer(tiny_engine, _with_demos(q, pick(q)), 2), " Paris"):
            q = KlobPrompt(template, subject, ans)
            queries.append((q, pick(q)))
            naive.append(_naive_recalled(tiny_engine, _with_demos(q, pick(q)), ans))
    assert any(naive) and not all(naive)
    assert recalled_many(tiny_engine, queries) == naive


def test_format_counts_two_relations_per_line():
    from collections import Counter

    from editscope.data.klob_build import format_counts

    text = format_counts(Counter({"P19": 3, "P36": 5, "P999": 1}), "kept")
    lines = text.splitlines()
    assert lines[1].split() == ["P36", "(capital)", "5", "P999", "1"]
    assert lines[2].split() == ["P19", "(born)", "3"]
    assert lines[-1] == "kept: 9 in total, 3 relations"
