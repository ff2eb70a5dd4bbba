"""Layer statistics for locate-then-edit methods: C = E[k kᵀ] of the MLP key, cached on disk."""

from editscope.data.corpus import Corpus
from editscope.stats.second_moment import (
    DEFAULT_SEQ_LEN,
    DEFAULT_STATS_DTYPE,
    DEFAULT_TOKEN_BUDGET,
    STATS_DTYPES,
    accumulate,
    cache_file,
    corpus_rows,
    second_moment,
    second_moments,
)

__all__ = [
    "DEFAULT_SEQ_LEN",
    "DEFAULT_STATS_DTYPE",
    "DEFAULT_TOKEN_BUDGET",
    "STATS_DTYPES",
    "Corpus",
    "accumulate",
    "cache_file",
    "corpus_rows",
    "second_moment",
    "second_moments",
]
