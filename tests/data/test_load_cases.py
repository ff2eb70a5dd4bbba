"""load_cases: registered names, format detection for paths, slicing, and file-level errors."""

from __future__ import annotations

import json

import pytest

from editscope.data import DATASETS, dataset_path, detect_format, load_cases
from editscope.errors import DataError, EditscopeError


def test_every_registered_dataset_resolves_to_a_shared_file():
    assert set(DATASETS) == {
        "counterfact",
        "counterfact-1k",
        "counterfact-train",
        "counterfact-stream",
        "counterfact-stream-heldout",
        "zsre",
        "peak-cf",
        "peak-t",
        "mquake-hard",
        "qaedit",
        "counterfact-sample",
        "counterfact-train-sample",
        "zsre-sample",
    }
    for name, spec in DATASETS.items():
        assert dataset_path(name).is_file()
        assert dataset_path(name).as_posix().endswith(spec.file)


@pytest.mark.parametrize(("sample", "full", "n"), [("counterfact-sample", "counterfact", 40),
                                                    ("counterfact-train-sample", "counterfact-train", 400),
                                                    ("zsre-sample", "zsre", 40)])
def test_packaged_samples_are_the_first_records_of_the_published_files(sample, full, n, monkeypatch):
    from editscope.paths import SAMPLES

    assert {name for name, spec in DATASETS.items() if spec.packaged} == set(SAMPLES)
    expected = load_cases(full, limit=n)
    monkeypatch.setenv("EDITSCOPE_DATA", "/nonexistent/editscope-data")  # the samples need no data folder
    got = load_cases(sample)
    assert len(got) == n
    assert [(c.case_id, c.requests, c.paraphrase_prompts, c.neighborhood) for c in got] == \
        [(c.case_id, c.requests, c.paraphrase_prompts, c.neighborhood) for c in expected]
    assert {c.source for c in got} == {sample}
    with pytest.raises(EditscopeError, match="dataset folder not found: /nonexistent/editscope-data .*"
                       "counterfact-sample, zsre-sample, counterfact-train-sample work"):
        load_cases(full)


@pytest.mark.parametrize(
    ("relative", "fmt", "first_id"),
    [
        ("counterfact/counterfact-edit.json", "counterfact", "0"),
        ("zsre/zsre_mend_train-1k.json", "zsre", "0"),
        ("peak/PEAK_counter.json", "peak", "0"),
        ("peak/PEAK_time.json", "peak", "0"),
        ("mquake/MQuAKE-hard.json", "mquake", "7417"),
        ("qaedit/QAEdit_inter_1k.json", "qaedit", "NQ-1104"),
    ],
)
def test_a_path_is_loaded_in_its_detected_format(write_json, shared_records, relative, fmt, first_id):
    records = shared_records(relative, 3)
    assert detect_format(records[0], "x").name == fmt
    path = write_json(records, "sample.json")
    cases = load_cases(path)
    assert [c.source for c in cases] == ["sample.json"] * 3
    assert cases[0].case_id == first_id
    assert cases == load_cases(str(path))


def test_registry_and_path_give_equal_cases_apart_from_source(write_json, shared_records):
    by_name = load_cases("peak-t", limit=3)
    by_path = load_cases(write_json(shared_records("peak/PEAK_time.json", 3)))
    assert [c.source for c in by_name] == ["peak-t"] * 3
    for a, b in zip(by_name, by_path, strict=True):
        b.source = a.source
        assert a == b


def test_limit_and_offset_slice_after_validation():
    all_ids = [c.case_id for c in load_cases("counterfact-1k")]
    assert [c.case_id for c in load_cases("counterfact-1k", limit=5)] == all_ids[:5]
    assert [c.case_id for c in load_cases("counterfact-1k", offset=998)] == all_ids[998:]
    assert [c.case_id for c in load_cases("counterfact-1k", offset=10, limit=3)] == all_ids[10:13]
    assert load_cases("counterfact-1k", offset=5000) == []
    assert load_cases("counterfact-1k", limit=0) == []
    # zsRE: the slice is over the cases left after dropping the known-invalid records 534 and 723
    assert [c.case_id for c in load_cases("zsre", offset=533, limit=2)] == ["533", "535"]
    with pytest.raises(ValueError, match="offset and limit must be >= 0"):
        load_cases("zsre", offset=-1)


def file_error(path) -> str:
    with pytest.raises(DataError) as info:
        load_cases(path)
    assert info.value.record is None or info.value.record == 0
    return str(info.value)


def test_truncated_json_names_the_position(tmp_path, shared_records):
    text = json.dumps(shared_records("counterfact/counterfact-edit.json", 3), indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"case_id": 4')], encoding="utf-8")  # cut at the start of record 2
    problem = "invalid JSON: Expecting property name enclosed in double quotes: line 23 column 3 (char 806)"
    assert file_error(path) == f"{path}: {problem}"
    path.write_text('[{"case_id": 0, "prompt": "a"}, {"case_id": 1, "pro', encoding="utf-8")
    assert file_error(path) == f"{path}: invalid JSON: Unterminated string starting at: line 1 column 48 (char 47)"
    path.write_text('[{"case_id": 0, "prompt": "a"},', encoding="utf-8")
    assert file_error(path) == f"{path}: invalid JSON: Expecting value: line 1 column 32 (char 31)"


def test_invalid_json_syntax(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"case_id": 0,\n   "prompt": "x" "subject": "y"}\n]', encoding="utf-8")
    assert file_error(path) == f"{path}: invalid JSON: Expecting ',' delimiter: line 3 column 18 (char 36)"


def test_top_level_must_be_a_non_empty_list_of_objects(write_json):
    path = write_json({"data": []})
    assert file_error(path) == f"{path}: expected a list of records at the top level, got object"
    path = write_json([])
    assert file_error(path) == f"{path}: the file holds no records (an empty list)"
    path = write_json(["a sentence"])
    assert file_error(path) == f"{path}:record 0: expected an object, got string"


def test_unknown_format_lists_the_known_ones(write_json):
    path = write_json([{"question": "q", "answer": "a"}])
    message = file_error(path)
    assert message.startswith(f"{path}:record 0: cannot tell the dataset format from the keys (answer, question);")
    for name in ("mquake", "peak", "counterfact", "zsre", "qaedit"):
        assert f"{name}: " in message


def test_unknown_name_and_missing_file(tmp_path):
    with pytest.raises(EditscopeError, match="unknown dataset 'counterfakt': not a registered name"):
        load_cases("counterfakt")
    with pytest.raises(EditscopeError, match="unknown dataset 'counterfakt'; registered: counterfact, "):
        dataset_path("counterfakt")


def test_json_lines_is_refused_with_a_pointer_to_klob(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('"a _"\n', encoding="utf-8")
    assert file_error(path) == f"{path}: JSON Lines is not an edit-case format (KLoB-u: use data.klob.load_klob_u)"


def test_data_dir_comes_from_the_environment(monkeypatch, tmp_path, shared_records):
    (tmp_path / "zsre").mkdir()
    (tmp_path / "zsre" / "zsre_mend_train-1k.json").write_text(
        json.dumps(shared_records("zsre/zsre_mend_train-1k.json", 4))
    )
    monkeypatch.setenv("EDITSCOPE_DATA", str(tmp_path))
    assert [c.case_id for c in load_cases("zsre")] == ["0", "1", "2", "3"]
    with pytest.raises(EditscopeError, match="dataset file not found: .*peak/PEAK_counter.json"):
        load_cases("peak-cf")
