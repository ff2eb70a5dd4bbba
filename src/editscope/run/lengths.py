"""Plan-time check that every text a run will score fits the model's context.

A prompt with its answer longer than the model's positions crashes GPT-2-style models (an IndexError in the
position embedding) and is scored silently past the trained length on rotary ones. The runner calls
:func:`check_lengths` after loading the cases and the model, before any edit, so such a record is reported with
its file, case, field, length and the limit instead. The scoring engine refuses the same inputs (a last guard)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle


def _texts(case: Case) -> Iterator[tuple[str, str]]:
    """(field, context + " " + answer) for every prompt/answer pair the suites may score, longest answer per
    prompt (a paraphrase is scored with each target)."""
    answers: list[str] = []
    for i, r in enumerate(case.requests):
        answers += [r.target_new] + ([r.target_true] if r.target_true else [])
        for j, a in enumerate([r.target_new, r.target_true, *r.correct_answers, *r.hard_false]):
            if a:
                yield f"requests[{i}].prompt+answer[{j}]", f"{r.text} {a}"
    answers += [*case.valid_answers, *case.hard_false, *case.random_false]
    longest = max(answers, key=len, default="")
    for i, p in enumerate(case.paraphrase_prompts):
        yield f"paraphrase_prompts[{i}]", f"{p} {longest}"
    for i, (p, a) in enumerate(case.neighborhood):
        yield f"neighborhood[{i}]", f"{p} {a}"
    for i, p in enumerate(case.generation_prompts):
        yield f"generation_prompts[{i}]", p
    if case.requests:
        text = case.requests[0].text
        for name in ("valid_answers", "hard_false", "random_false"):
            for i, a in enumerate(getattr(case, name)):
                yield f"{name}[{i}]", f"{text} {a}"


def check_lengths(bundle: Bundle, file: str, cases: Sequence[Case], *, margin: int = 0) -> None:
    """EditscopeError on the first text of ``cases`` (from ``file``) whose tokens with ``margin`` more exceed
    :attr:`Bundle.max_context`: ``FILE: case ID: field F: N tokens (prompt + answer), more than MODEL's
    context of L``."""
    limit = bundle.max_context
    if limit is None:
        return
    items = [(case, name, text) for case in cases for name, text in _texts(case)]
    # A byte-level BPE token covers at least one byte (plus BOS/EOS the tokenizer may add): only texts with more
    # bytes than the limit can be too long, so most runs tokenize nothing here.
    suspects = [item for item in items if len(item[2].encode("utf-8")) + 2 + margin > limit]
    if not suspects:
        return
    lengths = [len(ids) for ids in bundle.tokenizer([t for _, _, t in suspects])["input_ids"]]
    for (case, name, _), n in zip(suspects, lengths, strict=True):
        if n + margin > limit:
            raise EditscopeError(f"{file}: case {case.case_id}: field {name}: {n} tokens (prompt + answer), more "
                                 f"than {bundle.name}'s context of {limit} tokens; shorten or drop the record")
