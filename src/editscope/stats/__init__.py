"""Layer statistics for locate-then-edit methods: C = E[k kᵀ] of the MLP key, cached on disk.

The names below are loaded on first use (PEP 562): the settings (:mod:`editscope.stats.settings`) are read by
hparams files and plans without loading torch. One layer's pass is ``editscope.stats.second_moment.second_moment``
(the package's ``second_moment`` is that module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from editscope.lazy import lazy_exports

_PASS = "editscope.stats.second_moment"
_SETTINGS = "editscope.stats.settings"
#: public name -> the module that defines it
_WHERE = {"DEFAULT_SEQ_LEN": _SETTINGS, "DEFAULT_STATS_DTYPE": _SETTINGS, "DEFAULT_TOKEN_BUDGET": _SETTINGS,
          "STATS_DTYPES": _PASS, "Corpus": "editscope.data.corpus", "accumulate": _PASS, "cache_file": _PASS,
          "corpus_rows": _PASS, "second_moments": _PASS}

if TYPE_CHECKING:
    from editscope.data.corpus import Corpus
    from editscope.stats.second_moment import (
        STATS_DTYPES,
        accumulate,
        cache_file,
        corpus_rows,
        second_moments,
    )
    from editscope.stats.settings import DEFAULT_SEQ_LEN, DEFAULT_STATS_DTYPE, DEFAULT_TOKEN_BUDGET


__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "DEFAULT_SEQ_LEN",
    "DEFAULT_STATS_DTYPE",
    "DEFAULT_TOKEN_BUDGET",
    "STATS_DTYPES",
    "Corpus",
    "accumulate",
    "cache_file",
    "corpus_rows",
    "second_moments",
]
