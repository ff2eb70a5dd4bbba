"""The wild protocol's answers (``engine.answer``): batched, left-padded greedy decoding with per-row stops equals a
plain one-prompt-at-a-time greedy loop, for stop strings, EOS and ``max_new_tokens``."""

from __future__ import annotations

import re

import pytest
import torch

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine, cut_at_stop
from editscope.lm.stops import sentence_end

PROMPTS = ["The capital of France is", "Danielle Darrieux is a citizen of", "Q: Who wrote Hamlet?\nA:",
           "The Eiffel Tower is located in the city of"]


def greedy_loop(bundle, engine: ScoringEngine, prompt: str, max_new: int, stop: tuple[str, ...]) -> str:
    """One prompt as the engine encodes it, decoded by :func:`greedy_ids`."""
    return greedy_ids(bundle, list(engine.context_ids(prompt)), max_new, stop)


def greedy_ids(bundle, ids: list[int], max_new: int, stop: tuple[str, ...] = (), skip_blank: bool = False,
               lead_in: bool = False) -> str:
    """No padding, no cache: argmax token after token until EOS, max_new tokens, or a stop string in the new text
    (``skip_blank``: in the new text once its leading whitespace is dropped; ``lead_in``: also once a first line
    ending in ":" is dropped); the text before the first stop string, with what was dropped before it."""
    eos = bundle.tokenizer.eos_token_id
    new: list[int] = []
    head, body = "", ""
    for _ in range(max_new):
        with torch.no_grad():
            logits = bundle.model(torch.tensor([ids + new])).logits[0, -1]
        token = int(logits.argmax())
        if token == eos:
            break
        new.append(token)
        head, body = split_lead(bundle.tokenizer.decode(new, skip_special_tokens=True), skip_blank or lead_in,
                                lead_in)
        if any(s in body for s in stop):
            break
    if stop:
        body = re.split("|".join(re.escape(s) for s in stop), body, maxsplit=1)[0]
    return (head + body).strip()


def split_lead(text: str, blank: bool, lead_in: bool) -> tuple[str, str]:
    """(what the stop strings do not read, what they read): leading whitespace (``blank``), then a first line that
    ends in ":" with the whitespace after it (``lead_in``)."""
    body = text.lstrip() if blank else text
    head = text[:len(text) - len(body)]
    first, newline, rest = body.partition("\n")
    if lead_in and newline and first.rstrip().endswith(":"):
        head, body = head + first + newline + rest[:len(rest) - len(rest.lstrip())], rest.lstrip()
    return head, body


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_answers_equal_a_plain_greedy_loop(tiny_bundles, family):
    bundle = tiny_bundles[family]
    engine = ScoringEngine(bundle, token_budget=64)  # 64 tokens: the prompts go in several batches
    free = [greedy_loop(bundle, engine, p, 12, ()) for p in PROMPTS]
    assert engine.answer(PROMPTS, max_new_tokens=12, stop=()) == free
    assert all(len(engine.tokenizer(a)["input_ids"]) >= 6 for a in free)  # random weights: no early EOS here
    # stop strings that occur part-way into some answers (a random model's own words), so rows stop one by one
    # inside a batch while the others go on
    stop = tuple(dict.fromkeys(a.split()[2] for a in free[:2]))
    expected = [greedy_loop(bundle, engine, p, 12, stop) for p in PROMPTS]
    assert engine.answer(PROMPTS, max_new_tokens=12, stop=stop) == expected
    assert any(len(e) < len(f) for e, f in zip(expected, free, strict=True))
    assert engine.answer(PROMPTS[:1], max_new_tokens=3, stop=()) == [greedy_loop(bundle, engine, PROMPTS[0], 3, ())]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_skip_blank_answers_equal_a_loop_that_drops_leading_whitespace(tiny_bundles, family):
    """Stop at a space: a random model's words come with a leading space, so the reference rule answers "" where
    ``skip_blank`` reads on to the first word's end; both equal the plain loop of their rule."""
    bundle = tiny_bundles[family]
    engine = ScoringEngine(bundle, token_budget=64)
    strict = engine.answer(PROMPTS, max_new_tokens=8, stop=(" ",))
    skipping = engine.answer(PROMPTS, max_new_tokens=8, stop=(" ",), blank_start="skip")
    assert strict == [greedy_loop(bundle, engine, p, 8, (" ",)) for p in PROMPTS]
    assert skipping == [greedy_ids(bundle, list(engine.context_ids(p)), 8, (" ",), skip_blank=True)
                        for p in PROMPTS]
    assert "" in strict and all(skipping) and all(" " not in a for a in skipping)


RETRIEVED = {  # four zsRE facts retrieved before a QA-wrapped question, and SmolLM2's answer under each rule
    "leading newline": ([("In which country did {} live?", "Madeleine Biardeau", "France"),
                         ("What city did {} live when he died?", "Melvyn Douglas", "New York City"),
                         ("What constellation is home to {}?", "HD 213429", "Aquarius"),
                         ("When was {} first discovered?", "Venus of Savignano", "1925")],
                        "In which country did Madeleine Biardeau live?",
                        {"stop": "", "skip": "France"}),  # skip: the words after the newline (a substring here)
    "lead-in colon": ([("What year did {} start?", "Bech-Bodson Ministry", "1953"),
                       ("What country did {} originate?", "Daytime Drinking", "South Korea"),
                       ("What is {}'s place of employment?", "Peter Koslowski", "Vrije Universiteit"),
                       ("Which was the position that {} held?", "Peter Damian", "cardinal")],
                      "What position did Peter Damian hold?",
                      # lead_in reads on, and is wrong: another retrieved fact's subject
                      {"skip": "The answer is:", "lead_in": "The answer is:\nPeter Koslowski"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(RETRIEVED))
def test_blank_start_rules_on_smollm2s_retrieval_answers(smollm2, case):
    """SmolLM2 with four retrieved facts opens its answer with a newline, or answers "The answer is:" and goes on on
    the next line: the reference's rule answers "", ``skip`` reads past leading whitespace, ``lead_in`` past the
    colon's line too; each rule's answer equals a plain loop of that rule over the tokens the model sees (the
    retrieved facts, then the question)."""
    from editscope.data.records import EditRequest
    from editscope.edit import edited

    facts, question, expected = RETRIEVED[case]
    prompt = f"Question: {question}\nAnswer:"
    loop_rule = {"stop": {}, "skip": {"skip_blank": True}, "lead_in": {"lead_in": True}}
    with edited(smollm2, "retrieval", [EditRequest(*f) for f in facts]):
        engine = ScoringEngine(smollm2)
        ids = list(engine.context_ids(prompt))
        answers = {rule: engine.answer([prompt], blank_start=rule)[0] for rule in expected}
        for rule, answer in answers.items():
            assert answer == greedy_ids(smollm2, ids, 50, (".", "\n"), **loop_rule[rule])
    for rule, want in expected.items():
        assert want in answers[rule] if case == "leading newline" and rule == "skip" else answers[rule] == want


@pytest.mark.parametrize(("text", "decoding", "final"), [
    ("Paris. It is big", 5, 5),
    ("Paris.", None, 5),  # still decoding: the next token decides
    ("Robert C. Newton. He", 16, 16),  # an initial
    ("Robert C.", None, None),
    ("U.S. Army", None, None),
    ("J.R.R. Tolkien", None, None),
    ("3.5 million years. Yes", 17, 17),  # a decimal point is followed by a digit
    ("Dr. Rajendra Prasad", None, None),  # a title
    ("No. 5 in the charts. It", 19, 19),
    ("https://doi.org/10.1515 is it", None, None),  # followed by a letter
    ("in 1998. He", 7, 7),
    ("Knee... And Other Low Joints", 4, 4),  # an ellipsis ends at its first dot
    ("c. 3000 BC", None, None),
    ("", None, None),
])
def test_sentence_end_by_hand(text, decoding, final):
    assert sentence_end(text, final=False) == decoding
    assert sentence_end(text, final=True) == final


def sentence_cut(text: str, final: bool) -> int | None:
    """The sentence rule read word by word (independent of :func:`sentence_end`'s scan): the first word that ends
    in "." and is followed by whitespace (or, ``final``, ends the text) ends the sentence, unless the part of it
    before its dots ends in a single-letter word or is a title."""
    titles = {"Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Mt", "Ft", "Jr", "Sr", "No", "vs", "Gen", "Col", "Lt", "Sgt",
              "Capt", "Rev", "Hon", "Gov", "Sen", "Rep", "ca"}
    for word in re.finditer(r"\S+", text):
        w = word.group()
        if not w.endswith(".") or (word.end() == len(text) and not final):
            continue
        stem = w.rstrip(".")
        last = re.split(r"\W", stem)[-1]
        if len(last) == 1 and last.isalpha() or last in titles:
            continue
        return word.start() + len(stem)
    return None


@pytest.mark.slow
def test_full_stop_sentence_reads_initials_and_decimals_on_smollm2(smollm2):
    """SmolLM2's answers with initials and a decimal: the reference's rule cuts them at the first ".", ``sentence``
    reads on to the sentence's end; each equals a one-prompt greedy loop of its rule."""
    engine = ScoringEngine(smollm2)
    prompts = ["Question: Who was the 18th president of the United States?\nAnswer:",
               "The Lord of the Rings was written by",
               "Question: What is the value of pi to two decimals?\nAnswer:"]
    any_stop = engine.answer(prompts)
    sentence = engine.answer(prompts, full_stop="sentence")
    assert any_stop == ["John F", "J", "3"]
    assert sentence == ["John F. Kennedy", "J.R.R. Tolkien", "3.14159"]
    for prompt, answer in zip(prompts, sentence, strict=True):
        ids, new, text = list(engine.context_ids(prompt)), [], ""
        for _ in range(50):
            with torch.no_grad():
                token = int(smollm2.model(torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == smollm2.tokenizer.eos_token_id:
                break
            new.append(token)
            text = smollm2.tokenizer.decode(new, skip_special_tokens=True)
            if "\n" in text or sentence_cut(text, final=False) is not None:
                break
        text = text.split("\n")[0]
        end = sentence_cut(text, final=True)
        assert answer == (text[:end] if end is not None else text).strip()


def test_answer_stops_at_eos(tiny_bundles):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    ids = list(engine.context_ids(PROMPTS[0]))
    with torch.no_grad():
        first = int(bundle.model(torch.tensor([ids])).logits[0, -1].argmax())
    with torch.no_grad():
        second = int(bundle.model(torch.tensor([ids + [first]])).logits[0, -1].argmax())
    saved = bundle.model.generation_config.eos_token_id
    bundle.model.generation_config.eos_token_id = second  # the answer's second token now ends it
    try:
        engine = ScoringEngine(bundle)
        assert engine.answer(PROMPTS, max_new_tokens=8, stop=())[0] == engine.tokenizer.decode([first]).strip()
    finally:
        bundle.model.generation_config.eos_token_id = saved


def test_cut_at_stop_and_bad_settings(tiny_bundles):
    assert cut_at_stop(" Paris. It is big\nyes", (".", "\n")) == "Paris"
    assert cut_at_stop("Tokyo\nJapan.", (".", "\n")) == "Tokyo"
    assert cut_at_stop("  no stop here ", (".",)) == "no stop here"
    assert cut_at_stop("\nleading newline", ("\n",)) == ""  # the protocol is strict: an empty answer
    assert cut_at_stop("\n leading newline\nmore", ("\n",), blank_start="skip") == "leading newline"
    assert cut_at_stop(" .5 m. Then", (".",), blank_start="skip") == ""  # only whitespace is skipped
    stops = (".", "\n")
    assert cut_at_stop(" The answer is:\nFrance.\nMore", stops, blank_start="skip") == "The answer is:"
    assert cut_at_stop(" The answer is:\nFrance.\nMore", stops, blank_start="lead_in") == "The answer is:\nFrance"
    assert cut_at_stop("\n\nThe answer is: \n\n Paris. It", stops, blank_start="lead_in") == (
        "The answer is: \n\n Paris")
    assert cut_at_stop("Answer: Paris\nMore", stops, blank_start="lead_in") == "Answer: Paris"  # no lead-in line
    assert cut_at_stop("The answer is:\n", stops, blank_start="lead_in") == "The answer is:"
    assert cut_at_stop("Note: it is\nParis", stops, blank_start="lead_in") == "Note: it is"
    assert cut_at_stop("\nThe answer is:\nParis", stops) == ""  # the reference's rule
    engine = ScoringEngine(tiny_bundles["llama"])
    with pytest.raises(EditscopeError, match="blank_start must be one of stop, skip, lead_in, not 'strip'"):
        engine.answer(PROMPTS, blank_start="strip")
    with pytest.raises(EditscopeError, match="max_new_tokens must be >= 1"):
        engine.answer(PROMPTS, max_new_tokens=0)
    with pytest.raises(EditscopeError, match="empty stop string"):
        engine.answer(PROMPTS, stop=("",))
    with pytest.raises(EditscopeError, match="full_stop must be one of any, sentence, not 'initials'"):
        engine.answer(PROMPTS, full_stop="initials")
    assert cut_at_stop(" Robert C. Newton. He", (".", "\n"), full_stop="sentence") == "Robert C. Newton"
    assert cut_at_stop(" Robert C. Newton\nHe", (".", "\n"), full_stop="sentence") == "Robert C. Newton"
    assert cut_at_stop(" Robert C.", (".",), full_stop="sentence") == "Robert C."  # no sentence end: kept whole
    assert cut_at_stop(" Robert C. Newton. He", ("\n",), full_stop="sentence") == "Robert C. Newton. He"


class _Demonstrations:
    """A context edit as IKE's: the same demonstrations before every prompt, then the prompt's own fact."""

    method = "demos"
    text = "New Fact: The capital of Spain is Lisbon\nPrompt: The capital of Spain is Lisbon\n\n"

    def prefix(self, prompt: str) -> str:
        return self.text + f"New Fact: {prompt.split()[-1]} is new\nPrompt: "


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_answers_after_a_shared_context_are_prefilled_once_and_equal_a_plain_loop(tiny_bundles, family, monkeypatch):
    """Reference: the plain greedy loop over the tokens of (context text + prompt) with no context edit in force.
    Prompts that all open with the context's text decode from one prefilled copy of it: (rows − 1) × its length fewer
    tokens go through the model than with sharing off."""
    bundle = tiny_bundles[family]
    monkeypatch.setattr(ScoringEngine, "share_prefix_min", 16)  # a short text: the tiny Gemma's window is 64 tokens
    edit = _Demonstrations()
    prompts = [p for p in PROMPTS if not p.startswith("Q:")]
    plain = ScoringEngine(bundle, share_prefix=False)
    expected = []
    for p in PROMPTS:  # the reference, without the edit in force
        ids = bundle.tokenizer(edit.prefix(p) + p)["input_ids"]
        expected.append(greedy_ids(bundle, ids, 8))
    counted: list[int] = []
    bundle.add_context(edit)
    handle = ScoringEngine(bundle).base_module.register_forward_pre_hook(
        lambda module, args, kwargs: counted.append(kwargs["position_ids"].numel()), with_kwargs=True)
    try:
        shared = ScoringEngine(bundle).answer(prompts, max_new_tokens=8, stop=())
        shared_tokens = sum(counted)
        counted.clear()
        separate = plain.answer(prompts, max_new_tokens=8, stop=())
        separate_tokens = sum(counted)
        mixed = ScoringEngine(bundle, token_budget=48).answer(PROMPTS, max_new_tokens=8, stop=())  # several calls
    finally:
        handle.remove()
        bundle.remove_context(edit)
    assert shared == separate == [e for p, e in zip(PROMPTS, expected, strict=True) if not p.startswith("Q:")]
    assert mixed == expected
    opening = len(bundle.tokenizer(edit.text)["input_ids"])
    assert separate_tokens - shared_tokens >= (len(prompts) - 1) * opening

