"""HF ``datasets`` as an optional case source: ``dataset: {hf: NAME, split: ...}`` in a run
config. Without ``datasets`` installed it is a one-line error saying how to install it; with it, a folder written
by ``save_to_disk`` gives the same cases as the same records in a JSON file."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from editscope.data import load_cases
from editscope.data.hf import hf_source, label
from editscope.errors import EditscopeError
from editscope.run.config import parse_config

HAS_DATASETS = importlib.util.find_spec("datasets") is not None

#: zsRE (MEND format) records: flat strings and lists of strings, which Arrow stores as they are
RECORDS = [
    {"subject": "Watts Humphrey", "src": "What university did Watts Humphrey attend?", "alt": "University of Michigan",
     "answers": ["Illinois Institute of Technology"], "rephrase": "What university did Watts Humphrey take part in?",
     "loc": "nq question: who played desmond doss father in hacksaw ridge", "loc_ans": "Hugo Weaving"},
    {"subject": "Ramalinaceae", "src": "Which family does Ramalinaceae belong to?", "alt": "Lamiinae",
     "answers": ["Lecanorales"], "rephrase": "What family are Ramalinaceae?",
     "loc": "nq question: types of skiing in the winter olympics 2018", "loc_ans": "Downhill"},
]


def config(dataset) -> dict:
    return {"model": "tiny-llama", "methods": ["rome"], "dataset": dataset, "suites": ["zsre"]}


def test_config_takes_an_hf_mapping():
    cfg = parse_config(config({"hf": "zjunlp/KnowEdit", "split": "test"}), where="exp.yaml")
    block = cfg.blocks[0]
    assert block.dataset == hf_source({"split": "test", "hf": "zjunlp/KnowEdit"}) and block.label == "KnowEdit-test"
    assert hf_source({"hf": "x/y"}) == hf_source({"hf": "x/y", "split": "train"}) and label(hf_source({"hf": "x/y"}))
    with pytest.raises(EditscopeError, match=r"exp\.yaml: key 'dataset': unknown key 'splt' in an hf dataset"):
        parse_config(config({"hf": "x/y", "splt": "train"}), where="exp.yaml")
    with pytest.raises(EditscopeError, match=r"key 'dataset': hf dataset key 'split': expected a non-empty string"):
        parse_config(config({"hf": "x/y", "split": 3}), where="exp.yaml")


def test_without_datasets_installed_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as when it is not installed
    with pytest.raises(EditscopeError) as info:
        load_cases(hf_source({"hf": "zjunlp/KnowEdit"}))
    message = str(info.value)
    assert "hf:zjunlp/KnowEdit[train]" in message and "pip install datasets" in message and "\n" not in message


@pytest.mark.skipif(not HAS_DATASETS, reason="the optional 'datasets' package is not installed in this venv")
def test_saved_dataset_equals_json(tmp_path):
    import datasets
    import pyarrow as pa

    folder = tmp_path / "zsre_hf"
    # an explicit fingerprint skips datasets' dill hashing of the table (which some pyarrow versions break)
    train = datasets.Dataset(pa.Table.from_pylist(RECORDS), fingerprint="zsre-fixture")
    datasets.DatasetDict({"train": train}).save_to_disk(str(folder))
    (tmp_path / "zsre.json").write_text(json.dumps(RECORDS))
    got = load_cases(hf_source({"hf": str(folder), "split": "train"}))
    want = load_cases(tmp_path / "zsre.json")
    assert [(c.case_id, c.requests, c.paraphrase_prompts, c.neighborhood) for c in got] == \
        [(c.case_id, c.requests, c.paraphrase_prompts, c.neighborhood) for c in want]
    with pytest.raises(EditscopeError, match=r"no split 'test' \(splits: train\)"):
        load_cases(hf_source({"hf": str(folder), "split": "test"}))
