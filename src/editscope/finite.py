"""Finite or refused: the one check every number passes on its way to stdout, ``results.jsonl``, ``metrics.json``,
``run.json`` or a summary. NaN and ±inf never reach a JSON file (Python would write the non-standard tokens
``NaN``/``Infinity`` that strict readers reject) nor a printed table.

Two ways out for a value that is not finite:

- **refused** (:func:`require_finite`, :func:`strict_dumps`): an :class:`~editscope.errors.EditscopeError` naming
  where (the file or command) and the field (``post.counterfact.ES`` or ``methods.kn.rsd``) - for output that only
  a broken computation could make non-finite (a command's printed result, a config, a patch);
- **null with the reason** (:func:`nulled`, :func:`with_reasons`): the value becomes ``null`` and the record gets a
  ``non_finite`` object mapping each such field to what it was (``"nan"``, ``"inf"``, ``"-inf"``) - for a metric
  that is legitimately undefined (a perplexity over zero tokens, a log-probability that underflowed), where the
  rest of the record is still worth keeping. Summaries skip nulls (their ``n`` says how many values were used).

:func:`strict_dumps` is also the backstop of every JSON writer: ``json.dumps(allow_nan=False)`` after the check,
so a value that slipped past the check still cannot be written."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from editscope.errors import EditscopeError

REASONS_KEY = "non_finite"
"""The field of a record that maps each nulled field (dotted path) to the non-finite value it held."""


def _plain(value: Any) -> Any:
    """numpy / torch scalars and arrays as Python numbers and lists (what ``json`` writes for them)."""
    if isinstance(value, (str, bytes, bool, int, float)) or value is None:
        return value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _join(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def non_finite(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """``(dotted path, value)`` of every NaN or ±inf float inside ``value`` (dicts, lists, tuples, numpy/torch)."""
    value = _plain(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            yield path or "value", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite(item, _join(path, key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from non_finite(item, _join(path, i))


def _word(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def require_finite(value: Any, where: str) -> Any:
    """``value`` unchanged when every number in it is finite; else an error naming ``where`` and the first field:
    ``score --json: field rows[0].sum_logprob: nan is not a finite number; refused``."""
    for path, bad in non_finite(value):
        raise EditscopeError(f"{where}: field {path}: {_word(bad)} is not a finite number; refused (the model's "
                             "outputs or an input are not finite)")
    return value


def strict_dumps(value: Any, where: str, **kwargs: Any) -> str:
    """``json.dumps(value, allow_nan=False, **kwargs)`` after :func:`require_finite` (so the error names the
    field, not just "Out of range float values")."""
    require_finite(value, where)
    return json.dumps(value, allow_nan=False, **kwargs)


def nulled(value: Any, path: str = "") -> tuple[Any, dict[str, str]]:
    """A copy of ``value`` with every non-finite float replaced by ``None``, and ``{dotted path: "nan"|"inf"|
    "-inf"}`` of what was replaced (empty when nothing was)."""
    reasons: dict[str, str] = {}

    def walk(item: Any, where: str) -> Any:
        item = _plain(item)
        if isinstance(item, float) and not math.isfinite(item):
            reasons[where or "value"] = _word(item)
            return None
        if isinstance(item, dict):
            return {key: walk(v, _join(where, key)) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v, _join(where, i)) for i, v in enumerate(item)]
        return item

    return walk(value, path), reasons


def with_reasons(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with non-finite floats nulled and, when there were any, :data:`REASONS_KEY` mapping each nulled
    field to its value (merged with reasons the record already carries)."""
    clean, reasons = nulled(record)
    if reasons:
        clean[REASONS_KEY] = {**(record.get(REASONS_KEY) or {}), **reasons}
    return clean


def fmt(value: float, spec: str, where: str) -> str:
    """``format(value, spec)`` for a finite number; else refused naming ``where`` (for printed tables)."""
    value = float(value)
    if not math.isfinite(value):
        raise EditscopeError(f"{where}: {_word(value)} is not a finite number; refused (the model's outputs or an "
                             "input are not finite)")
    return format(value, spec)


def cell(value: float | None, spec: str, undefined: str = "–") -> str:
    """A table cell for a value that may be legitimately undefined (null, or a NaN such as a correlation of
    constant values): ``format(value, spec)`` when finite, else ``undefined`` (the table says what it means)."""
    if value is None or not math.isfinite(float(value)):
        return undefined
    return format(float(value), spec)
