"""YAML 1.2 numbers in every config, hparams file and --set override (PyYAML alone reads 1e-3 as a string)."""

from __future__ import annotations

import math

import pytest

from editscope import yamlio
from editscope.edit.hparams import parse_overrides
from editscope.edit.rome import RomeHParams


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
