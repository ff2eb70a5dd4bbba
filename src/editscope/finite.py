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
so a value that slipped past the check still cannot be written.

:func:`walk` is the one traversal of nested dicts/lists under all of these, and under the other places that look
for non-finite numbers (hparams, run configs, an editor's ΔW and vectors, edit cards, tune files)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
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


def walk(value: Any, leaf: Callable[[str, Any], Any], path: str = "", *, plain: bool = True,
         join: Callable[[str, Any], str] = _join) -> Any:
    """A copy of ``value`` (dicts as dicts, lists and tuples as lists) with every other item replaced by
    ``leaf(path, item)``: the one traversal behind every non-finite check, so paths read the same everywhere.

    ``plain`` turns numpy/torch scalars and arrays into Python numbers and lists first; without it a tensor is one
    leaf (a ΔW is checked whole, not entry by entry). ``join`` spells the path of a key or position under
    ``path``."""
    if plain:
        value = _plain(value)
    if isinstance(value, dict):
        return {key: walk(item, leaf, join(path, key), plain=plain, join=join) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [walk(item, leaf, join(path, i), plain=plain, join=join) for i, item in enumerate(value)]
    return leaf(path, value)


def _bad(item: Any) -> bool:
    return isinstance(item, float) and not math.isfinite(item)


def non_finite(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """``(dotted path, value)`` of every NaN or ±inf float inside ``value`` (dicts, lists, tuples, numpy/torch)."""
    found: list[tuple[str, float]] = []

    def leaf(where: str, item: Any) -> Any:
        if _bad(item):
            found.append((where or "value", item))
        return item

    walk(value, leaf, path)
    yield from found


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

    def leaf(where: str, item: Any) -> Any:
        if _bad(item):
            reasons[where or "value"] = _word(item)
            return None
        return item

    return walk(value, leaf, path), reasons


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
