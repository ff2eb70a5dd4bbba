"""Shared matplotlib set-up for every figure the report embeds (the report's own and the suites' ``figures``
hooks): the Agg backend (no display), one style, one colour per method, PNG bytes out.

A top-level module so suites can draw their figures without importing :mod:`editscope.report` (a package above
them). Importing it imports matplotlib: import it only where a figure is drawn."""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["PALETTE", "method_colors", "plt", "png"]

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
"""Okabe-Ito colour-blind-safe palette; method i gets ``PALETTE[i % 8]``."""

plt.rcParams.update({
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 150,
    "savefig.dpi": 150, "axes.grid": True, "grid.alpha": 0.3, "grid.linestyle": ":",
})


def png(fig) -> bytes:
    """``fig`` as PNG bytes (tight bounding box); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def method_colors(methods: Sequence[str]) -> dict[str, str]:
    """One palette colour per method, in the order given."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}
