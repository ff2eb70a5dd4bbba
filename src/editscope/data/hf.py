"""Hugging Face ``datasets`` as an optional source of edit cases.

A run config names one as ``dataset: {hf: NAME, split: train, name: CONFIG, revision: REV}`` (``split`` defaults
to ``train``; ``name`` and ``revision`` are optional). ``NAME`` is a hub dataset id (``datasets.load_dataset``) or
a local folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``datasets.load_from_disk``).
The rows are then read exactly like a JSON file's records: the format is detected from the first row's keys and
every row validated (errors name ``hf:NAME[split]`` and the row index). ``datasets`` is not a dependency of
editscope: without it, such a source is a one-line error saying how to install it or convert the data to JSON.

Inside editscope a source is one string, ``hf:`` + canonical JSON of the mapping (:func:`hf_source`), so run
configs keep a plain dataset key for digests, labels and resume.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from editscope.errors import EditscopeError

PREFIX = "hf:"
KEYS = ("hf", "split", "name", "revision")


def hf_source(spec: Mapping[str, Any]) -> str:
    """The canonical source string of a ``{hf: NAME, split: ...}`` mapping; ValueError saying what is wrong."""
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in an hf dataset (known: {', '.join(KEYS)})")
    if "hf" not in spec:
        raise ValueError("a dataset mapping needs 'hf: NAME' (a hub dataset id or a save_to_disk folder)")
    for key in KEYS:
        value = spec.get(key)
        if key in spec and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"hf dataset key {key!r}: expected a non-empty string, got {value!r}")
    canonical = {"split": "train", **{k: spec[k] for k in KEYS if k in spec}}
    return PREFIX + json.dumps(canonical, sort_keys=True, ensure_ascii=False)


def is_hf_source(text: str) -> bool:
    return text.startswith(PREFIX + "{")


def parse_source(text: str) -> dict[str, str]:
    """The mapping of a source string made by :func:`hf_source`."""
    return json.loads(text[len(PREFIX):])


def describe(spec: Mapping[str, str]) -> str:
    """``hf:NAME[split]`` (with ``/CONFIG``): how errors and results name the source."""
    config = f"/{spec['name']}" if "name" in spec else ""
    return f"hf:{spec['hf']}{config}[{spec['split']}]"


def label(text: str) -> str:
    """A short default label for results: the dataset's last path component and the split."""
    spec = parse_source(text)
    return f"{Path(spec['hf']).name}-{spec['split']}"


def load_rows(text: str) -> tuple[list[Any], str]:
    """The rows of an hf source as plain records, and its description for error messages."""
    spec = parse_source(text)
    where = describe(spec)
    try:
        import datasets
    except ImportError:
        raise EditscopeError(f"dataset {where}: the Hugging Face 'datasets' package is not installed "
                             "(pip install datasets), or save the records as a JSON file and name that") from None
    folder = Path(spec["hf"]).expanduser()
    try:
        if folder.is_dir():  # a save_to_disk folder
            data = datasets.load_from_disk(str(folder))
            if isinstance(data, datasets.DatasetDict):
                if spec["split"] not in data:
                    raise EditscopeError(f"dataset {where}: no split {spec['split']!r} (splits: {', '.join(data)})")
                data = data[spec["split"]]
        else:
            data = datasets.load_dataset(spec["hf"], spec.get("name"), split=spec["split"],
                                         revision=spec.get("revision"))
    except EditscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 (hub, network, missing config/split, unreadable folder)
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise EditscopeError(f"dataset {where}: cannot be loaded ({type(exc).__name__}: {why})") from None
    return data.to_list(), where
