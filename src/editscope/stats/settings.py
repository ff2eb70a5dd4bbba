"""The statistics' settings as plain values (budgets, the precisions a hparams file may name), apart from the pass
that computes them: a hparams file, a config check or a plan reads these without loading torch."""

from __future__ import annotations

#: Default token budget: ~80 s for one early SmolLM2 layer (layer 4: ~85 s, two layers 3+4 in one pass
#: ~90 s) on 2 CPU cores, measured when the budget was chosen; the statistics of C change by < 2 % (relative Frobenius
#: norm) between 50k and 100k tokens.
DEFAULT_TOKEN_BUDGET = 100_000
DEFAULT_SEQ_LEN = 256
#: Statistics precision (hparams ``mom2_dtype``, ``editscope stats compute --stats-dtype``): the dtype C is summed,
#: returned and cached in. ``float32`` halves C on disk, in the editors and in the pass (sum + compensation instead
#: of float64 sum + mean); the solves convert C to float64 either way. It changes C (docs/scale.md gives the error),
#: so it is part of the cache key and recorded with the hparams of every row.
STATS_DTYPE_NAMES = ("float64", "float32")
DEFAULT_STATS_DTYPE = "float64"

__all__ = ["DEFAULT_SEQ_LEN", "DEFAULT_STATS_DTYPE", "DEFAULT_TOKEN_BUDGET", "STATS_DTYPE_NAMES"]
