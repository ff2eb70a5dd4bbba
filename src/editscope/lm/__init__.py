"""Models: loading, architecture maps, hooks and the scoring engine.

The names below are loaded on first use (PEP 562), so importing one light module of the package (the scorer's
protocol, which suites name in their signatures) does not load torch and transformers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_WHERE = {"ARCHS": "editscope.lm.archs", "ArchMap": "editscope.lm.archs", "arch_for_config": "editscope.lm.archs",
          "DEFAULT_MODEL": "editscope.lm.loading", "Bundle": "editscope.lm.loading", "load": "editscope.lm.loading",
          "prepare": "editscope.lm.loading"}

if TYPE_CHECKING:
    from editscope.lm.archs import ARCHS, ArchMap, arch_for_config
    from editscope.lm.loading import DEFAULT_MODEL, Bundle, load, prepare


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'editscope.lm' has no attribute {name!r}")


__all__ = ["ARCHS", "ArchMap", "Bundle", "DEFAULT_MODEL", "arch_for_config", "load", "prepare"]
