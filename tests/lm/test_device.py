"""``--device``/``--dtype``: a bfloat16 model loads and scores close to float32 with its own
fingerprint; a CUDA request without CUDA and unknown values are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.device import resolve_device, resolve_dtype
from editscope.lm.engine import ScoringEngine

PAIRS = [("The capital of France is", " Paris"), ("The capital of France is", " Rome")]


def test_bfloat16_loads_and_scores():
    fp32, bf16 = load("tiny-llama"), load("tiny-llama", device="cpu", dtype="bfloat16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16 and bf16.device.type == "cpu"
    assert bf16.fingerprint != fp32.fingerprint  # other weights: no stats/patch of fp32 served to it
    assert load("tiny-llama", device="cpu").fingerprint == fp32.fingerprint  # the device is no part of it
    want = [s.sum for s in ScoringEngine(fp32).score(PAIRS)]
    got = [s.sum for s in ScoringEngine(bf16).score(PAIRS)]
    assert all(isinstance(g, float) and abs(g - w) < 0.05 * abs(w) + 0.1 for g, w in zip(got, want, strict=True))


def test_score_command_with_dtype(capsys):
    assert main(["score", "--model", "tiny-llama", "--prompt", PAIRS[0][0], "--candidates", " Paris",
                 "--device", "auto" if not torch.cuda.is_available() else "cpu", "--dtype", "bfloat16",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n_tokens"] >= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
def test_cuda_without_cuda_is_one_line(capsys):
    assert main(["score", "--model", "tiny-llama", "--prompt", "x", "--candidates", " y", "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "CUDA is not available" in err and "\n" not in err


def test_bad_values():
    with pytest.raises(EditscopeError, match="expected cpu, cuda"):
        resolve_device("tpu")
    with pytest.raises(EditscopeError, match="cuda:N"):
        resolve_device("cuda:x")
    with pytest.raises(EditscopeError, match="expected one of"):
        resolve_dtype("int8")
    assert resolve_device("cpu") == torch.device("cpu") and resolve_dtype(None) == torch.float32


def test_run_config_device_dtype(tmp_path):
    from editscope.run import Runner, parse_config
    from editscope.run.store import read_json

    base = {"model": "tiny-llama", "methods": ["none"], "mode": "probe_only", "dataset": "counterfact",
            "slice": {"limit": 1}, "suites": ["counterfact"]}
    assert parse_config({**base, "device": "cpu"}).digest() == parse_config(base).digest()  # resumable elsewhere
    config = parse_config({**base, "device": "cpu", "dtype": "bfloat16"})
    assert config.digest() != parse_config(base).digest() and config.dtype == "bfloat16"
    Runner(config, out_dir=tmp_path / "r", progress=False).run()
    fingerprint = read_json(tmp_path / "r" / "run.json")["model"]["fingerprint"]
    assert fingerprint == load("tiny-llama", dtype="bfloat16").fingerprint
    for key, value in (("device", "gpu"), ("dtype", "int8")):
        with pytest.raises(EditscopeError, match=f"{key}"):
            parse_config({**base, key: value})


def test_no_device_means_editscope_device_else_auto(monkeypatch):
    """The documented default (docs/scale.md): no --device is $EDITSCOPE_DEVICE (the tests set cpu), else
    ``auto`` (CUDA when available, else the CPU), also when only --dtype is given."""
    from editscope.lm.device import resolve_device

    monkeypatch.delenv("EDITSCOPE_DEVICE", raising=False)
    assert resolve_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("EDITSCOPE_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setenv("EDITSCOPE_DEVICE", "tpu")
    with pytest.raises(EditscopeError, match="'tpu'"):
        resolve_device(None)
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
