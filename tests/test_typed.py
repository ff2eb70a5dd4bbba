"""editscope.typed: the one check of a value against a type annotation (hparams, plug-ins, run config, suite
options), on hand examples."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional

import pytest

from editscope.typed import typed


@pytest.mark.parametrize(("value", "annotation", "fits"), [
    # a bool is neither an int nor a float; an int fits float; a float never fits int
    (3, int, True), (True, int, False), (3.0, int, False), ("3", int, False),
    (3, float, True), (2.5, float, True), (False, float, False), (None, float, False),
    (True, bool, True), (1, bool, False), (0, bool, False),
    ("x", str, True), (1, str, False),
    # Optional / unions
    (None, int | None, True), (4, int | None, True), ("4", int | None, False), (None, Optional[str], True),  # noqa: UP045
    (True, int | str, False), ("a", int | str, True),
    # Literal: the same bool/int distinction
    ("paper", Literal["paper", "rome"], True), ("other", Literal["paper", "rome"], False),
    (1, Literal[1, 2], True), (True, Literal[1, 2], False), (True, Literal[True, "auto"], True),
    (1, Literal[True], False),
    # sequences want a list, items checked
    ([1, 2], list[int], True), ([1, True], list[int], False), ((1, 2), list[int], False), ([], list[int], True),
    ([[1], [2, 3]], list[list[int]], True), ([[1], 2], list[list[int]], False),
    ([0.1, 2], Sequence[float], True), (["a", 1], Sequence[str], False), ("abc", Sequence[str], False),
    ([1, 2, 3], tuple[int, ...], True), ([1, "a"], tuple[int, str], True), ([1, "a", 2], tuple[int, str], False),
    (["a", 1], tuple[int, str], False),
    (None, Sequence[float] | None, True),
    # mappings: keys and values checked
    ({"a": 1.0, "b": 2}, dict[str, float], True), ({"a": "x"}, dict[str, float], False), ([], dict[str, int], False),
    # a path is a string
    ("p.txt", os.PathLike, True), (["a", "b"], Sequence[str | os.PathLike[str]], True), (3, os.PathLike, False),
    # Any and bare classes
    (object(), Any, True), ([1, "a"], list, True), ({"a": 1}, dict, True), ("x", list, False),
])
def test_typed_on_hand_examples(value, annotation, fits):
    assert typed(value, annotation) is fits


def test_unknown_class_is_isinstance_when_strict_and_left_to_the_constructor_otherwise():
    assert typed(Path("a"), Path) and not typed("a", Path)
    assert typed("a", Path, strict=False) and typed("x", list, strict=False)
    # the known rules hold either way
    assert not typed(True, int, strict=False) and not typed("a", list[int], strict=False)
