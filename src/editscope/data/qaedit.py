"""QAEdit loader (Yang et al., ACL 2025, "The Mirage of Model Editing: Revisiting Evaluation in the Wild";
WanliYoung/Revisit-Editing-Evaluation, ``data/QAEdit_inter_1k.json``).

QAEdit edits real questions from Natural Questions, TriviaQA and SimpleQA to their correct answers, to be judged
in the wild (the model's whole greedy answer, :mod:`editscope.metrics.answers`). A record holds::

    {"id": int, "source": "NQ" | "TQA" | "SQA", "prompt": str (the question), "target": str (its answer),
     "subject": str, "rephrase": str (the question reworded),
     "locality": [{"loc": str (an unrelated NQ question), "loc_ans": str (its answer)}, ...]}

Mapping to :class:`Case`:

- ``case_id`` = ``"{source}-{id}"`` (a ``case_id`` field, if a file has one, is used instead): ``id`` is the
  question's index in its source dataset, so the same ``id`` occurs under different sources (37 ids of the
  published 1,000-record file are shared by two sources; ``source`` and ``id`` together are unique);
- ``requests = (EditRequest(template, subject, target_new=target, target_true=None),)``. ``target`` is the
  correct answer the edit writes; the wrong answer it replaces is the unedited model's own, so there is no
  ``target_true``. The template is ``prompt`` with ``{}`` at the subject's first whole-word occurrence (no letter
  or digit right before or after it; the first occurrence of any kind when none is whole-word: in "... known as
  'tandoori' ... involves a tandoor ..." the subject "tandoor" is the second one). The match is exact and
  case-sensitive. A prompt that does not contain its subject is kept as published with
  ``subject_in_prompt=False`` and the subject as given (see :class:`EditRequest`); the loader never invents a
  subject;
- ``paraphrase_prompts = [rephrase]``;
- ``neighborhood`` = every ``(loc, loc_ans)`` of ``locality``, in file order (five per record in the published
  file; the reference ``edit.py`` scores only the first, a choice the suite makes, not the loader). ``loc`` is a
  Natural Questions question kept as published (lower case, no question mark);
- ``extra["qa_source"]`` = ``source`` (the record's origin: NQ, TQA or SQA in the published file), and
  ``extra["qaedit_id"]`` = ``id`` as published.

Answers (``target``, ``loc_ans``) have surrounding whitespace stripped (15 targets of the published file have a
leading or trailing space); targets are otherwise kept as published, including marks such as the ``" *"`` of
"Wilt Chamberlain *".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from editscope.data._common import Fields, Format, build_cases, read_json_list
from editscope.data.records import Case, EditRequest


def detect(record: Mapping[str, Any]) -> bool:
    """Whether a record looks like QAEdit (``prompt`` and ``target`` with a ``locality`` list)."""
    return "prompt" in record and "target" in record and isinstance(record.get("locality"), list)


def _whole_word(text: str, start: int, end: int) -> bool:
    before = text[start - 1] if start > 0 else " "
    after = text[end] if end < len(text) else " "
    return not before.isalnum() and not after.isalnum()


def subject_position(prompt: str, subject: str) -> int | None:
    """Where ``subject`` starts in ``prompt``: its first whole-word occurrence, else its first occurrence, else
    None (the prompt does not contain it). Exact, case-sensitive match."""
    first = prompt.find(subject)
    start = first
    while start >= 0:
        if _whole_word(prompt, start, start + len(subject)):
            return start
        start = prompt.find(subject, start + 1)
    return first if first >= 0 else None


def parse_qaedit_record(f: Fields, source: str) -> Case:
    """One QAEdit record as a Case (see the module docstring for the mapping)."""
    qa_source = f.string("source")
    qaedit_id = f.raw("id")
    published_id = f.case_id("id")
    case_id = f.case_id() if f.has("case_id") else f"{qa_source}-{published_id}"
    prompt = f.string("prompt")
    subject = f.string("subject")
    target = f.answer("target")
    rephrase = f.string("rephrase")
    neighborhood = [(item.string("loc"), item.answer("loc_ans")) for item in f.objects("locality")]
    if "{}" in prompt:
        raise f.error(f.path("prompt"), f"already holds '{{}}', cannot make a template of {prompt!r}")
    start = subject_position(prompt, subject)
    if start is None:
        request = EditRequest(prompt, subject, target, None, subject_in_prompt=False)
    else:
        template = prompt[:start] + "{}" + prompt[start + len(subject) :]
        request = EditRequest(template, subject, target, None)
    return Case(
        case_id=case_id,
        source=source,
        requests=(request,),
        paraphrase_prompts=[rephrase],
        neighborhood=neighborhood,
        extra={"qa_source": qa_source, "qaedit_id": qaedit_id},
    )


def parse_qaedit(records: list[Any], *, file: str, source: str, known_invalid: Collection[int] = ()) -> list[Case]:
    """All records of a QAEdit file as validated Cases."""
    return build_cases(records, file=file, source=source, parse_one=parse_qaedit_record,
                       known_invalid=known_invalid, id_field="id")


def load_qaedit(path: str | Path, *, source: str | None = None) -> list[Case]:
    """The Cases of a QAEdit JSON file (validated; ``source`` defaults to the file name)."""
    path = Path(path)
    return parse_qaedit(read_json_list(path), file=str(path), source=source or path.name)


FORMAT = Format(
    name="qaedit",
    description="QAEdit, Mirage of Model Editing (id, source, prompt, target, subject, rephrase, locality list)",
    detect=detect,
    parse=parse_qaedit,
)
