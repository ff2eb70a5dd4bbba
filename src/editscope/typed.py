"""Does a value fit a type annotation: the one check behind hparams fields (editors, plug-ins, tuned knobs), run
config settings and suite options, so a value from YAML or ``--set`` is judged the same way wherever it lands.

The rules follow what YAML can give (bool, int, float, str, None, lists, mappings): a bool is neither an int nor a
float (``true`` is not 1), an int fits ``float``, every sequence annotation (``list[...]``, ``tuple[...]``,
``Sequence[...]``) wants a list, a path (``os.PathLike``) is a string, and a ``Literal`` choice is matched with the
same bool/int distinction.
"""

from __future__ import annotations

import collections.abc
import os
import types
import typing
from typing import Any

_SEQUENCES = (list, tuple, collections.abc.Sequence)
_MAPPINGS = (dict, collections.abc.Mapping)


def _same(value: Any, choice: Any) -> bool:
    """``value == choice`` without bool/int mixing (``True == 1`` in Python, not here)."""
    if isinstance(value, bool) or isinstance(choice, bool):
        return value is choice
    return value == choice


def _typed_sequence(value: Any, origin: Any, args: tuple[Any, ...], strict: bool) -> bool:
    """A list whose items fit the sequence's item type (``tuple[A, B]``: one item per position)."""
    if not isinstance(value, list):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[A, B]: one item per position
        return len(value) == len(args) and all(typed(v, a, strict=strict) for v, a in zip(value, args, strict=True))
    return not args or all(typed(v, args[0], strict=strict) for v in value)


def _typed_mapping(value: Any, args: tuple[Any, ...], strict: bool) -> bool:
    """A dict whose keys and values fit the mapping's key and value types."""
    if not isinstance(value, dict):
        return False
    key_type, value_type = args or (Any, Any)
    return all(typed(k, key_type, strict=strict) and typed(v, value_type, strict=strict) for k, v in value.items())


def _typed_class(value: Any, annotation: Any, origin: Any, strict: bool) -> bool:
    """A path, a scalar (no bool for int or float), or any other class by ``isinstance`` when ``strict``."""
    if annotation is os.PathLike or origin is os.PathLike:
        return isinstance(value, str)
    if annotation in (bool, str):
        return isinstance(value, annotation)
    if annotation in (int, float):
        return isinstance(value, int | float if annotation is float else int) and not isinstance(value, bool)
    kind = origin or annotation
    return not strict or not isinstance(kind, type) or isinstance(value, kind)


def typed(value: Any, annotation: Any, *, strict: bool = True) -> bool:
    """Whether ``value`` fits ``annotation``. A class this check has no rule for must match by ``isinstance`` when
    ``strict``; otherwise it passes (suite constructors convert their own options, so a suite's unknown annotation
    is left to its constructor), as does any annotation that is not a class (a type variable, a callable...)."""
    if annotation is Any:
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(typed(value, arg, strict=strict) for arg in args)
    if origin is typing.Literal:
        return any(_same(value, choice) for choice in args)
    if annotation is type(None):
        return value is None
    if origin in _SEQUENCES:
        return _typed_sequence(value, origin, args, strict)
    if origin in _MAPPINGS:
        return _typed_mapping(value, args, strict)
    return _typed_class(value, annotation, origin, strict)


__all__ = ["typed"]
