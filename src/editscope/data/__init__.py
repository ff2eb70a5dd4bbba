"""Record types and loaders for the published dataset formats.

``load_cases(name_or_path)`` is the entry point: a registered name (see :data:`DATASETS`) or the path of a
JSON file in any known format (see :data:`FORMATS`; detected from the first record's keys). Every record of
the file is validated before anything is returned; a malformed one raises
:class:`~editscope.errors.DataError` as ``file:record N: field X: what is wrong`` with ``N`` the 0-based
index of the record in the file's top-level list (problem texts: :mod:`editscope.data._common`).

Conventions shared by all loaders: case ids are strings and unique within a file; answers (targets,
answer lists, neighbourhood answers) have surrounding whitespace stripped, since the scoring engine adds
the boundary space; prompts and subjects are kept exactly as published. How each format maps to
:class:`Case` is documented in its module: :mod:`.counterfact`, :mod:`.zsre`, :mod:`.peak`,
:mod:`.mquake`, :mod:`.knowedit`, :mod:`.qaedit`. KLoB-u sentences are not edit cases:
:func:`editscope.data.klob.load_klob_u`.

Adding a dataset in a known format is one ``DATASETS.register(Dataset(...), name)`` line; a new format is one
module exposing a ``FORMAT`` plus its line in :data:`FORMATS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from editscope.data import counterfact, counterfact_stream, hf, knowedit, mquake, peak, qaedit, zsre
from editscope.data._common import Format, first_record, read_json_list
from editscope.data.records import Case, EditRequest
from editscope.errors import DataError, EditscopeError
from editscope.paths import data_file, sample_file
from editscope.registry import Registry


@dataclass(frozen=True)
class Dataset:
    """A registered dataset: its file under the data folder, its format, and the known defects of that file.

    ``known_invalid`` maps record indices (0-based) of the published file that fail validation to the
    reason; those records are dropped when they do fail (and kept if a different file version has them
    valid). Any other invalid record still raises.
    """

    file: str
    format: Format
    description: str
    known_invalid: Mapping[int, str] = field(default_factory=dict)
    #: ``file`` is one of the datasets packaged with editscope, not a file under the data folder
    packaged: bool = False
    #: a dataset built from several files (e.g. ``counterfact-stream``): returns its validated cases; ``file`` is
    #: then the first of them (what error messages and length checks name)
    build: Callable[[], list[Case]] | None = None

    def path(self) -> Path:
        """The file, with a clear error when it is missing."""
        return sample_file(self.file) if self.packaged else data_file(self.file)


FORMATS: tuple[Format, ...] = (mquake.FORMAT, peak.FORMAT, knowedit.FORMAT, qaedit.FORMAT, counterfact.FORMAT,
                               zsre.FORMAT)
"""Known formats, most specific first: detection takes the first whose ``detect`` accepts the first record."""

_ZSRE_NO_TARGET = "alt is empty: the published record has no edit target"

DATASETS: Registry[Dataset] = Registry("dataset", expected=Dataset, describe=lambda d: d.description,
                                       listed_as="registered")
"""Registered dataset names -> files under :func:`editscope.paths.data_dir` (add one with
``DATASETS.register(Dataset(...), "name")``)."""

for _name, _dataset in {
    "counterfact": Dataset("counterfact/counterfact-edit.json", counterfact.FORMAT, "CounterFact, EasyEdit edit split"),
    "counterfact-1k": Dataset("counterfact/counterfact-edit-1k.json", counterfact.FORMAT, "CounterFact, 1k subset"),
    "counterfact-train": Dataset("counterfact/counterfact-train.json", counterfact.FORMAT, "CounterFact, train"),
    counterfact_stream.STREAM: Dataset(
        counterfact_stream.FILES[0], counterfact.FORMAT,
        "CounterFact edit + train splits, de-duplicated by prompt (first kept), but the held-out last 2,000: "
        "the lifelong stream (17,732 edits)", build=counterfact_stream.stream_cases),
    counterfact_stream.HELDOUT: Dataset(
        counterfact_stream.FILES[1], counterfact.FORMAT,
        "the last 2,000 de-duplicated records of the CounterFact stream, never in it (the general suite's "
        "known facts)", build=counterfact_stream.heldout_cases),
    "zsre": Dataset(
        "zsre/zsre_mend_train-1k.json",
        zsre.FORMAT,
        "zsRE (MEND format), 1k sample of the train split",
        known_invalid={534: _ZSRE_NO_TARGET, 723: _ZSRE_NO_TARGET},
    ),
    "peak-cf": Dataset("peak/PEAK_counter.json", peak.FORMAT, "PEAK-CF (counterfactual appending)"),
    "peak-t": Dataset("peak/PEAK_time.json", peak.FORMAT, "PEAK-T (temporal appending)"),
    "mquake-hard": Dataset("mquake/MQuAKE-hard.json", mquake.FORMAT, "MQuAKE-hard (4 edits, 4 hops per case)"),
    "qaedit": Dataset("qaedit/QAEdit_inter_1k.json", qaedit.FORMAT,
                      "QAEdit (Mirage of Model Editing), the authors' 1k sample of NQ/TriviaQA/SimpleQA questions"),
    # packaged with editscope (a pip install has them): the first records of the files above, unchanged
    "counterfact-sample": Dataset("counterfact-edit-sample.json", counterfact.FORMAT,
                                  "CounterFact, first 40 records of the edit split (packaged)", packaged=True),
    "counterfact-train-sample": Dataset("counterfact-train-sample.json", counterfact.FORMAT,
                                        "CounterFact, first 400 records of the train split (packaged)", packaged=True),
    "zsre-sample": Dataset("zsre-sample.json", zsre.FORMAT, "zsRE (MEND format), first 40 records (packaged)",
                           packaged=True),
}.items():
    DATASETS.register(_dataset, _name)


def detect_format(record: Mapping[str, Any], file: str) -> Format:
    """The format of a file, from its first record's keys; DataError on record 0 when none matches."""
    for fmt in FORMATS:
        if fmt.detect(record):
            return fmt
    keys = ", ".join(sorted(record)) or "none"
    known = "; ".join(f"{fmt.name}: {fmt.description}" for fmt in FORMATS)
    raise DataError(file, 0, None, f"cannot tell the dataset format from the keys ({keys}); known formats: {known}")


def dataset_path(name: str) -> Path:
    """The file of a registered dataset (EditscopeError naming the registered ones when unknown)."""
    return DATASETS.get(name).path()


def load_cases(name_or_path: str | os.PathLike[str], *, limit: int | None = None, offset: int = 0) -> list[Case]:
    """The validated Cases of a registered dataset or of a JSON file, sliced to ``[offset:offset+limit]``.

    A registered name wins over a file of the same name in the working directory. The whole file is parsed
    and every record validated before slicing. For a registered name, ``source`` of each Case is the name
    and the dataset's ``known_invalid`` records are dropped (so the slice is over the remaining cases); for
    a path, ``source`` is the file name and the format is detected from the first record.
    """
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"offset and limit must be >= 0, got offset={offset}, limit={limit}")
    key = os.fspath(name_or_path)
    if hf.is_hf_source(key):  # {hf: NAME, split: ...} of a run config (editscope.data.hf): rows read like records
        records, file = hf.load_rows(key)
        fmt = detect_format(first_record(records, file), file) if records else None
        if fmt is None:
            raise DataError(file, None, None, "the dataset holds no rows")
        cases = fmt.parse(records, file=file, source=hf.label(key), known_invalid={})
        return cases[offset:None if limit is None else offset + limit]
    if key in DATASETS and DATASETS[key].build is not None:
        built = DATASETS[key].build()  # type: ignore[misc]
        return built[offset:None if limit is None else offset + limit]
    if key in DATASETS:
        spec = DATASETS[key]
        path, source, known_invalid = spec.path(), key, spec.known_invalid
        fmt: Format | None = spec.format
    else:
        path = Path(key)
        if not path.is_file():
            raise EditscopeError(
                f"unknown dataset {key!r}: not a registered name ({', '.join(DATASETS)}) and no such file"
            )
        source, known_invalid, fmt = path.name, {}, None
    file = str(path)
    if path.suffix == ".jsonl":
        raise DataError(file, None, None, "JSON Lines is not an edit-case format (KLoB-u: use data.klob.load_klob_u)")
    records = read_json_list(path)
    if fmt is None:
        fmt = detect_format(first_record(records, file), file)
    cases = fmt.parse(records, file=file, source=source, known_invalid=known_invalid)
    end = None if limit is None else offset + limit
    return cases[offset:end]


__all__ = [
    "DATASETS",
    "FORMATS",
    "Case",
    "Dataset",
    "EditRequest",
    "Format",
    "dataset_path",
    "detect_format",
    "load_cases",
]
