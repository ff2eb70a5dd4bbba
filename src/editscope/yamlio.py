"""The one YAML reader of editscope: ``yaml.safe_load`` (no object construction) with YAML 1.2 numbers.

PyYAML follows YAML 1.1, where ``1e-3`` and ``2e4`` are strings (a float there needs a dot and a signed
exponent); every hparams file and ``--set v_lr=1e-3`` a researcher writes means a number. This loader resolves
them as floats, as YAML 1.2 and JSON do; everything else is PyYAML's safe loader unchanged.

:func:`load_file` reads a file the same way for every config and hparams file, so a bad one fails with the same
one-line error naming it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from editscope.errors import EditscopeError


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


def load_file(path: Path, kind: str, article: str = "a") -> Any:
    """Parse the YAML file ``path`` with :func:`load`. Any problem (a folder, no such file, not UTF-8, invalid or
    too deeply nested YAML) is an :class:`EditscopeError` of one line naming the file; ``kind`` (with its
    ``article``) says what the file should have been: ``config``, ``hparams`` (``"an"``)."""
    if path.is_dir():
        raise EditscopeError(f"{path}: is a folder, not {article} {kind} file")
    if not path.is_file():
        raise EditscopeError(f"{kind} file not found: {path}")
    try:
        return load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise EditscopeError(f"{path}: not a text (UTF-8) YAML file") from None
    except yaml.YAMLError as exc:
        raise EditscopeError(f"{path}: invalid YAML: {describe_error(exc)}") from exc
    except RecursionError:
        raise EditscopeError(f"{path}: YAML nested too deeply") from None
    except OSError as exc:
        raise EditscopeError(f"{path}: cannot read: {exc.strerror or exc}") from None
