"""Inputs the tokenizer or the JSON parser cannot take are refused by the loaders with file, record and
field, on real records of every published format."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from editscope.data.counterfact import load_counterfact
from editscope.data.klob import load_klob_u
from editscope.data.mquake import load_mquake
from editscope.data.peak import load_peak
from editscope.data.zsre import load_zsre
from editscope.errors import DataError
from editscope.paths import data_file

# (loader, shared file, path of a string field in its records)
FORMATS = [
    (load_counterfact, "counterfact/counterfact-edit-1k.json", ("subject",)),
    (load_zsre, "zsre/zsre_mend_train-1k.json", ("rephrase",)),
    (load_peak, "peak/PEAK_counter.json", ("requested_rewrite", "subject")),
]


def shared_records(relative: str, n: int) -> list:
    return json.loads(data_file(relative).read_text(encoding="utf-8"))[:n]


def _write(tmp_path, records) -> str:
    path = tmp_path / "data.json"
    # ensure_ascii keeps a lone surrogate as the \\ud83d escape a real broken file holds
    path.write_text(json.dumps(records, ensure_ascii=True))
    return str(path)


@pytest.mark.parametrize(("load", "rel", "field"), FORMATS)
@pytest.mark.parametrize(("bad", "problem"), [
    ("A\ud83d B", "lone surrogate U+D83D at character 1"),
    ("A\x00B", "control character U+0000 at character 1"),
])
def test_unencodable_strings_name_file_record_field(tmp_path, load, rel, field, bad, problem):
    records = shared_records(rel, 3)
    *outer, last = field
    holder = records[2]
    for key in outer:
        holder = holder[key]
    holder[last] = bad + holder[last]
    path = _write(tmp_path, records)
    with pytest.raises(DataError) as err:
        load(path)
    assert err.value.file == path and err.value.record == 2 and err.value.field == ".".join(field)
    assert problem in str(err.value)


def test_tabs_and_newlines_are_ordinary_text(tmp_path):
    records = shared_records("counterfact/counterfact-edit-1k.json", 2)
    records[1]["target_new"] = "New\tYork"
    assert load_counterfact(_write(tmp_path, records))[1].request.target_new == "New\tYork"


def test_huge_integer_and_deep_nesting_are_data_errors(tmp_path):
    path = tmp_path / "data.json"
    path.write_text('[{"case_id": ' + "9" * 5000 + "}]")
    with pytest.raises(DataError, match=r"data.json: invalid JSON: .*4300"):
        load_counterfact(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="data.json: invalid JSON: nested too deeply"):
        load_mquake(path)
    lines = tmp_path / "klob.jsonl"
    lines.write_text('"a _"\n' + "9" * 5000 + "\n")
    with pytest.raises(DataError, match=r"klob.jsonl:record 1: invalid JSON"):
        load_klob_u(lines)


def test_cli_reports_one_line_not_a_traceback(tmp_path):
    records = shared_records("counterfact/counterfact-edit-1k.json", 2)
    records[1]["subject"] = "\ud800"
    path = _write(tmp_path, records)
    proc = subprocess.run([sys.executable, "-m", "editscope.cli", "run", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    config = tmp_path / "run.yaml"
    config.write_text(f"model: tiny-llama\nmethods: [rome]\ndataset: {path}\nsuites: [counterfact]\n")
    proc = subprocess.run([sys.executable, "-m", "editscope.cli", "run", str(config), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert f"{path}:record 1: field subject: contains a lone surrogate U+D800" in proc.stderr
