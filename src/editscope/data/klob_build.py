"""KLoB sets built from the shared data (paper 001, §3.3; Table 3 templates in :mod:`klob_templates`).

- **KLoB-c** (consistency): one fact (relation, subject, answer) through the three templates of its relation.
  Facts come from PEAK-CF (``requested_rewrite``: relation_id, subject, target_true; ``re_Pxx`` relations
  turned forward, see :func:`peak_facts`) and MQuAKE-hard (every hop
  of the *true* chains: hop 0's subject is the rewrite's subject, hop i's the answer of hop i−1; the hop's
  relation is the i-th rewrite's relation_id, accepted only where that rewrite's prompt filled with the hop's
  subject is the hop's cloze). Relations without Table 3 templates are left out; duplicates (same relation,
  subject, answer) are kept once.
- **KLoB-r** (relevance): two facts sharing an entity, from consecutive hops of MQuAKE-hard's true chains:
  (s, r1, o1) and (o1, r2, o2). The first fact is rendered with its relation's first Table 3 template (or its
  MQuAKE prompt when the relation has none); the second with its MQuAKE cloze. The paper's second sentence
  rephrases the whole two-hop question; MQuAKE ships no such statements, so the pair shares the entity o1
  instead (documented difference).
- **KLoB-u** (unbiasedness): the published KLoB-u sentences; the text before the blank is the prompt, its first
  word is treated as the "subject" (causal tracing needs tokens to corrupt), the answer is the model's own
  greedy next token.

:func:`recall_filter` keeps facts the model under test recalls, in every subset with facts (KLoB-c and KLoB-r; the
paper used Llama-2-7b with 8 in-context demonstrations; a KLoB-r pair needs both facts by default, or only its
single fact, ``mode_r="first"``, for a small model that knows few chains): the answer is recalled when every
answer token is the greedy prediction after the prompt, optionally preceded by ``shots`` demonstrations (the
same template about other subjects). :func:`format_counts` prints the kept examples per relation as the paper's
Table 2.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

from editscope.data.klob import KlobSentence, load_klob_u
from editscope.data.klob_templates import KLOB_C_TEMPLATES
from editscope.data.records import Case


@dataclass(frozen=True)
class KlobPrompt:
    """One sentence to locate: ``template`` with one ``{}`` for ``subject``; ``answer`` None = the model's
    greedy next token (KLoB-u)."""

    template: str
    subject: str
    answer: str | None

    @property
    def text(self) -> str:
        return self.template.replace("{}", self.subject)


@dataclass(frozen=True)
class KlobExample:
    """One KLoB example: ``subset`` "c" | "r" | "u", a stable ``example_id``, its relation (KLoB-r: the first
    fact's, as the paper counts it) and its prompts
    (three for KLoB-c, two for KLoB-r, one for KLoB-u); ``source`` names the dataset record."""

    subset: str
    example_id: str
    relation: str
    prompts: tuple[KlobPrompt, ...]
    source: str


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    answer: str
    cloze_template: str
    source: str


def peak_facts(cases: Iterable[Case]) -> Iterator[Fact]:
    """(relation, subject, true answer) of PEAK-CF cases that carry a relation id.

    PEAK-CF's ``re_Pxx`` relations are Wikidata relations read backwards ("{} is the author of": the subject is
    Pxx's tail); they become the forward fact (target_true, Pxx, subject), e.g. re_P50 (Bertrand Russell,
    "Power: A New Social Analysis") -> "The author of Power: A New Social Analysis is" Bertrand Russell.
    """
    for case in cases:
        relation = case.extra.get("relation_id")
        request = case.requests[0]
        if not relation or not request.target_true:
            continue
        source = f"{case.source}:{case.case_id}"
        if relation.startswith("re_"):
            yield Fact(relation[3:], request.target_true, request.subject, "{}", source)
        else:
            yield Fact(relation, request.subject, request.target_true, request.prompt, source)


def mquake_chains(cases: Iterable[Case]) -> Iterator[list[Fact]]:
    """The true chain of each MQuAKE case as facts (hops whose relation cannot be aligned end the chain)."""
    for case in cases:
        chain: list[Fact] = []
        subject = case.requests[0].subject
        for i, hop in enumerate(case.extra["single_hops"]):
            if i >= len(case.requests):
                break
            request, relation = case.requests[i], case.extra["relation_ids"][i]
            if not relation or request.prompt.replace("{}", subject) != hop.cloze:
                break
            chain.append(Fact(relation, subject, hop.answer, request.prompt, f"{case.source}:{case.case_id}:hop{i}"))
            subject = hop.answer
        yield chain


def klob_c(facts: Iterable[Fact]) -> list[KlobExample]:
    """KLoB-c examples: each fact with a Table 3 relation through its three templates (duplicates once)."""
    seen, out = set(), []
    for fact in facts:
        if fact.relation not in KLOB_C_TEMPLATES:
            continue
        key = (fact.relation, fact.subject, fact.answer)
        if key in seen:
            continue
        seen.add(key)
        templates = KLOB_C_TEMPLATES[fact.relation][1]
        prompts = tuple(KlobPrompt(t, fact.subject, fact.answer) for t in templates)
        out.append(KlobExample("c", f"c:{fact.relation}:{len(out)}", fact.relation, prompts, fact.source))
    return out


def klob_r(chains: Iterable[Sequence[Fact]]) -> list[KlobExample]:
    """KLoB-r examples: consecutive hops (s, r1, o1), (o1, r2, o2) of each chain (duplicates once)."""
    seen, out = set(), []
    for chain in chains:
        for first, second in zip(chain, chain[1:], strict=False):
            key = (first.relation, first.subject, first.answer, second.relation, second.answer)
            if key in seen:
                continue
            seen.add(key)
            entry = KLOB_C_TEMPLATES.get(first.relation)
            template = entry[1][0] if entry else first.cloze_template
            prompts = (KlobPrompt(template, first.subject, first.answer),
                       KlobPrompt(second.cloze_template, second.subject, second.answer))
            out.append(KlobExample("r", f"r:{first.relation}-{second.relation}:{len(out)}", first.relation,
                                   prompts, first.source))
    return out


def klob_u(sentences: Iterable[KlobSentence]) -> list[KlobExample]:
    """KLoB-u examples: each sentence's prompt with its first word as the subject slot."""
    out = []
    for sentence in sentences:
        words = sentence.prompt.split(" ", 1)
        if len(words) < 2 or "{}" in sentence.prompt:
            continue
        prompt = KlobPrompt("{} " + words[1], words[0], None)
        out.append(KlobExample("u", f"u:{sentence.index}", "-", (prompt,), f"KLoB-u:{sentence.index}"))
    return out


def build_klob(*, u_limit: int | None = None) -> dict[str, list[KlobExample]]:
    """All three subsets from the shared data (PEAK-CF + MQuAKE-hard for c, MQuAKE-hard for r, KLoB-u file)."""
    from editscope.data import load_cases

    peak = list(load_cases("peak-cf"))
    mquake = list(load_cases("mquake-hard"))
    chains = list(mquake_chains(mquake))
    facts = list(peak_facts(peak)) + [fact for chain in chains for fact in chain]
    return {"c": klob_c(facts), "r": klob_r(chains), "u": klob_u(load_klob_u(limit=u_limit))}


def shuffled(examples: Sequence[KlobExample], seed: int) -> list[KlobExample]:
    """A seeded order (so a small ``n`` spreads over relations instead of taking the file's first ones)."""
    order = list(examples)
    random.Random(seed).shuffle(order)
    return order


def relation_counts(examples: Iterable[KlobExample]) -> Counter:
    return Counter(example.relation for example in examples)


def format_counts(counts: Counter, title: str = "Number of examples of each relation") -> str:
    """Two relations per line, as the paper's Table 2."""
    def label(rel: str) -> str:
        entry = KLOB_C_TEMPLATES.get(rel)
        return f"{rel} ({entry[0]})" if entry else rel

    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    width = max([len(label(r)) for r, _ in items] + [8])
    lines = [f"{'Relation':<{width}} {'Count':>6}   {'Relation':<{width}} {'Count':>6}"]
    half = (len(items) + 1) // 2
    for left, right in zip(items[:half], items[half:] + [None] * (2 * half - len(items)), strict=True):
        line = f"{label(left[0]):<{width}} {left[1]:>6}"
        if right:
            line += f"   {label(right[0]):<{width}} {right[1]:>6}"
        lines.append(line)
    lines.append(f"{title}: {sum(counts.values())} in total, {len(counts)} relations")
    return "\n".join(lines)


def recalled(engine, prompt: KlobPrompt, demos: Sequence[KlobPrompt] = ()) -> bool:
    """Whether every answer token is the greedy prediction after the prompt (and the demonstrations)."""
    return recalled_many(engine, [(prompt, tuple(demos))])[0]


def _with_demos(prompt: KlobPrompt, demos: Sequence[KlobPrompt]) -> str:
    """The prompt preceded by one line per demonstration, "<demo sentence> <answer>."."""
    return "".join(f"{d.text} {d.answer.strip()}.\n" for d in demos if d.answer) + prompt.text


def recalled_many(engine, queries: Sequence[tuple[KlobPrompt, Sequence[KlobPrompt]]]) -> list[bool]:
    """:func:`recalled` for many (prompt, demonstrations) pairs in one batched engine call.

    With demonstrations, the request's context is the demonstration block alone and its continuation the
    sentence plus the answer, so every query of a template shares one forward of the (long) block; the verdict
    reads the answer's tokens only (the last ones: the same token sequence as scoring the answer after block +
    sentence)."""
    if not queries:
        return []
    from editscope.lm.engine import normalize_boundary

    requests, answer_lengths = [], []
    for prompt, demos in queries:
        full = _with_demos(prompt, demos)
        prefix = full[: len(full) - len(prompt.text)]
        answer_lengths.append(len(engine.encode_pair(full, prompt.answer)[1]))
        if not prefix:
            requests.append((full, prompt.answer))
            continue
        text, answer = normalize_boundary(full, prompt.answer, engine.add_space)
        requests.append((prefix, text[len(prefix):] + answer))
    scores = engine.score(requests)
    return [bool(score.token_is_argmax[-n:].all()) for score, n in zip(scores, answer_lengths, strict=True)]


def demonstrations(pool: Iterable[KlobExample], shots: int) -> Callable[[KlobPrompt], tuple[KlobPrompt, ...]]:
    """In-context demonstrations for the recall filter (paper 001 §3.3 used 8 with Llama-2-7b): for a prompt, the
    first ``shots`` prompts of ``pool`` written with the *same template* (so the same relation and wording) about
    another subject. Works alike for KLoB-c templates and KLoB-r's MQuAKE clozes."""
    by_template: dict[str, list[KlobPrompt]] = {}
    for example in pool:
        for prompt in example.prompts:
            if prompt.answer is None:
                continue
            same = by_template.setdefault(prompt.template, [])
            if all(d.subject != prompt.subject for d in same):
                same.append(prompt)

    def pick(prompt: KlobPrompt) -> tuple[KlobPrompt, ...]:
        if shots <= 0:
            return ()
        others = (d for d in by_template.get(prompt.template, []) if d.subject != prompt.subject)
        return tuple(islice(others, shots))

    return pick


RECALL_MODES = ("any", "all", "first", "none")
_RULES: dict[str, Callable[[list[bool]], bool]] = {
    "any": any, "all": all, "first": lambda got: got[0], "none": lambda _got: True}


def recall_filter(engine, examples: Iterable[KlobExample], *, mode: str = "any", mode_r: str = "all",
                  shots: int = 0, limit: int | None = None, pool: Sequence[KlobExample] = (),
                  chunk: int = 16) -> list[KlobExample]:
    """Examples whose facts the model under test recalls (paper 001 §3.3's filter, with this model instead of
    Llama-2-7b): KLoB-c needs ``mode`` ("any", "all", "first") of its templates; KLoB-r ``mode_r`` of its two
    facts ("all": both, the paper's reading; "first": the single fact, whose entity the second shares; "any");
    KLoB-u passes; "none" keeps every example of that subset (no filter). ``shots`` demonstrations per prompt
    come from ``pool`` (:func:`demonstrations`). Examples are scored ``chunk`` at a time in one batch and kept
    in order; stops after ``limit`` kept examples."""
    for name, value in (("mode", mode), ("mode_r", mode_r)):
        if value not in RECALL_MODES:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, RECALL_MODES))}, not {value!r}")
    modes = {"c": mode, "r": mode_r, "u": "none"}
    pick = demonstrations(pool, shots)
    kept: list[KlobExample] = []
    todo = iter(examples)
    while limit is None or len(kept) < limit:
        batch = list(islice(todo, chunk))
        if not batch:
            break
        tested = [e for e in batch if modes[e.subset] != "none"]
        hits = iter(recalled_many(engine, [(p, pick(p)) for e in tested for p in e.prompts]))
        verdict = {e.example_id: _RULES[modes[e.subset]]([next(hits) for _ in e.prompts]) for e in tested}
        for example in batch:
            if verdict.get(example.example_id, True) and (limit is None or len(kept) < limit):
                kept.append(example)
    return kept
