"""The one YAML reader of editscope: ``yaml.safe_load`` (no object construction) with YAML 1.2 numbers.

PyYAML follows YAML 1.1, where ``1e-3`` and ``2e4`` are strings (a float there needs a dot and a signed
exponent); every hparams file and ``--set v_lr=1e-3`` a researcher writes means a number. This loader resolves
them as floats, as YAML 1.2 and JSON do; everything else is PyYAML's safe loader unchanged.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    pass


_FLOAT_12 = re.compile(r"""^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)[eE][-+]?\d+$""")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def load(text: str) -> Any:
    """Parse YAML ``text`` safely; ``1e-3``-style numbers are floats."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def describe_error(exc: yaml.YAMLError) -> str:
    """A YAML error in one short line: ``line 4, column 1: expected ',' or '}', but got '<stream end>'`` (PyYAML's
    own text spans several lines and quotes the source)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    text = f"{where}{problem}"
    context = getattr(exc, "context", None)
    if context:
        text += f" ({context})"
    return " ".join(text.split())
