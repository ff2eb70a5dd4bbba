"""CounterFact loaders: the EasyEdit JSON format (shared here) and ROME's original ``counterfact.json``.

The format is detected from the first record's keys: ``requested_rewrite`` means ROME's format, otherwise
the EasyEdit keys are expected. All records of a file must be in the same format.

**EasyEdit** (``counterfact-edit.json``, ``counterfact-train.json``): one object per case with
``case_id, prompt, subject, target_new, ground_truth, rephrase_prompt, locality_prompt,
locality_ground_truth`` (all strings but ``case_id``, which is optional: the record's position by default).
Mapping to :class:`Case`:

- ``requests = (EditRequest(template, subject, target_new, ground_truth),)`` where the template is the
  ``prompt`` sentence with the subject's first occurrence replaced by ``{}`` (exact, case-sensitive; a
  prompt that does not contain the subject is a DataError on field ``prompt``);
- ``paraphrase_prompts = [rephrase_prompt]``;
- ``neighborhood = [(locality_prompt, locality_ground_truth)]``.

**ROME** (``counterfact.json`` of kmeng01/rome, also MEMIT's ``multi_counterfact.json``):
``requested_rewrite{prompt (template with {}), subject, target_new{str}, target_true{str}, relation_id}``,
``paraphrase_prompts``, ``neighborhood_prompts``, ``attribute_prompts``, ``generation_prompts``.
Mapping: the rewrite becomes the single request; ``paraphrase_prompts`` as is;
``neighborhood = [(p, target_true) for p in neighborhood_prompts]`` (ROME's neighbours are subjects whose
true object is the case's ``target_true``; entries given as ``{"prompt", "target"}`` objects keep their own
target); ``generation_prompts`` as is; ``extra["attribute_prompts"] = [(p, target_new), ...]`` (subjects
whose true object is ``target_new``); ``extra["relation_id"]``, ``extra["pararel_idx"]`` when present.
``paraphrase_prompts`` and ``neighborhood_prompts`` are required non-empty; ``attribute_prompts`` and
``generation_prompts`` may be absent.

Answers (targets) have surrounding whitespace stripped; prompts are kept as published.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from editscope.data._common import (
    Fields,
    Format,
    build_cases,
    first_record,
    read_json_list,
    string_problem,
    type_name,
)
from editscope.data.records import Case, EditRequest


def is_easyedit(record: Mapping[str, Any]) -> bool:
    """Whether a record looks like EasyEdit's CounterFact (flat ``prompt``/``subject``/``target_new``)."""
    return "requested_rewrite" not in record and {"prompt", "subject", "target_new"} <= record.keys()


def is_rome(record: Mapping[str, Any]) -> bool:
    """Whether a record looks like ROME's CounterFact (one ``requested_rewrite`` object)."""
    return isinstance(record.get("requested_rewrite"), dict)


def detect(record: Mapping[str, Any]) -> bool:
    """Whether a record is CounterFact in either format (PEAK also has a ``requested_rewrite`` object:
    the registry tries PEAK first)."""
    return is_easyedit(record) or is_rome(record)


def parse_easyedit_record(f: Fields, source: str) -> Case:
    """One EasyEdit CounterFact record as a Case (see the module docstring for the mapping); a record without
    ``case_id`` (a user's own file) is numbered by its position."""
    case_id = f.case_id(default_to_index=True)
    subject = f.string("subject")
    template = f.template_from_sentence("prompt", subject)
    target_new = f.answer("target_new")
    target_true = f.answer("ground_truth")
    paraphrase = f.string("rephrase_prompt")
    neighborhood = (f.string("locality_prompt"), f.answer("locality_ground_truth"))
    request = EditRequest(prompt=template, subject=subject, target_new=target_new, target_true=target_true)
    return Case(
        case_id=case_id,
        source=source,
        requests=(request,),
        paraphrase_prompts=[paraphrase],
        neighborhood=[neighborhood],
    )


def _prompt_answer_list(f: Fields, key: str, default_answer: str, *, nonempty: bool) -> list[tuple[str, str]]:
    """ROME's prompt lists: plain strings answered by ``default_answer``, or ``{"prompt", "target"}``."""
    if not nonempty and f.data.get(key) is None:
        return []
    values = f.raw(key)
    if not isinstance(values, list):
        raise f.error(f.path(key), f"expected a list of strings, got {type_name(values)}")
    if nonempty and not values:
        raise f.error(f.path(key), "expected a non-empty list, got an empty list")
    out: list[tuple[str, str]] = []
    for i, value in enumerate(values):
        where = f"{f.path(key)}[{i}]"
        if isinstance(value, dict):
            item = Fields(value, f.file, f.record, where)
            out.append((item.string("prompt"), item.answer("target")))
            continue
        problem = string_problem(value)
        if problem:
            raise f.error(where, problem)
        out.append((value, default_answer))
    return out


def parse_rome_record(f: Fields, source: str) -> Case:
    """One ROME-format CounterFact record as a Case (see the module docstring for the mapping)."""
    case_id = f.case_id()
    rewrite = f.obj("requested_rewrite")
    request = rewrite.rome_rewrite()
    assert request.target_true is not None  # rome_rewrite requires it
    paraphrases = f.strings("paraphrase_prompts")
    neighborhood = _prompt_answer_list(f, "neighborhood_prompts", request.target_true, nonempty=True)
    attribute = _prompt_answer_list(f, "attribute_prompts", request.target_new, nonempty=False)
    generation = f.optional_strings("generation_prompts")
    extra: dict[str, Any] = {"attribute_prompts": attribute}
    relation_id = rewrite.optional_string("relation_id")
    if relation_id is not None:
        extra["relation_id"] = relation_id
    if "pararel_idx" in f.data:
        extra["pararel_idx"] = f.data["pararel_idx"]
    return Case(
        case_id=case_id,
        source=source,
        requests=(request,),
        paraphrase_prompts=paraphrases,
        neighborhood=neighborhood,
        generation_prompts=generation,
        extra=extra,
    )


def parse_counterfact(records: list[Any], *, file: str, source: str, known_invalid: Collection[int] = ()) -> list[Case]:
    """All records of a CounterFact file as validated Cases; the format comes from the first record."""
    parse_one = parse_rome_record if is_rome(first_record(records, file)) else parse_easyedit_record
    return build_cases(records, file=file, source=source, parse_one=parse_one, known_invalid=known_invalid)


def load_counterfact(path: str | Path, *, source: str | None = None, known_invalid: Collection[int] = ()) -> list[Case]:
    """The Cases of a CounterFact file in EasyEdit or ROME format (validated; ``source`` defaults to
    the file name)."""
    path = Path(path)
    records = read_json_list(path)
    return parse_counterfact(records, file=str(path), source=source or path.name, known_invalid=known_invalid)


FORMAT = Format(
    name="counterfact",
    description="CounterFact, EasyEdit format (prompt, subject, target_new, ground_truth, ...) or ROME "
    "format (requested_rewrite, paraphrase_prompts, neighborhood_prompts, ...)",
    detect=detect,
    parse=parse_counterfact,
)
