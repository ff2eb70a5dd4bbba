"""Mutated real records of every dataset format: field deletion, type swaps, unicode and huge
values. The loaders accept the record or raise one EditscopeError (DataError) — never another exception."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from editscope.data import load_cases
from editscope.data.klob import load_klob_u
from editscope.errors import EditscopeError
from editscope.paths import data_file

FILES = {  # format -> a shared file of it
    "counterfact": "counterfact/counterfact-edit-1k.json",
    "zsre": "zsre/zsre_mend_train-1k.json",
    "peak": "peak/PEAK_counter.json",
    "mquake": "mquake/MQuAKE-hard.json",
}
_CACHE: dict[str, list] = {}


def records(fmt: str) -> list:
    if fmt not in _CACHE:
        _CACHE[fmt] = json.loads(data_file(FILES[fmt]).read_text(encoding="utf-8"))[:3]
    return _CACHE[fmt]


def paths(obj, prefix=()):
    """Every key path inside a JSON value."""
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield from paths(value, (*prefix, key))


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30), st.just(10**4000),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.text(st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Zl", "Mn", "So"]), max_size=10),
    st.just("\ud800"), st.just(""), st.just("{}"), st.just("x" * 5000),
    st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _mutate(data, draw_path_index, kind, value):
    records_ = copy.deepcopy(data)
    all_paths = [p for p in paths(records_) if p]
    path = all_paths[draw_path_index % len(all_paths)]
    holder = records_
    for key in path[:-1]:
        holder = holder[key]
    last = path[-1]
    if kind == "delete":
        del holder[last]
    elif kind == "swap":
        holder[last] = value
    elif kind == "wrap":
        holder[last] = [holder[last]]
    return records_


def _write(obj) -> Path:
    fh = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8")  # noqa: SIM115
    with fh:
        json.dump(obj, fh, ensure_ascii=True)  # \\ud800 stays an escape, as in a real broken file
    return Path(fh.name)


def _accepts_or_one_clean_error(load, path: Path) -> None:
    try:
        load(path)
    except EditscopeError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("fmt", sorted(FILES))
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(index=st.integers(min_value=0, max_value=10**6), kind=st.sampled_from(["delete", "swap", "wrap"]),
       value=VALUES)
def test_mutated_records_are_accepted_or_refused_cleanly(fmt, index, kind, value):
    mutated = _mutate(records(fmt), index, kind, value)
    _accepts_or_one_clean_error(lambda p: load_cases(str(p)), _write(mutated))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(value=VALUES)
def test_mutated_klob_lines_are_accepted_or_refused_cleanly(value):
    lines = data_file("klob/KLoB-u.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    lines[1] = json.dumps(value, ensure_ascii=True) if not isinstance(value, int) or abs(value) < 10**4000 \
        else "9" * 5000
    fh = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8")  # noqa: SIM115
    with fh:
        fh.write("\n".join(lines) + "\n")
    _accepts_or_one_clean_error(load_klob_u, Path(fh.name))
