"""editscope.jsonl: fsync'd appends and the one torn-last-line policy every JSON Lines reader follows."""

from __future__ import annotations

import os

import pytest

from editscope import jsonl
from editscope.errors import EditscopeError
from editscope.jsonl import JsonlWriter, append_record, read_lines, read_records


def test_append_round_trip_fsyncs_every_record(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonl.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "sub" / "log.jsonl"
    records = [{"a": 1, "b": [1.5, None]}, "text", 3, {"nested": {"x": "ü"}}]
    for r in records[:2]:
        append_record(path, r)
    with JsonlWriter(path) as writer:
        for r in records[2:]:
            writer.append(r)
    assert len(synced) == len(records)
    assert read_records(path) == records
    assert [n for n, _ in read_lines(path)] == [1, 2, 3, 4]
    assert path.read_text(encoding="utf-8").count("\n") == len(records)


def test_missing_file_reads_as_empty(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize("tail", [
    '{"a": 3, "b',  # cut in the middle of a record
    '{"a": 3}',  # cut just before its newline: valid JSON, still torn
    '{"a": 3, "b\n',  # not valid JSON although a newline follows (garbage after a crash)
])
def test_torn_last_line_is_dropped_and_repair_cuts_it(tmp_path, tail):
    path = tmp_path / "log.jsonl"
    good = '{"a": 1}\n\n{"a": 2}\n'
    path.write_text(good + tail)
    assert read_records(path) == [{"a": 1}, {"a": 2}]
    assert path.read_text() == good + tail  # reading alone leaves the file as it is
    assert read_records(path, repair=True) == [{"a": 1}, {"a": 2}]
    assert path.read_text() == good
    append_record(path, {"a": 3})  # the next append starts on a line of its own
    assert read_records(path) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_bad_middle_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(EditscopeError, match=rf"^{path}:line 2: not valid JSON \(.*\); the file is damaged$"):
        read_records(path, repair=True)
    assert path.read_text() == '{"a": 1}\n{"a": \n{"a": 3}\n'  # nothing cut


def test_a_record_with_a_newline_inside_is_refused(tmp_path):
    path = tmp_path / "log.jsonl"
    with pytest.raises(ValueError, match="must not contain a newline"):
        append_record(path, {"a": 1}, dumps=lambda r: '{\n"a": 1}')
    assert path.read_text() == ""
