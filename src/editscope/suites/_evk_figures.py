"""The EVK-Bench figures: Embedding Stability vs drift strength σ per method (paper 004, §3.1.1 and eq 9) and the
embedding map of pre- and post-edit states (paper 004 Fig. 5). Imported only when a report is built (matplotlib).
Return PNG bytes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

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


#: drift type -> colour of its points (text prompts grey), from the Okabe-Ito palette, apart from the methods' colours
KIND_COLORS = {"subject": "#0072B2", "relation": "#E69F00", "all": "#009E73", "text": "#888888"}


def embedding_map(coords: np.ndarray, points: Mapping[str, Any], methods: Sequence[str], projection: str,
                  explained: tuple[float, float] | None) -> bytes:
    """One panel per method: every pre-edit point hollow, the method's post-edit points filled, coloured by drift
    type (``KIND_COLORS``), a thin line from each instance's pre to its post point. ``coords`` (n, 2) and ``points``
    (:meth:`editscope.suites.evk.EvkSuite.embedding_points`) are in the same order; axes name the projection and,
    for PCA, the share of variance on each axis."""
    kind, when, method = (np.asarray(points[k], dtype=object) for k in ("kind", "when", "method"))
    key = [tuple(k) for k in points["key"]]
    pre_at = {k: i for i, k in enumerate(key) if when[i] == "pre"}
    n = max(len(methods), 1)
    fig, axes = plt.subplots(1, n, figsize=(3.3 * n + 0.4, 3.4), squeeze=False, sharex=True, sharey=True)
    kinds = [k for k in KIND_COLORS if k in set(points["kind"])]
    for ax, m in zip(axes[0], methods or [None], strict=True):
        post = np.flatnonzero((when == "post") & (method == m))
        for i in post:
            j = pre_at.get(key[i])
            if j is not None:
                ax.plot(coords[[j, i], 0], coords[[j, i], 1], color=KIND_COLORS[kind[i]], alpha=0.25, linewidth=0.5)
        for k in kinds:
            pre = np.flatnonzero((when == "pre") & (kind == k))
            ax.scatter(coords[pre, 0], coords[pre, 1], s=12, facecolors="none", edgecolors=KIND_COLORS[k],
                       linewidths=0.7, label=f"{k}, pre")
            sel = post[kind[post] == k]
            ax.scatter(coords[sel, 0], coords[sel, 1], s=10, color=KIND_COLORS[k], label=f"{k}, post")
        ax.set_title(str(m))
        ax.set_xlabel(_axis_label(projection, explained, 0))
    axes[0][0].set_ylabel(_axis_label(projection, explained, 1))
    axes[0][-1].legend(frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5), markerscale=1.2)
    fig.suptitle(f"{projection} of final-token states, before (hollow) and after (filled) the edit", fontsize=10)
    fig.tight_layout()
    return png(fig)


def _axis_label(projection: str, explained: tuple[float, float] | None, axis: int) -> str:
    if projection == "PCA" and explained is not None:
        return f"PC{axis + 1} ({100 * explained[axis]:.1f}% of variance)"
    return f"{projection} {axis + 1}"
