"""Generated answers labelled by hand: what a wild-suite judge is measured against (``editscope judge-agreement``).

The packaged set is ``sample/judge-labels/labels.jsonl``; its README states the labelling rule, where the answers
came from, and the dev/test split. One JSON object per line:

* ``id`` (string, unique), ``dataset`` (``counterfact``, ``zsre``, ``qaedit``, ...), ``context`` (``plain`` or
  ``qa``: how the wild suite showed the prompt), ``method`` (the editor, or ``none`` for the unedited model),
  ``stage`` (``pre`` / ``post``), ``split`` (``dev`` / ``test``);
* ``role``: ``rewrite`` / ``paraphrase`` (is ``answer`` the ``gold`` object?) or ``neighborhood`` (does ``answer``,
  given after the edit, assert the same object as ``before``, the unedited model's answer?);
* ``prompt`` (the prompt as published), ``gold`` (non-empty list of strings: the edit target, or for a neighbour
  the dataset's answer), ``answer`` (what the model said, possibly empty), ``before`` (neighbours only);
* ``label``: 1 or 0, by the README's rule; ``note`` (optional): why, where the call was close.

A malformed record is one :class:`~editscope.errors.DataError` line, ``file:record N: field X: what is wrong``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from editscope.data._common import type_name
from editscope.errors import DataError, EditscopeError
from editscope.paths import sample_file

ROLES = ("rewrite", "paraphrase", "neighborhood")
STAGES = ("pre", "post")
SPLITS = ("dev", "test")
CONTEXTS = ("plain", "qa")


@dataclass(frozen=True)
class LabelledAnswer:
    """One hand-labelled answer (module docstring)."""

    id: str
    dataset: str
    context: str
    method: str
    stage: str
    split: str
    role: str
    prompt: str
    gold: tuple[str, ...]
    answer: str
    before: str | None
    label: int
    note: str = ""


def packaged_labels() -> Path:
    """The hand-labelled answers shipped with editscope."""
    return sample_file("judge-labels/labels.jsonl")


def _field(record: dict, key: str, file: str, line: int, *, empty: bool = False) -> str:
    if key not in record:
        raise DataError(file, line, key, "missing")
    value = record[key]
    if not isinstance(value, str):
        raise DataError(file, line, key, f"expected a string, got {type_name(value)}")
    if not empty and not value.strip():
        raise DataError(file, line, key, "expected a non-empty string, got an empty string")
    return value


def _choice(record: dict, key: str, choices: Sequence[str], file: str, line: int) -> str:
    value = _field(record, key, file, line)
    if value not in choices:
        raise DataError(file, line, key, f"expected one of {', '.join(choices)}, got {value!r}")
    return value


def _record(record: object, file: str, line: int) -> LabelledAnswer:
    if not isinstance(record, dict):
        raise DataError(file, line, None, f"expected an object, got {type_name(record)}")
    gold = record.get("gold")
    if not isinstance(gold, list) or not gold or not all(isinstance(g, str) and g.strip() for g in gold):
        raise DataError(file, line, "gold", "expected a non-empty list of non-empty strings"
                        if "gold" in record else "missing")
    label = record.get("label")
    if isinstance(label, bool) or label not in (0, 1):
        raise DataError(file, line, "label", f"expected 0 or 1, got {label!r}" if "label" in record else "missing")
    role = _choice(record, "role", ROLES, file, line)
    before = _field(record, "before", file, line, empty=True) if role == "neighborhood" else None
    note = record.get("note", "")
    if not isinstance(note, str):
        raise DataError(file, line, "note", f"expected a string, got {type_name(note)}")
    return LabelledAnswer(
        id=_field(record, "id", file, line), dataset=_field(record, "dataset", file, line),
        context=_choice(record, "context", CONTEXTS, file, line), method=_field(record, "method", file, line),
        stage=_choice(record, "stage", STAGES, file, line), split=_choice(record, "split", SPLITS, file, line),
        role=role, prompt=_field(record, "prompt", file, line), gold=tuple(gold),
        answer=_field(record, "answer", file, line, empty=True), before=before, label=int(label), note=note)


def load_judge_labels(path: str | Path | None = None) -> list[LabelledAnswer]:
    """The labelled answers of ``path`` (JSON Lines; default: :func:`packaged_labels`), checked record by record."""
    path = Path(path) if path is not None else packaged_labels()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise EditscopeError(f"labelled answers not found: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise EditscopeError(f"{path}: not a UTF-8 JSON Lines file ({type(exc).__name__})") from None
    out: list[LabelledAnswer] = []
    seen: dict[str, int] = {}
    for line, text in enumerate(lines):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(str(path), line, None, f"invalid JSON: {exc}") from None
        item = _record(record, str(path), line)
        if item.id in seen:
            raise DataError(str(path), line, "id", f"duplicate id {item.id!r} (first at record {seen[item.id]})")
        seen[item.id] = line
        out.append(item)
    if not out:
        raise EditscopeError(f"{path}: holds no labelled answer")
    return out


__all__ = ["CONTEXTS", "ROLES", "SPLITS", "STAGES", "LabelledAnswer", "load_judge_labels", "packaged_labels"]
