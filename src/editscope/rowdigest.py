"""A digest per appended row (``results.jsonl``, ``lm_eval.jsonl``): a flipped digit inside a stored number leaves
valid JSON of the right types, so only a digest over the row's content can tell it from the number that was written.

The digest (:data:`KEY`, ``"sha256:<hex>"``) is the sha256 of the row **without that key**, as canonical JSON: keys
sorted at every depth, no spaces, ASCII (``\\uXXXX`` escapes), floats as Python's shortest round-trip repr — the text
``json.dumps(row, sort_keys=True, separators=(",", ":"))`` gives for the row ``json.loads`` reads back, so it is the
same on every machine and after any re-serialisation that keeps the values.

A run that writes such rows says so in its ``run.json`` (:data:`RUN_FLAG`: :data:`FORMAT`). In such a run a row
without a digest is as damaged as one whose digest does not match; in a run without the flag (written before rows
carried digests) rows are read as before, and a digest a row does carry is still checked. Readers strip the key: no
summary, comparison or display ever sees it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

KEY = "row_digest"
#: ``run.json``'s field saying that every row of the run carries a digest, and its value
RUN_FLAG = "row_digests"
FORMAT = "sha256-sorted-json-1"


def digest(row: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of ``row`` without :data:`KEY` as canonical JSON (see the module docstring)."""
    body = {k: v for k, v in row.items() if k != KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def dumps_sealed(text: str) -> str:
    """The JSON object ``text`` (one line, already strict JSON) with its digest as the last key, on one line."""
    body = json.loads(text)
    body.pop(KEY, None)
    return json.dumps({**body, KEY: digest(body)}, separators=(",", ":"), allow_nan=False)


def damage(row: Mapping[str, Any], required: bool) -> str | None:
    """Why ``row`` (a JSON object read back) cannot be trusted, or None: its digest is wrong, or it has none while
    ``required`` (the run's ``run.json`` has :data:`RUN_FLAG`)."""
    recorded = row.get(KEY)
    if recorded is None:
        return "the row has no digest (its run writes one with every row)" if required else None
    try:
        ok = isinstance(recorded, str) and recorded == digest(row)
    except ValueError:  # a NaN no writer puts there
        ok = False
    return None if ok else "the row does not match its digest (altered or corrupted)"


def strip(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without :data:`KEY` (in place; returned for chaining)."""
    row.pop(KEY, None)
    return row


def required_in(run_dir: str | Path) -> bool:
    """Whether the run in ``run_dir`` writes a digest with every row (its ``run.json`` has :data:`RUN_FLAG`). An
    absent or unreadable ``run.json`` says no: its own reader names that damage."""
    try:
        meta = json.loads((Path(run_dir) / "run.json").read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(meta, dict) and RUN_FLAG in meta


__all__ = ["FORMAT", "KEY", "RUN_FLAG", "damage", "digest", "dumps_sealed", "required_in", "strip"]
