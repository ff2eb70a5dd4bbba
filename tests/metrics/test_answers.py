"""Answer metrics of evaluation in the wild: SQuAD normalisation, exact match, token F1 (against hand values and
an independent loop-counting F1), and the answer-judge registry."""

from __future__ import annotations

import math
import random
import string

import pytest

from editscope.errors import EditscopeError
from editscope.metrics import (
    JUDGES,
    AnswerMatchJudge,
    Judge,
    MetricInputError,
    answer_tokens,
    contains_answer,
    exact_match,
    judge_answer,
    normalize_answer,
    token_f1,
)
from editscope.metrics.answers import (
    NEIGHBOUR_JUDGES,
    first_object,
    judge_neighbour,
    leading_clause,
    same_object,
    same_start,
)

# -- normalisation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("The  Eiffel-Tower!", "eiffeltower"),  # punctuation goes before the article is looked for
    ("an apple a day", "apple day"),
    ("A", ""),
    ("the", ""),
    ("The Beatles", "beatles"),
    ("Theatre, Another, Anne", "theatre another anne"),  # articles only as whole words
    ("U.S.A.", "usa"),
    ("rock'n'roll", "rocknroll"),
    ("the-end", "theend"),  # the hyphen is removed first, so "the" is no longer a word of its own
    ("a.m.", "am"),
    ("  Wilt   Chamberlain * ", "wilt chamberlain"),
    ("snake_case", "snakecase"),  # "_" is in string.punctuation
    ("$1,376.00", "137600"),
    ("Paris\u00a0France\tEurope\n", "paris france europe"),  # any Unicode whitespace separates words
    ("", ""),
    ("?!...", ""),
])
def test_normalize_answer_follows_the_squad_script(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("ÉCOLE Normale", "école normale"),  # Unicode lower-casing
    ("Café “Noir” — Paris", "café “noir” — paris"),  # curly quotes and the em dash are not string.punctuation
    ("The “Tower”", "“tower”"),  # "the" before a non-word character is still a whole word
    ("theé", "theé"),  # é is a word character: no boundary after "the"
    ("Ångström, the unit", "ångström unit"),
    ("71–74 °C (160–165 °F)", "71–74 °c 160–165 °f"),  # en dash and degree sign stay
])
def test_normalize_answer_unicode_keeps_non_ascii_marks(text, expected):
    assert normalize_answer(text) == expected


def test_answer_tokens_split_the_normalised_text():
    assert answer_tokens("The quick, brown fox!") == ["quick", "brown", "fox"]
    assert answer_tokens("the a an") == []


# -- exact match ----------------------------------------------------------------------------------------------


def test_exact_match_after_normalisation():
    assert exact_match("the Eiffel Tower.", ["Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel Tower in Paris", ["Eiffel Tower"]) == 0.0
    assert exact_match("wilt chamberlain", ["Wilt Chamberlain *"]) == 1.0
    assert exact_match("Ecole", ["École"]) == 0.0  # no accent folding in SQuAD's normaliser


def test_exact_match_is_the_max_over_gold_answers():
    assert exact_match("NYC", ["New York City", "nyc", "Big Apple"]) == 1.0
    assert exact_match("Boston", ["New York City", "nyc"]) == 0.0
    assert isinstance(exact_match("a", ["b"]), float)


def test_exact_match_of_empty_answers():
    assert exact_match("", [""]) == 1.0
    assert exact_match("The.", ["an"]) == 1.0  # both normalise to ""
    assert exact_match("", ["Paris"]) == 0.0
    assert exact_match("Paris", [""]) == 0.0


# -- token F1 -------------------------------------------------------------------------------------------------


def test_token_f1_hand_values():
    # tokens [quick, brown, fox] vs [quick, fox, jumps]: 2 shared, P = R = 2/3
    assert token_f1("The quick brown fox", ["quick fox jumps"]) == pytest.approx(2 / 3)
    # [eiffel, tower, in, paris] vs [eiffel, tower]: P = 2/4, R = 1, F1 = 2/3
    assert token_f1("Eiffel Tower in Paris", ["the Eiffel tower"]) == pytest.approx(2 / 3)
    # [x, x, y] vs [x, y, y]: overlap is a multiset (x once, y once): P = R = 2/3
    assert token_f1("x x y", ["x y y"]) == pytest.approx(2 / 3)
    # [x, x, x] vs [x]: one shared, P = 1/3, R = 1, F1 = 0.5
    assert token_f1("x x x", ["x"]) == pytest.approx(0.5)
    assert token_f1("Paris", ["London"]) == 0.0
    assert token_f1("Wilt Chamberlain", ["Wilt Chamberlain *"]) == 1.0


def test_token_f1_is_the_max_over_gold_answers():
    golds = ["London", "the city of Paris", "Paris"]
    assert token_f1("Paris France", golds) == pytest.approx(2 / 3)  # vs "Paris": P = 1/2, R = 1
    assert token_f1("city of Paris", golds) == 1.0


def test_token_f1_of_empty_answers_follows_squad_2():
    assert token_f1("", [""]) == 1.0
    assert token_f1("the", ["a"]) == 1.0  # both empty after normalisation
    assert token_f1("", ["Paris"]) == 0.0
    assert token_f1("Paris", [""]) == 0.0
    assert token_f1("", ["Paris", ""]) == 1.0  # an empty gold among others is one more gold


def _naive_normalise(text: str) -> list[str]:
    """Character loops: lower-case, drop ASCII punctuation, split on whitespace, drop a/an/the. Equal to SQuAD's
    normaliser on text whose words are made of letters and digits only (the generator below)."""
    kept = ""
    for ch in text.lower():
        if ch not in string.punctuation:
            kept += ch
    words = []
    word = ""
    for ch in kept + " ":
        if ch.isspace():
            if word and word not in ("a", "an", "the"):
                words.append(word)
            word = ""
        else:
            word += ch
    return words


def _naive_f1(pred: str, gold: str) -> float:
    p, g = _naive_normalise(pred), _naive_normalise(gold)
    if len(p) == 0 or len(g) == 0:
        return 1.0 if len(p) == len(g) else 0.0
    unmatched = list(g)
    shared = 0
    for token in p:
        for i in range(len(unmatched)):
            if unmatched[i] == token:
                shared += 1
                del unmatched[i]
                break
    if shared == 0:
        return 0.0
    precision = shared / len(p)
    recall = shared / len(g)
    return 2 * precision * recall / (precision + recall)


_WORDS = ["Paris", "paris", "the", "The", "a", "An", "an", "tower", "Tower", "1994", "x", "y", "école", "ÉCOLE",
          "straße", "theatre", "another"]
_JOINERS = [" ", "  ", ", ", ". ", "-", "!", "\t", "'", " (", ") "]


def _random_answer(rng: random.Random) -> str:
    n = rng.randint(0, 6)
    return "".join(rng.choice(_WORDS) + rng.choice(_JOINERS) for _ in range(n))


def test_token_f1_equals_a_naive_loop_implementation():
    rng = random.Random(1234)
    checked = 0
    for _ in range(2000):
        pred = _random_answer(rng)
        golds = [_random_answer(rng) for _ in range(rng.randint(1, 3))]
        expected = max(_naive_f1(pred, g) for g in golds)
        assert token_f1(pred, golds) == pytest.approx(expected, abs=1e-12), (pred, golds)
        assert exact_match(pred, golds) == max(float(_naive_normalise(pred) == _naive_normalise(g)) for g in golds)
        checked += 0 < expected < 1
    assert checked > 100  # the sample exercises partial overlaps, not only 0 and 1


def test_contains_answer_hand_values():
    assert contains_answer("Central District of New York City", ["Central District"]) == 1.0
    assert contains_answer("The Beatles!", ["beatles"]) == 1.0  # articles and punctuation normalised away
    assert contains_answer("He was born in New Yorker Street", ["New York"]) == 0.0  # whole tokens only
    assert contains_answer("York, New", ["New York"]) == 0.0  # a contiguous run, in order
    assert contains_answer("Paris", ["Paris France"]) == 0.0  # the answer must hold the gold, not the reverse
    assert contains_answer("it is Rome", ["Paris", "Rome"]) == 1.0  # max over gold answers
    assert contains_answer("", ["the"]) == 1.0 and contains_answer("x", ["the"]) == 0.0  # empty gold: EM's rule
    assert contains_answer("", ["Paris"]) == 0.0


def test_contains_answer_equals_a_naive_span_search_and_bounds_exact_match():
    rng = random.Random(99)
    held = 0
    for _ in range(2000):
        pred = _random_answer(rng)
        golds = [_random_answer(rng) for _ in range(rng.randint(1, 2))]
        p = " " + " ".join(_naive_normalise(pred)) + " "
        expected = max(float(" " + " ".join(_naive_normalise(g)) + " " in p) if _naive_normalise(g)
                       else float(not _naive_normalise(pred)) for g in golds)
        assert contains_answer(pred, golds) == expected, (pred, golds)
        assert contains_answer(pred, golds) >= exact_match(pred, golds)  # an exact answer holds itself
        held += expected == 1.0 and exact_match(pred, golds) == 0.0
    assert held > 20  # the sample has answers that hold a gold answer without equalling it


# -- input checks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", [exact_match, token_f1, contains_answer])
def test_bad_inputs_name_the_argument(metric):
    with pytest.raises(MetricInputError, match=r"^truths: expected a sequence of gold answers, got a single string"):
        metric("Paris", "Paris")
    with pytest.raises(MetricInputError, match=r"^truths: is empty"):
        metric("Paris", [])
    with pytest.raises(MetricInputError, match=r"^truths\[1\]: expected a str, got NoneType"):
        metric("Paris", ["Paris", None])
    with pytest.raises(MetricInputError, match=r"^prediction: expected a str, got int"):
        metric(3, ["3"])
    with pytest.raises(MetricInputError, match=r"^truths: expected a sequence of gold answers, got set"):
        metric("Paris", {"Paris"})
    with pytest.raises(MetricInputError, match=r"^text: expected a str, got bytes"):
        normalize_answer(b"Paris")


# -- judges ---------------------------------------------------------------------------------------------------


def test_builtin_judges_are_registered_and_declared():
    assert list(JUDGES)[:3] == ["exact_match", "token_f1", "contains"]
    em, f1 = JUDGES["exact_match"], JUDGES["token_f1"]
    assert isinstance(em, Judge) and isinstance(f1, Judge)
    assert (em.name, em.binary, f1.name, f1.binary) == ("exact_match", True, "token_f1", False)
    assert "exact match" in JUDGES.description("exact_match")
    assert em("Who?", "the Eiffel Tower", ["Eiffel Tower"]) == 1.0
    assert f1("Who?", "Eiffel Tower in Paris", ["Eiffel Tower"]) == pytest.approx(2 / 3)
    assert JUDGES["contains"].binary and JUDGES["contains"]("Who?", "Eiffel Tower in Paris", ["Eiffel Tower"]) == 1.0


def test_judge_answer_by_name_and_by_object():
    assert judge_answer("exact_match", "Where?", "Paris.", ["paris"]) == 1.0
    assert judge_answer("token_f1", "Where?", "Paris France", ["Paris"]) == pytest.approx(2 / 3)
    assert judge_answer(JUDGES["token_f1"], "Where?", "", ["the"]) == 1.0
    with pytest.raises(EditscopeError, match="unknown answer judge 'llm'; available: exact_match, token_f1"):
        judge_answer("llm", "q", "p", ["g"])
    with pytest.raises(MetricInputError, match=r"^question: expected a str, got NoneType"):
        judge_answer("exact_match", None, "p", ["g"])
    with pytest.raises(MetricInputError, match=r"^golds: is empty"):
        judge_answer("exact_match", "q", "p", [])


def test_a_plugged_in_judge_reads_the_question(monkeypatch):
    def contains_gold(question: str, prediction: str, golds) -> float:
        if question.startswith("Say"):
            return 1.0
        return float(any(normalize_answer(g) in normalize_answer(prediction) for g in golds))

    class Contains:
        name = "contains"
        binary = True

        def __call__(self, question, prediction, golds):
            return contains_gold(question, prediction, golds)

    monkeypatch.setitem(JUDGES, "contains", Contains())
    assert judge_answer("contains", "Where is it?", "It is in Paris, France", ["paris"]) == 1.0
    assert judge_answer("contains", "Where is it?", "London", ["paris"]) == 0.0
    assert judge_answer("contains", "Say anything", "London", ["paris"]) == 1.0


@pytest.mark.parametrize(("value", "binary", "problem"), [
    (1.5, False, "returned 1.5, outside [0, 1]"),
    (-0.1, False, "returned -0.1, outside [0, 1]"),
    (math.nan, False, "returned nan, outside [0, 1]"),
    (0.5, True, "is declared binary but returned 0.5"),
    (True, True, "returned bool, not a number"),
    ("1", False, "returned str, not a number"),
])
def test_judge_answer_checks_what_a_judge_returns(value, binary, problem):
    judge = AnswerMatchJudge("fixed", lambda prediction, golds: value, binary=binary)
    with pytest.raises(MetricInputError) as info:
        judge_answer(judge, "q", "p", ["g"])
    assert str(info.value) == f"judge 'fixed': {problem}"


def test_the_registry_refuses_what_is_not_a_judge():
    with pytest.raises(EditscopeError, match="answer judge 'bad': expected a Judge, got function"):
        JUDGES.register(lambda q, p, g: 1.0, "bad")
    with pytest.raises(EditscopeError, match="answer judge 'exact_match' is already registered"):
        JUDGES.register(AnswerMatchJudge("exact_match", exact_match, binary=True))


def test_a_judge_that_raises_is_one_line_naming_it():
    def broken(prediction, golds):
        raise ConnectionError("judge model unreachable\nretry later")

    with pytest.raises(MetricInputError) as info:
        judge_answer(AnswerMatchJudge("remote", broken, binary=True), "q", "p", ["g"])
    assert str(info.value) == "judge 'remote': raised ConnectionError: judge model unreachable"


# -- the object an answer asserts first ---------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "gold", "expected"), [
    # run-on greedy answers to CounterFact's completion prompts: each begins with the new target
    ("Toronto, Canada", "Toronto", 1.0),
    ("English, and the English language, …", "English", 1.0),
    ("Sony, is a 2013 Japanese company", "Sony", 1.0),
    ("Apple, is a major contributor to the open source community", "Apple", 1.0),
    ("Manila, the Philippines' largest city", "Manila", 1.0),
    # the gold answer inside the first clause
    ("the city of Toronto", "Toronto", 1.0),
    ("The continent that is Freyberg Mountains on is Europe", "Europe", 1.0),
    # another object first: the clause ends at the comma / the conjunction before the gold answer comes
    ("French, not English", "English", 0.0),
    ("Paris and London", "London", 0.0),
    ("a French-speaking Canadian, born in Toronto", "Toronto", 0.0),
    # a gold answer that has a conjunction of its own is held when the answer begins with it
    ("Trinidad and Tobago, an island nation", "Trinidad and Tobago", 1.0),
    ("The answer is: Kut-e Abdollah Rural District", "Central District", 0.0),
    ("Torontonian food", "Toronto", 0.0),  # whole tokens only
    ("", "Toronto", 0.0),
])
def test_first_object_reads_the_object_asserted_first(answer, gold, expected):
    assert first_object(answer, [gold]) == expected
    assert judge_answer("first_object", "q", answer, [gold]) == expected


@pytest.mark.parametrize(("answer", "gold", "expected"), [
    # SmolLM2's answers (zsRE / QAEdit, the QA wrapper) to questions whose gold answer holds a clause break of its
    # own: version 1 ended the clause inside the gold answer and judged each 0; a reader judges each 1
    ('The song "Roar" by Katy Perry', '"Roar" by Katy Perry', 1.0),
    ("The answer is December 29, 1998", "December 29, 1998", 1.0),
    ("The answer is: Charles Lennox, 2nd Duke of Richmond", "Charles Lennox, 2nd Duke of Richmond", 1.0),
    ("The architect of Symphony Towers is Skidmore, Owings and Merrill", "Skidmore, Owings and Merrill", 1.0),
    ("Stormed Fortress in the series of Wars of Light and Shadow", "Wars of Light and Shadow", 1.0),
    ("The Frontios is a Doctor Who series", "Doctor Who", 1.0),  # "who" is a clause word
    ("the country of Trinidad and Tobago", "Trinidad and Tobago", 1.0),
    ("The song “Roar” by Katy Perry", '"Roar" by Katy Perry', 1.0),  # other quote marks around the same words
    # the gold answer after another object still is not the first object, break inside it or not
    ("Toronto, Trinidad and Tobago", "Trinidad and Tobago", 0.0),
    ("Doctor Foster, not Doctor Who", "Doctor Who", 0.0),
    ("Paris, December 29, 1998", "December 29, 1998", 0.0),
    ("Skidmore College", "Skidmore, Owings and Merrill", 0.0),  # only part of the gold's words
])
def test_first_object_reads_a_gold_answer_with_a_break_of_its_own_whole(answer, gold, expected):
    assert first_object(answer, [gold]) == expected


def test_the_first_object_judges_record_their_version():
    from editscope.metrics.answers import FIRST_OBJECT_VERSION
    from editscope.suites.wild import WildSuite, recorded_judges

    assert FIRST_OBJECT_VERSION == 2
    assert JUDGES["first_object"].version == 2 and JUDGES["exact_match"].version == 1
    proto = WildSuite(judge="first_object", locality_judge="same_object").protocol
    assert proto["judge_version"] == 2 and proto["locality_judge_version"] == 2
    assert "judged by first_object v2 against" in proto["note"]
    assert recorded_judges(proto) == ("first_object v2", "same_object v2")
    plain = WildSuite(judge="exact_match", locality_judge="same_start").protocol
    assert "judge_version" not in plain and "locality_judge_version" not in plain
    # rows written under version 1 recorded no version: a resume under version 2 sees other judges
    assert recorded_judges({"judge": "first_object", "locality_judge": "same_start"}) != recorded_judges(
        WildSuite(judge="first_object", locality_judge="same_start").protocol)


def test_first_object_against_exact_match_on_the_run_on_answers():
    """Whole-answer exact match scores every run-on answer wrong; the first-object judge scores it right."""
    answers = ["Toronto, Canada", "English, and the English language", "Sony, is a 2013"]
    golds = ["Toronto", "English", "Sony"]
    assert [exact_match(a, [g]) for a, g in zip(answers, golds, strict=True)] == [0.0, 0.0, 0.0]
    assert [first_object(a, [g]) for a, g in zip(answers, golds, strict=True)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("answer", "gold", "loops", "fluent"), [
    # Qwen2.5-Coder-1.5B's answers after single ROME edits (zsRE, the QA wrapper): the object first, then a loop
    ("Welsh Welsh Welsh Welsh Welsh Welsh Welsh Welsh", "Welsh", True, 0.0),
    ("Rijmenam, Rijmenam, Rijmenam, Rijmenam, Rijmenam,", "Rijmenam", True, 0.0),
    ("Miami University, Oxford, Oxford, Oxford, Oxford, Oxford, Oxford", "Miami University", True, 0.0),
    ("prostate cancer prostate cancer prostate cancer prostate", "prostate cancer", True, 0.0),
    # a run-on that repeats a word but not itself: 6 distinct of 10 words
    ("Central District is located in Central District of Central District", "Central District", False, 1.0),
    ("Toronto, Canada", "Toronto", False, 1.0),
    ("Welsh Welsh Welsh", "Welsh", False, 1.0),  # under four words: too short to call a loop
    ("the the the the Paris", "Paris", False, 1.0),  # articles are not answer tokens: one token, "paris"
    ("Oxford Oxford Oxford Oxford", "Cambridge", True, 0.0),
])
def test_the_fluent_judge_is_first_object_with_loops_wrong(answer, gold, loops, fluent):
    from editscope.metrics.answers import first_object_fluent, repeats_itself

    words = answer_tokens(answer)  # an independent count of the rule: >= 4 words, under half of them distinct
    assert repeats_itself(answer) is loops is (len(words) >= 4 and 2 * len(set(words)) < len(words))
    assert first_object_fluent(answer, [gold]) == fluent == (0.0 if loops else first_object(answer, [gold]))
    assert judge_answer("first_object_fluent", "q", answer, [gold]) == fluent


def test_leading_clause_breaks_at_punctuation_and_clause_words_not_at_colons():
    assert leading_clause("Toronto, Canada") == ["toronto"]
    assert leading_clause("Paris (France)") == ["paris"]
    assert leading_clause("Rome which is old") == ["rome"]
    assert leading_clause("Oregon - a state") == ["oregon"]
    assert leading_clause("The answer is: Paris") == ["answer", "is", "paris"]
    assert leading_clause("Andorra") == ["andorra"]  # "and" only as a whole word
    assert leading_clause('"Shawn Mendes" by Katy Perry') == ["shawn", "mendes"]  # an opening quote is no break
    assert leading_clause("(Roar), a song") == ["roar"]


def test_neighbour_judges_by_hand():
    # the Mirage paper's locality: whole answers
    assert judge_neighbour("unchanged", "q", "Rome, Italy", "rome italy") == 1.0
    assert judge_neighbour("unchanged", "q", "Rome, Italy", "Rome, the capital") == 0.0
    # first three words
    assert same_start("a historic center of the Italian rail network", "a historic center of tourism") == 1.0
    assert same_start("a historic center of the rail", "a major tourist destination in Italy") == 0.0
    # the same first object: a rewording after the object is no change, another object is
    assert same_object("Rome, Italy", "Rome, the capital of Italy") == 1.0
    assert same_object("Rome, Italy", "Milan, Italy") == 0.0
    assert same_object("a historic center of the Italian rail network", "a major tourist destination in Italy") == 0.0
    # when the answer before asserts the neighbour's gold answer, the answer after must still assert it
    assert same_object("the city of Rome", "Rome and its region", ["Rome"]) == 1.0
    assert same_object("the city of Rome", "Milan", ["Rome"]) == 0.0
    assert same_object("", "") == 1.0
    assert judge_neighbour("same_object", "q", "Rome, Italy", "Rome", ["Rome"]) == 1.0


def test_neighbour_judges_are_checked():
    with pytest.raises(EditscopeError, match="unknown neighbourhood judge 'whole'"):
        NEIGHBOUR_JUDGES["whole"]

    class Bad:
        name = "bad"

        def __call__(self, question, before, after, golds):
            return 0.5

    with pytest.raises(MetricInputError, match="neighbourhood judge 'bad': returned 0.5, not 0 or 1"):
        judge_neighbour(Bad(), "q", "a", "b")
    with pytest.raises(MetricInputError, match="before: expected a str"):
        judge_neighbour("unchanged", "q", None, "b")
