"""YAML 1.2 numbers in every config, hparams file and --set override (PyYAML alone reads 1e-3 as a string)."""

from __future__ import annotations

import math

import pytest

from editscope import yamlio
from editscope.edit.hparams import parse_overrides
from editscope.edit.rome import RomeHParams
from editscope.errors import EditscopeError


@pytest.mark.parametrize(("text", "value"), [
    ("1e-3", 1e-3), ("2E4", 2e4), ("-1.5e+2", -150.0), (".5e1", 5.0), ("1.0e38", 1e38), ("1_000e-3", 1.0),
])
def test_exponent_numbers_are_floats(text, value):
    got = yamlio.load(f"x: {text}")["x"]
    assert isinstance(got, float) and math.isclose(got, value)


@pytest.mark.parametrize("text", ["e5", "1e", "1e-", "abc", "'1e-3'", "v1e3"])
def test_other_text_is_unchanged(text):
    assert yamlio.load(f"x: {text}")["x"] == __import__("yaml").safe_load(f"x: {text}")["x"]


def test_safe_loader_still_refuses_python_objects():
    with pytest.raises(Exception, match="could not determine a constructor"):
        yamlio.load("x: !!python/object/apply:os.system ['true']")


def test_override_with_exponent_validates_as_float():
    hp = RomeHParams.from_dict({**RomeHParams().to_dict(), **parse_overrides(["v_lr=1e-3"])})
    assert hp.v_lr == 1e-3


@pytest.mark.parametrize(("content", "message"), [
    (None, "{p}: is a folder, not a config file"),
    ("missing", "config file not found: {p}"),
    (b"x: \xff\n", "{p}: not a text (UTF-8) YAML file"),
    (b"x: [1\n", "{p}: invalid YAML: line 2, column 1: expected ',' or ']', but got '<stream end>' "
                 "(while parsing a flow sequence)"),
    (b"[" * 5000 + b"]" * 5000, "{p}: YAML nested too deeply"),
])
def test_load_file_errors_are_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "c.yaml"
    if content is None:
        path.mkdir()
    elif content != "missing":
        path.write_bytes(content)
    with pytest.raises(EditscopeError) as info:
        yamlio.load_file(path, "config")
    assert str(info.value).startswith(message.format(p=path)) and "\n" not in str(info.value)


def test_load_file_reads_yaml_12_numbers_and_names_its_kind(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("v_lr: 1e-3\nlayers: [5]\n")
    assert yamlio.load_file(path, "hparams", "an") == {"v_lr": 1e-3, "layers": [5]}
    with pytest.raises(EditscopeError, match=r": is a folder, not an hparams file$"):
        yamlio.load_file(tmp_path, "hparams", "an")
