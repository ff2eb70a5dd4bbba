"""The results store: ``results.jsonl`` (one line per finished (dataset, case, method), appended with flush +
fsync through :mod:`editscope.jsonl`); everything else is written with :mod:`editscope.atomic` (import it from
there)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from editscope.atomic import atomic_write_text, file_lock
from editscope.errors import EditscopeError
from editscope.finite import with_reasons
from editscope.integrity import DIGEST_KEY, verify_folder, verify_json
from editscope.jsonl import JsonlWriter, read_lines
from editscope.rowdigest import KEY as ROW_DIGEST
from editscope.rowdigest import RUN_FLAG, damage, dumps_sealed, required_in, strip

RESULTS = "results.jsonl"
ARCHIVE = "results.slim.jsonl.gz"  # a run's rows without raw probes, compressed (editscope.run.archive)
RUN_JSON = "run.json"
MODELS_JSON = "models.json"  # the folder of a run with a models list (editscope.run.models)
LOCK = ".editscope.lock"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
TIMING_FIELDS = ("edit_seconds", "eval_seconds")
#: fields every results row has, with their JSON types
ROW_FIELDS: dict[str, type] = {"dataset": str, "case_id": str, "method": str, "group": int, "index": int,
                               "metrics": dict, "pre": dict, "post": dict}
#: fields a row may lack (rows written before the field existed), with their JSON types when present
OPTIONAL_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model": str, "editor": str, "method_display": str, "plugins": list, "mode": str, "group_size": int,
    "edit_seconds": (int, float), "eval_seconds": (int, float), "edit_info": dict, "requests": list, "hparams": dict,
    "conventions": dict, "runtime": dict, "protocol": dict, "checkpoint": bool, "edits_applied": int, "round": int,
    "non_finite": dict, "config_digest": str}
ROW_CONFIG_KEY = "config_digest"
"""A row's record of the run it belongs to (its run.json's ``config_digest``): resume and report refuse a row of
another run, however sound its own digest."""


def row_key(row: dict[str, Any]) -> tuple[str, str, str]:
    """What identifies a finished unit of work: (dataset label, case id, method label); a sequential_batches
    checkpoint row (``checkpoint: true``) is its own unit, its method part ``label@edits_applied``."""
    return unit_key(row["dataset"], row["case_id"], row["method"],
                    row.get("edits_applied") if row.get("checkpoint") else None)


def unit_key(dataset: str, case_id: str, method: str, checkpoint: int | None = None) -> tuple[str, str, str]:
    """The :func:`row_key` of a row; ``checkpoint``: the edits applied at a checkpoint row (None: a final row)."""
    return (dataset, case_id, method if checkpoint is None else f"{method}@{checkpoint}")


def json_default(obj: Any) -> Any:
    """``json.dumps``'s ``default`` for the values probes hold besides JSON's own: numpy and torch scalars and
    arrays."""
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def clean_metrics(metrics: dict[str, Any]) -> dict[str, float | None]:
    """Metric values as floats; NaN and ±inf become ``null`` (strict JSON)."""
    out: dict[str, float | None] = {}
    for key, value in metrics.items():
        v = float(value)
        out[key] = v if math.isfinite(v) else None
    return out


def dumps_row(row: dict[str, Any]) -> str:
    """One strict JSON line (no newline inside) ending in the row's digest (:mod:`editscope.rowdigest`). A non-finite
    float (a raw probe that underflowed, a metric over nothing) is written as ``null`` with the reason in the row's
    ``non_finite`` field (:mod:`editscope.finite`)."""
    return dumps_sealed(json.dumps(with_reasons(row), default=json_default, separators=(",", ":"), allow_nan=False))


def read_results(path: str | Path, *, repair: bool = False, dedupe: bool = False) -> list[dict[str, Any]]:
    """Rows of a results file, read with :func:`editscope.jsonl.read_lines`: a torn last line (no newline after
    it, or not valid JSON: a killed write) is ignored, and with ``repair`` cut off the file; a malformed line
    before it, a row without the fields every row has, or a row its digest does not vouch for
    (:mod:`editscope.rowdigest`) is an error naming ``file:line N``. Rows are returned without their digest.

    A (dataset, case, method) key that occurs twice means two writers or a hand edit; it would count a case
    twice in every summary, so it is an error naming both lines, unless ``dedupe`` keeps the first of each
    (with ``repair`` the file is then rewritten without the later copies)."""
    return _read_results(Path(path), repair=repair, dedupe=dedupe)[0]


def read_sound_results(path: str | Path, *, repair: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a results file its digests vouch for, and one line per damaged row left out (``file:line N``
    and why): what a resume recomputes and a merge reports as it does a torn line. With ``repair`` the file is
    rewritten without them (so the recomputed row is not a duplicate). Other damage raises as in
    :func:`read_results`."""
    rows, _dropped, damaged = _read_results(Path(path), repair=repair, dedupe=False, raise_damaged=False)
    return rows, damaged


def run_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run directory: its ``results.jsonl``, or, where it has none, its archive (``ARCHIVE``: the rows
    without their raw probes, :func:`editscope.run.archive.archive_run`; its run.json and rows checked against the
    folder's content digest first, :mod:`editscope.integrity`)."""
    run_dir = Path(run_dir)
    if not (run_dir / RESULTS).is_file() and (run_dir / ARCHIVE).is_file():
        verify_folder(run_dir, [RUN_JSON, ARCHIVE], what="run archive",
                      hint="delete the folder (a regeneration that reads the run itself archives it again)")
        return _read_archive(run_dir / ARCHIVE)
    return read_results(run_dir / RESULTS)


def _read_archive(path: Path) -> list[dict[str, Any]]:
    """An archive's rows; a file that is not gzip is one line (its digest matched, so it was written so)."""
    import zlib

    try:
        return read_results(path)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise EditscopeError(f"{path}: not a readable gzip archive of rows ({type(exc).__name__})") from None


def has_rows(folder: str | Path) -> bool:
    """Whether ``folder`` or a folder below it (a models list's runs) holds a non-empty results file or archive."""
    folder = Path(folder)
    return any(f.stat().st_size for name in (RESULTS, ARCHIVE) for f in folder.glob(f"**/{name}"))


def drop_duplicates(path: str | Path) -> tuple[int, list[str]]:
    """Keep the first row of each key in a results file (rewritten atomically), and cut out the rows their digests do
    not vouch for; returns how many duplicates were dropped and one line per damaged row cut out."""
    _rows, dropped, damaged = _read_results(Path(path), repair=True, dedupe=True, raise_damaged=False)
    return dropped, damaged


def _read_results(path: Path, *, repair: bool, dedupe: bool, raise_damaged: bool = True,
                  ) -> tuple[list[dict[str, Any]], int, list[str]]:
    """(rows, duplicates dropped, damaged rows left out); ``raise_damaged``: a damaged row raises instead."""
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, str], int] = {}
    dropped, damaged = 0, []
    required = required_in(path.parent)
    for line, row in read_lines(path, repair=repair):
        why = _damage(path, line, row, required)
        if why:
            message = f"{path}:line {line}: {why}"
            if raise_damaged:
                raise EditscopeError(f"{message}; not using it: resume the run to compute the row again")
            damaged.append(message)
            continue
        _check_row(path, line, row)
        key = row_key(row)
        if key in seen:
            if not dedupe:
                raise EditscopeError(f"{path}:line {line}: duplicate row {key} (first at line {seen[key]}): two "
                                     "writers or a hand edit; 'editscope run --repair' keeps the first of each")
            dropped += 1
            continue
        seen[key] = line
        rows.append(strip(row))
    if repair and (dropped or damaged):
        write_results(path, rows)
    return rows, dropped, damaged


def _damage(path: Path, line: int, row: Any, required: bool) -> str | None:
    """Why the row's digest does not vouch for it, or None. A row with a digest is judged by it first (damaged: a
    resume recomputes it whatever its shape); one without is checked field by field first (the clearer message)."""
    if not (isinstance(row, dict) and ROW_DIGEST in row):
        _check_row(path, line, row)
    return damage(row, required)


def _check_row(path: Path, line: int, row: Any) -> None:
    """The fields every row has and those it may have, with their JSON types; damage names the line and field."""
    if not isinstance(row, dict):
        raise EditscopeError(f"{path}:line {line}: not a JSON object; the file is damaged")
    for name, kind in ROW_FIELDS.items():  # what resume, summary, merge and report read from every row
        if name not in row:
            raise EditscopeError(f"{path}:line {line}: field {name!r} is missing; the file is damaged")
        if not isinstance(row[name], kind):
            raise EditscopeError(f"{path}:line {line}: field {name!r}: expected {kind.__name__}, got "
                                 f"{type(row[name]).__name__}; the file is damaged")
    for name, kinds in OPTIONAL_FIELDS.items():
        value = row.get(name)
        if name in row and (not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool)):
            expected = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
            raise EditscopeError(f"{path}:line {line}: field {name!r}: expected {expected}, got "
                                 f"{type(value).__name__}; the file is damaged")
    _check_metrics(path, line, row["metrics"])


def _check_metrics(path: Path, line: int, metrics: dict[str, Any]) -> None:
    """``metrics`` maps suite -> metric -> number or null (what summaries average); anything else names the field."""
    for suite, values in metrics.items():
        if not isinstance(values, dict):
            raise EditscopeError(f"{path}:line {line}: field 'metrics.{suite}': expected an object, got "
                                 f"{type(values).__name__}; the file is damaged")
        for name, value in values.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise EditscopeError(f"{path}:line {line}: field 'metrics.{suite}.{name}': expected a number or "
                                     f"null, got {type(value).__name__} {str(value)[:40]!r}; the file is damaged")


def run_lock(out_dir: str | Path):
    """Hold the run directory's exclusive lock (one writer per run: ``run``, resume and ``merge``); a second
    writer fails at once naming the holder's pid. Released on exit, also on a crash or SIGKILL."""
    out_dir = Path(out_dir)
    return file_lock(out_dir / LOCK, blocking=False, what=f"run directory {out_dir}")


class ResultsWriter(JsonlWriter):
    """Appends rows to ``results.jsonl`` (:class:`~editscope.jsonl.JsonlWriter`: one write, flush + fsync per
    row), serialised by :func:`dumps_row`."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, dumps_row)


def write_results(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write a whole results file atomically (merge)."""
    return atomic_write_text(path, "".join(dumps_row(r) + "\n" for r in rows))


#: the fields of ``run.json`` (and an archived copy) with their JSON types, checked when present: a resume, merge and
#: report read them; a run of an earlier version lacks some
RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (str,), "config": (dict,), "config_digest": (str,), "runtime": (dict,), "model": (dict,),
    "shard": (list,), "limit": (int, type(None)), "versions": (dict,), "started": (str, type(None)),
    "finished": (str, type(None)), "status": (str,), "rows": (int,), "argv": (list,), "metrics": (list, dict),
    "torch_threads": (list,),
    "planned_rows": (int,), "prompt_format": (dict,), "unverified_files": (list,), "error": (str,),
    "rejudged_from": (dict,), "lm_eval_version": (str,),
    RUN_FLAG: (str,)}
_MODEL_FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "fingerprint": (str,), "n_layers": (int,),
                                              "device": (str,)}


RUN_REQUIRED = ("format", "config", "config_digest", "model")
"""Fields every ``run.json`` has (``model`` with its ``name`` and ``fingerprint``)."""


def dumps_run_json(data: dict[str, Any]) -> str:
    """A ``run.json``'s text: strict JSON, sealed with a content digest over every field
    (:func:`editscope.integrity.seal_json`), so an edited field (a method, an hparam, the model) is named on read."""
    from editscope.finite import strict_dumps
    from editscope.integrity import seal_json

    return strict_dumps(seal_json(data), RUN_JSON, indent=2, default=str) + "\n"


def read_json(path: str | Path) -> dict[str, Any]:
    """A run's ``run.json`` (or ``models.json``), checked to be an object whose known fields have their types: damage
    is one line naming the file and the field. A ``run.json`` is checked against its content digest (one line naming
    the field that changed) and must hold :data:`RUN_REQUIRED`; one written before run.json was sealed has no digest
    and is read as before. The digest key is not in the returned object."""
    path = Path(path)
    if not path.is_file():
        raise EditscopeError(f"not a run directory (no {path.name}): {path.parent}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise EditscopeError(f"{path}: not valid JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise EditscopeError(f"{path}: expected a JSON object, got {type(data).__name__}; the file is damaged")
    if path.name == RUN_JSON:
        if DIGEST_KEY in data:
            data = verify_json(path, data, what="run record", hint="the run's record was edited or damaged; rerun "
                               "the config into a new output directory")
        for name in RUN_REQUIRED:
            if name not in data:
                raise EditscopeError(f"{path}: field '{name}' is missing; the file is damaged")
        for name in ("name", "fingerprint"):
            if not isinstance(data["model"], dict) or name not in data["model"]:
                raise EditscopeError(f"{path}: field 'model.{name}' is missing; the file is damaged")
        _check_fields(path, "", data, RUN_FIELDS)
        _check_fields(path, "model.", data.get("model") or {}, _MODEL_FIELDS)
        shard = data.get("shard", [0, 1])
        if len(shard) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in shard):
            raise EditscopeError(f"{path}: field 'shard': expected [i, n], got {str(shard)[:40]}; the file is damaged")
    return data


def _check_fields(path: Path, prefix: str, data: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> None:
    for name, kinds in fields.items():
        value = data.get(name)
        if name in data and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise EditscopeError(f"{path}: field '{prefix}{name}': expected {' or '.join(k.__name__ for k in kinds)}, "
                                 f"got {type(value).__name__}; the file is damaged")
