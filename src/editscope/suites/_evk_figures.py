"""The EVK-Bench figure: Embedding Stability vs drift strength σ per method (paper 004, §3.1.1 and eq 9).
Imported only when a report is built (matplotlib). Returns PNG bytes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from editscope.plotting import method_colors, plt, png


def stability_vs_sigma(curves: Mapping[str, Mapping[str, Sequence[tuple[float, float, float, float]]]],
                       sigma: float) -> bytes:
    """One panel per drift type (plus all instances), one line per method: mean ES at each σ with 95% CI bars.
    ``curves`` is :meth:`editscope.suites.evk.EvkSuite.stability_by_sigma`; ``sigma`` (the suite's main σ) is
    marked by a dotted vertical line."""
    methods = list(curves)
    panels = list(dict.fromkeys(p for m in methods for p in curves[m]))
    colors = method_colors(methods)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 * len(panels) + 0.6, 3.0), squeeze=False, sharey=True)
    lows: list[float] = []
    for ax, panel in zip(axes[0], panels, strict=True):
        for m in methods:
            pts = curves[m].get(panel, [])
            if not pts:
                continue
            x, mean, lo, hi = (np.asarray(v, dtype=float) for v in zip(*pts, strict=True))
            err = np.vstack([np.where(np.isfinite(lo), mean - lo, 0.0), np.where(np.isfinite(hi), hi - mean, 0.0)])
            ax.errorbar(x, mean, yerr=err, marker="o", markersize=3.5, capsize=2.5, linewidth=1.2, color=colors[m],
                        label=m)
            lows += [v for v in (*mean, *lo) if math.isfinite(v)]
        ax.axhline(1.0, color="#555555", linestyle="--", linewidth=0.8)
        ax.axvline(sigma, color="#999999", linestyle=":", linewidth=0.8)
        ax.set_title(panel)
        ax.set_xlabel("drift σ")
    axes[0][0].set_ylabel("Embedding Stability (cosine)")
    if lows:
        low = min(lows)
        axes[0][0].set_ylim(low - 0.05 * max(1.0 - low, 1e-4), 1.0 + 0.05 * max(1.0 - low, 1e-4))
    axes[0][-1].legend(frameon=False, loc="lower left")
    fig.tight_layout()
    return png(fig)
