"""PEAK loaders: PEAK-CF (``PEAK_counter.json``) and PEAK-T (``PEAK_time.json``), keys as published.

Both files share one schema (checked on the published files): ``case_id``, a ROME-style
``requested_rewrite{prompt, relation_id, subject, target_new{str}, target_true{str}}``, ``postive_list``,
``negtive_list``, ``negtive_random_list``, ``para_add_prompts`` and ``neighborhood_prompts`` (a list of
``[prompt, answer]`` pairs). The misspelled keys are PEAK's own and accepted as published; the correct
spellings ``positive_list``, ``negative_list``, ``negative_random_list`` (and ``paraphrase_prompts``) are
accepted too, but not both spellings in one record. Errors name the published spelling.

Mapping to :class:`Case`:

- ``requests = (EditRequest(prompt, subject, target_new.str, target_true.str, correct_answers=positive list,
  hard_false=negative list),)`` (the lists as published, for plug-ins such as APP);
- ``valid_answers`` = positive list (the correct answers of the 1-to-N question; holds ``target_true``);
- ``hard_false`` = negative list (PEAK's *Hard* false answers O_h: objects directly related to the new
  object);
- ``random_false`` = random negative list;
- ``paraphrase_prompts`` = ``para_add_prompts``;
- ``neighborhood`` = ``neighborhood_prompts`` as ``(prompt, answer)`` tuples;
- ``extra["relation_id"]`` when present.

All five lists are required and non-empty. Answers are whitespace-stripped, prompts kept as published.
The paper states O_h and O are disjoint, but 35 records of PEAK-CF (e.g. 220, 249, 255, 405) share 51
answers between the positive and the negative list; they are kept as published (a suite that needs
disjoint lists must filter).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from editscope.data._common import Fields, Format, build_cases, read_json_list
from editscope.data.records import Case

POSITIVE_KEYS = ("postive_list", "positive_list")
NEGATIVE_KEYS = ("negtive_list", "negative_list")
RANDOM_KEYS = ("negtive_random_list", "negative_random_list")
PARAPHRASE_KEYS = ("para_add_prompts", "paraphrase_prompts")


def detect(record: Mapping[str, Any]) -> bool:
    """Whether a record looks like PEAK (a ``requested_rewrite`` object and a positive answer list)."""
    return isinstance(record.get("requested_rewrite"), dict) and any(k in record for k in POSITIVE_KEYS)


def parse_peak_record(f: Fields, source: str) -> Case:
    """One PEAK-CF / PEAK-T record as a Case (see the module docstring for the mapping)."""
    case_id = f.case_id()
    rewrite = f.obj("requested_rewrite")
    request = rewrite.rome_rewrite()
    valid = f.answers(f.pick(*POSITIVE_KEYS))
    hard_false = f.answers(f.pick(*NEGATIVE_KEYS))
    request = replace(request, correct_answers=tuple(valid), hard_false=tuple(hard_false))
    random_false = f.answers(f.pick(*RANDOM_KEYS))
    paraphrases = f.strings(f.pick(*PARAPHRASE_KEYS))
    neighborhood = f.pairs("neighborhood_prompts")
    extra: dict[str, Any] = {}
    relation_id = rewrite.optional_string("relation_id")
    if relation_id is not None:
        extra["relation_id"] = relation_id
    return Case(
        case_id=case_id,
        source=source,
        requests=(request,),
        paraphrase_prompts=paraphrases,
        neighborhood=neighborhood,
        valid_answers=valid,
        hard_false=hard_false,
        random_false=random_false,
        extra=extra,
    )


def parse_peak(records: list[Any], *, file: str, source: str, known_invalid: Collection[int] = ()) -> list[Case]:
    """All records of a PEAK file as validated Cases."""
    return build_cases(records, file=file, source=source, parse_one=parse_peak_record, known_invalid=known_invalid)


def load_peak(path: str | Path, *, source: str | None = None, known_invalid: Collection[int] = ()) -> list[Case]:
    """The Cases of a PEAK-CF or PEAK-T file (validated; ``source`` defaults to the file name)."""
    path = Path(path)
    records = read_json_list(path)
    return parse_peak(records, file=str(path), source=source or path.name, known_invalid=known_invalid)


FORMAT = Format(
    name="peak",
    description="PEAK-CF / PEAK-T (requested_rewrite, postive_list, negtive_list, negtive_random_list, "
    "para_add_prompts, neighborhood_prompts)",
    detect=detect,
    parse=parse_peak,
)
