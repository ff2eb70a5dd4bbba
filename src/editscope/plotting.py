"""Shared matplotlib set-up for every figure the report embeds (the report's own and the suites' ``figures``
hooks): the Agg backend (no display), one style, one colour per method, PNG bytes out.

A top-level module so suites can draw their figures without importing :mod:`editscope.report` (a package above
them). Importing it imports matplotlib: import it only where a figure is drawn."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["AXES_KEY", "PALETTE", "axes_labels", "method_colors", "plt", "png", "png_axes"]

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
"""Okabe-Ito colour-blind-safe palette; method i gets ``PALETTE[i % 8]``."""

plt.rcParams.update({
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 150,
    "savefig.dpi": 150, "axes.grid": True, "grid.alpha": 0.3, "grid.linestyle": ":",
})


AXES_KEY = "editscope-axes"
"""PNG text chunk that :func:`png` writes: JSON list of the figure's panels and their axis labels, so a report
(and a test) can say what each axis of an embedded picture shows without reading pixels."""


def axes_labels(fig) -> list[dict[str, object]]:
    """One entry per visible panel of ``fig``: x and y label (a panel sharing its y axis with a labelled one
    inherits that label), x tick labels, y scale, and whether it is a colour bar."""
    out: list[dict[str, object]] = []
    for ax in fig.get_axes():
        if not (ax.get_visible() and ax.axison):
            continue
        y = ax.get_ylabel()
        if not y:
            y = next((a.get_ylabel() for a in ax.get_shared_y_axes().get_siblings(ax) if a.get_ylabel()), "")
        out.append({"x": ax.get_xlabel(), "y": y, "yscale": ax.get_yscale(),
                    "xticks": [t.get_text() for t in ax.get_xticklabels() if t.get_text()],
                    "colorbar": hasattr(ax, "_colorbar")})
    return out


def png(fig) -> bytes:
    """``fig`` as PNG bytes (tight bounding box), its panels' axis labels in the text chunk ``AXES_KEY``; the
    figure is closed."""
    buf = io.BytesIO()
    fig.canvas.draw()  # tick labels exist only once drawn
    meta = json.dumps(axes_labels(fig), ensure_ascii=True)
    fig.savefig(buf, format="png", bbox_inches="tight", metadata={AXES_KEY: meta})
    plt.close(fig)
    return buf.getvalue()


def png_axes(data: bytes) -> list[dict[str, object]] | None:
    """The axis labels :func:`png` stored in ``data`` (None for a PNG without them)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        text = image.info.get(AXES_KEY)
    return json.loads(text) if text is not None else None


def method_colors(methods: Sequence[str]) -> dict[str, str]:
    """One palette colour per method, in the order given."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}
