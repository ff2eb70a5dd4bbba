"""No raw tracebacks: each bad input below, driven through the CLI in a subprocess,
ends in one ``editscope: error:`` line naming the file (and record/key), exit code 1, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from editscope.integrity import seal
from editscope.paths import data_file

CLI = [sys.executable, "-m", "editscope.cli"]
DELTA = "model.layers.1.mlp.down_proj.weight"  # tiny-llama: 64 x 128
EDIT = ["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is located in",
        "--subject", "Eiffel Tower", "--target", "Rome"]


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("editscope: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    print(errors[0])  # shown with -s: the messages, to read them as a user would
    return errors[0]


def _config(tmp_path, dataset, suites=("counterfact",), name="cfg.yaml", **extra) -> str:
    data = {"model": "tiny-llama", "output": str(tmp_path / "out"), "methods": [{"name": "rome",
            "overrides": {"v_steps": 2}}], "dataset": str(dataset), "slice": {"limit": 1}, "suites": list(suites),
            **extra}
    path = tmp_path / name
    path.write_text(json.dumps(data))  # JSON is YAML
    return str(path)


def _records(n=2):
    return json.loads(data_file("counterfact/counterfact-edit-1k.json").read_text())[:n]


def _dataset_text(tmp_path, text) -> str:
    path = tmp_path / "data.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("make,needles", [
    # a lone surrogate in a record (passed the loader, crashed the tokenizer mid-run)
    (lambda r: json.dumps([{**r[0], "subject": "Dani\ud83delle"}, *r[1:]]), ["record 0", "field subject"]),
    # a case_id of more than 4,300 digits (Python's int parsing limit)
    (lambda r: '[{"case_id": ' + "9" * 5000 + "}]", ["invalid JSON", "4300"]),
    # deeply nested JSON
    (lambda r: "[" * 100_000 + "]" * 100_000, ["nested"]),
], ids=["lone-surrogate", "huge-case-id", "deep-nesting"])
def test_bad_dataset_records(tmp_path, make, needles):
    dataset = _dataset_text(tmp_path, make(_records()))
    assert_one_line_error(cli("run", _config(tmp_path, dataset)), dataset, *needles)


def _patch(tmp_path, meta_changes=None, base_shape=(64, 128), with_base=True) -> str:
    meta = {"format": "editscope-patch-1", "method": "rome", "hparams": "{}", "fingerprint": "x",
            "model_name": "tiny-llama", "checksums": json.dumps({DELTA: "c"}), "requests": "[]", "info": "{}"}
    for key, value in (meta_changes or {}).items():
        if value is None:
            meta.pop(key)
        else:
            meta[key] = value
    tensors = {DELTA: torch.zeros(64, 128)}
    if with_base:
        tensors["base::" + DELTA] = torch.zeros(*base_shape)
    path = tmp_path / "p.safetensors"
    save_file(tensors, str(path), metadata=seal(meta, tensors))  # sealed: the checks behind the content digest
    return str(path)


@pytest.mark.parametrize("changes,needle", [({"method": None}, "key 'method' is missing"),
                                            ({"hparams": "{bad json"}, "key 'hparams': not valid JSON")],
                         ids=["no-method", "bad-hparams-json"])
def test_bad_patch_metadata(tmp_path, changes, needle):
    path = _patch(tmp_path, changes)
    assert_one_line_error(cli("patch", "info", path), path, needle)


@pytest.mark.parametrize("kw,needle", [(dict(with_base=False), "holds no base weights"),
                                       (dict(base_shape=(3, 3)), "shape (3, 3)")], ids=["missing", "wrong-shape"])
def test_revert_with_bad_base_tensors(tmp_path, kw, needle):
    path = _patch(tmp_path, **kw)
    proc = cli("patch", "revert", path, "--model", "tiny-llama", "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, path, needle)


def test_unwritable_outputs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    dataset = _dataset_text(tmp_path, json.dumps(_records()))
    assert_one_line_error(cli("run", _config(tmp_path, dataset), "-o", str(blocker / "out")), str(blocker))
    assert_one_line_error(cli(*EDIT, "--set", "v_steps=1", "--save-patch", str(blocker / "p.safetensors")),
                          str(blocker / "p.safetensors"))
    assert_one_line_error(cli("simulate", "--trials", "5", "--plot", str(blocker / "x.png")), str(blocker / "x.png"))


def test_binary_hparams_file(tmp_path):
    path = tmp_path / "hp.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    assert_one_line_error(cli(*EDIT, "--hparams", str(path)), str(path), "not a text")


def test_config_json_without_model_type(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 64}')
    proc = cli("score", "--model", str(folder), "--prompt", "Paris is in", "--candidates", " France")
    assert_one_line_error(proc, str(folder / "config.json"), "model_type")


def test_results_line_missing_its_keys(tmp_path):
    from editscope.run import Runner, load_config

    dataset = _dataset_text(tmp_path, json.dumps(_records()))
    Runner(load_config(_config(tmp_path, dataset)), progress=False, log=lambda _m: None).run()
    results = tmp_path / "out" / "results.jsonl"
    with open(results, "a") as fh:
        fh.write(json.dumps({"dataset": "data", "case_id": "9", "method": "rome"}) + "\n")
    assert_one_line_error(cli("report", str(tmp_path / "out")), f"{results}:line 2", "'group' is missing")


def test_suite_option_of_the_wrong_type(tmp_path):
    dataset = _dataset_text(tmp_path, json.dumps(_records()))
    config = _config(tmp_path, dataset, suites=[{"name": "counterfact", "options": {"max_new_tokens": "many"}}])
    assert_one_line_error(cli("run", config), config, "key 'suites[0].options.max_new_tokens': expected int")


def test_set_blames_the_override(tmp_path):
    line = assert_one_line_error(cli(*EDIT, "--set", "layers=[7]"), "--set layers=[7]", "out of range 0..3")
    assert line.startswith("editscope: error: --set layers=[7] (over ")


def test_directory_as_config_or_patch(tmp_path):
    assert_one_line_error(cli("run", str(tmp_path)), str(tmp_path), "is a folder")
    assert_one_line_error(cli("patch", "info", str(tmp_path)), str(tmp_path), "is a folder")
