"""Models: loading, architecture maps, hooks and the scoring engine.

The names below are loaded on first use (PEP 562), so importing one light module of the package (the scorer's
protocol, which suites name in their signatures) does not load torch and transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from editscope.lazy import lazy_exports

#: public name -> the module that defines it
_WHERE = {"ARCHS": "editscope.lm.archs", "ArchMap": "editscope.lm.archs", "arch_for_config": "editscope.lm.archs",
          "DEFAULT_MODEL": "editscope.lm.loading", "Bundle": "editscope.lm.loading", "load": "editscope.lm.loading",
          "prepare": "editscope.lm.loading"}

if TYPE_CHECKING:
    from editscope.lm.archs import ARCHS, ArchMap, arch_for_config
    from editscope.lm.loading import DEFAULT_MODEL, Bundle, load, prepare


__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = ["ARCHS", "ArchMap", "Bundle", "DEFAULT_MODEL", "arch_for_config", "load", "prepare"]
