"""Package names loaded on first use (PEP 562): importing one light module of a package (the results store, the
scorer's protocol) must not load the heavy modules its ``__init__`` re-exports (the runner, torch, transformers)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each public name from its module in ``where`` (name ->
    module) on first use and caches it in the package's namespace."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(where[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
