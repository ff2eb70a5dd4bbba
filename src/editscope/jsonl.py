"""Append-only JSON Lines files: the one implementation of "append one record, then read them all back" for
every log editscope keeps (the results store, ``bench klob``'s result lines, ``locate --layer-curve --save``).

Writing: each record is one strict ``json`` text (no NaN/Infinity: :mod:`editscope.finite`) without a newline
inside, written with its ``\\n`` in one write, then flushed and fsync'd (:func:`append_record`, or
:class:`JsonlWriter` to keep the file open): a record that was appended survives a crash of the process or the
machine.

Reading (:func:`read_lines`, :func:`read_records`), one policy for a torn last line: a crash in the middle of
an append leaves at most the last line incomplete, so the **last non-blank line is dropped when it does not end
in a newline or is not valid JSON** (with ``repair`` it is also cut off the file, so the next append starts on
a line of its own). A line before it that is not valid JSON cannot come from a crash: it is an
:class:`~editscope.errors.EditscopeError` naming ``file:line N`` (1-based), and nothing is returned. Blank lines
are skipped."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from editscope.atomic import make_dirs
from editscope.errors import EditscopeError
from editscope.finite import strict_dumps

Dumps = Callable[[Any], str]


class JsonlWriter:
    """Appends records to ``path`` (created with its folder), each one write followed by flush + fsync."""

    def __init__(self, path: str | Path, dumps: Dumps | None = None) -> None:
        self.path = Path(path)
        make_dirs(self.path.parent, "folder")
        # default: strict JSON, a non-finite number refused naming the file and field (editscope.finite)
        self._dumps = dumps or (lambda record: strict_dumps(record, str(self.path)))
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def append(self, record: Any) -> None:
        text = self._dumps(record)
        if "\n" in text:
            raise ValueError(f"{self.path}: a JSON Lines record must not contain a newline")
        self._fh.write(text + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_record(path: str | Path, record: Any, dumps: Dumps | None = None) -> None:
    """Append one record to ``path`` (flush + fsync; the file is opened and closed around it)."""
    with JsonlWriter(path, dumps) as writer:
        writer.append(record)


def read_lines(path: str | Path, *, repair: bool = False) -> list[tuple[int, Any]]:
    """``(line number, record)`` of every record of ``path`` (1-based line numbers; [] when the file does not
    exist), under the module's torn-last-line policy; ``repair`` cuts a dropped last line off the file. A path
    ending in ``.gz`` is read gzip-decompressed (and never repaired)."""
    path = Path(path)
    if not path.is_file():
        return []
    packed = path.suffix == ".gz"  # a finished file kept compressed (an archived run): read as it is, never cut
    data = gzip.decompress(path.read_bytes()) if packed else path.read_bytes()
    lines = data.split(b"\n")  # the piece after the last newline is b"" when the file ends in one
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out: list[tuple[int, Any]] = []
    keep = len(data)  # bytes to keep: up to the end of the last record read
    offset = 0
    for i, line in enumerate(lines):
        start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            if i == last:
                keep = start
                break
            raise EditscopeError(f"{path}:line {i + 1}: not valid JSON ({exc}); the file is damaged") from None
        if i == last and i == len(lines) - 1:  # no newline after it: torn, even when the cut left valid JSON
            keep = start
            break
        out.append((i + 1, record))
    if repair and keep < len(data) and not packed:
        with open(path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return out


def torn_line(path: str | Path) -> int | None:
    """The line number (1-based) of a torn last line of ``path`` (one :func:`read_lines` drops: no newline after
    it, or not valid JSON), or None: the file is whole (or absent). Merge names it instead of passing the loss."""
    path = Path(path)
    if not path.is_file():
        return None
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = data.split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    if last < 0:
        return None
    if last == len(lines) - 1:
        return last + 1
    try:
        json.loads(lines[last])
    except ValueError:
        return last + 1
    return None


def read_records(path: str | Path, *, repair: bool = False) -> list[Any]:
    """The records of ``path`` in file order (:func:`read_lines` without the line numbers)."""
    return [record for _, record in read_lines(path, repair=repair)]
