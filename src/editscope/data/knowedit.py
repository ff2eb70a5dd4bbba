"""KnowEdit loader: EasyEdit's knowledge-editing benchmark (Zhang et al. 2024, "A Comprehensive Study of Knowledge
Editing for Large Language Models"; zjunlp/KnowEdit on the HF hub, read by EasyEdit's
``easyeditor/dataset/knowedit.py`` ``KnoweditDataset`` and ``examples/run_knowedit_llama2.py``).

A record of the WikiData_counterfact, WikiData_recent and ZsRE files (the fact-editing parts) holds::

    {"subject": str, "prompt": str (a sentence or question containing the subject), "target_new": str,
     "ground_truth": str | [str] (optional: absent in WikiData_recent),
     "rephrase_prompt": str (optional: ZsRE),
     "portability": {"Reasoning" | "Subject_Aliasing" | "Logical_Generalization": [item, ...]} (optional),
     "locality": {"Relation_Specificity" | "Forgetfulness": [item, ...]} (optional)}

with ``item = {"prompt": str, "ground_truth": answer}`` and ``answer`` one of: a string (``"male"``), a list of
strings (``["genus"]``), or a list of alias lists (``[["Kai Wegner", "Kai Peter Wegner"]]``; Logical_Generalization
lists alternative answers as ``[["no"], ["incorrect"], ...]``). EasyEdit scores the first string of an answer
(``ground_truth[0][0]`` in run_knowedit_llama2.py), so the loader keeps that one as the scored answer.
WikiBio records (``text``/``labels``/``concept``: a passage to continue, no fact) are not edit requests and are
refused as records without ``prompt``.

Mapping to :class:`Case`: ``case_id`` = the record index (or its ``case_id`` field);
``requests = (EditRequest(template, subject, target_new, target_true=first ground_truth or None),)`` with the
template made from ``prompt`` by putting ``{}`` at the subject's first occurrence (a prompt without the subject
is a DataError: ROME-style editors need the subject's position); ``paraphrase_prompts = [rephrase_prompt]``;
``neighborhood`` = every locality (prompt, answer) in file order; ``extra["portability"]`` and
``extra["locality"]`` = ``{type: [[prompt, answer], ...]}`` for :mod:`editscope.suites.portability`.
Keys other than the known types are an error naming the known ones.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from editscope.data._common import Fields, Format, build_cases, read_json_list, string_problem, type_name
from editscope.data.records import Case, EditRequest

#: KnowEdit's portability types: what each tests (the suite's labels)
PORTABILITY_TYPES: dict[str, str] = {
    "Reasoning": "multi-hop question through the edited fact",
    "Subject_Aliasing": "the edited fact asked with an alias of the subject",
    "Logical_Generalization": "a logical consequence of the edited fact",
}
#: KnowEdit's locality types
LOCALITY_TYPES: dict[str, str] = {
    "Relation_Specificity": "another relation of the same subject",
    "Forgetfulness": "the original object of a 1-to-N relation, asked around the new one",
}


def detect(record: Mapping[str, Any]) -> bool:
    """Whether a record looks like KnowEdit (``prompt``/``target_new`` with a ``portability`` or ``locality``
    object; EasyEdit's CounterFact has flat ``locality_prompt`` fields instead)."""
    return "prompt" in record and "target_new" in record and any(
        isinstance(record.get(key), dict) for key in ("portability", "locality"))


def first_answer(f: Fields, key: str) -> str:
    """The answer EasyEdit scores from a KnowEdit ``ground_truth`` (string, list of strings, or list of alias
    lists): its first string, stripped. Any other shape, an empty list or an empty string is a DataError."""
    value = f.raw(key)
    where = f.path(key)
    if isinstance(value, str):
        problem = string_problem(value)
        if problem:
            raise f.error(where, problem)
        return value.strip()
    shape = "expected an answer string, a list of strings or a list of alias lists"
    if not isinstance(value, list):
        raise f.error(where, f"{shape}, got {type_name(value)}")
    if not value:
        raise f.error(where, "expected a non-empty list, got an empty list")
    for i, group in enumerate(value):
        aliases = group if isinstance(group, list) else [group]
        if isinstance(group, list) and not group:
            raise f.error(f"{where}[{i}]", "expected a non-empty list, got an empty list")
        for j, alias in enumerate(aliases):
            problem = string_problem(alias)
            if problem:
                raise f.error(f"{where}[{i}][{j}]" if isinstance(group, list) else f"{where}[{i}]", problem)
    first = value[0]
    return (first[0] if isinstance(first, list) else first).strip()


def _typed_items(f: Fields, key: str, known: Mapping[str, str]) -> dict[str, list[list[str]]]:
    """``{type: [[prompt, answer], ...]}`` of an optional ``portability``/``locality`` object."""
    if f.data.get(key) is None:
        return {}
    obj = f.obj(key)
    out: dict[str, list[list[str]]] = {}
    for name in obj.data:
        if name not in known:
            raise obj.error(obj.path(name), f"unknown {key} type (known: {', '.join(known)})")
        out[name] = [[item.string("prompt"), first_answer(item, "ground_truth")]
                     for item in obj.objects(name, nonempty=False)]
    return out


def parse_knowedit_record(f: Fields, source: str) -> Case:
    """One KnowEdit record as a Case (see the module docstring for the mapping)."""
    case_id = f.case_id() if f.has("case_id") else str(f.record)
    subject = f.string("subject")
    template = f.template_from_sentence("prompt", subject)
    target_new = f.answer("target_new")
    target_true = first_answer(f, "ground_truth") if f.data.get("ground_truth") is not None else None
    rephrase = f.optional_string("rephrase_prompt")
    portability = _typed_items(f, "portability", PORTABILITY_TYPES)
    locality = _typed_items(f, "locality", LOCALITY_TYPES)
    return Case(
        case_id=case_id,
        source=source,
        requests=(EditRequest(template, subject, target_new, target_true),),
        paraphrase_prompts=[rephrase] if rephrase else [],
        neighborhood=[(p, a) for items in locality.values() for p, a in items],
        extra={"portability": portability, "locality": locality},
    )


def parse_knowedit(records: list[Any], *, file: str, source: str, known_invalid: Collection[int] = ()) -> list[Case]:
    """All records of a KnowEdit file as validated Cases."""
    return build_cases(records, file=file, source=source, parse_one=parse_knowedit_record,
                       known_invalid=known_invalid)


def load_knowedit(path: str | Path, *, source: str | None = None) -> list[Case]:
    """The Cases of a KnowEdit JSON file (validated; ``source`` defaults to the file name)."""
    path = Path(path)
    return parse_knowedit(read_json_list(path), file=str(path), source=source or path.name)


FORMAT = Format(
    name="knowedit",
    description="KnowEdit, EasyEdit (prompt, subject, target_new, portability/locality objects)",
    detect=detect,
    parse=parse_knowedit,
)
