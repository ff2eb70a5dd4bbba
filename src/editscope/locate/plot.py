"""ROME-style causal-tracing figure: one heatmap per restored kind, tokens down, layers across."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from editscope.atomic import atomic_write
from editscope.errors import EditscopeError
from editscope.locate.result import LocateResult

_TITLES = {"residual": "single restored layer (residual)", "mlp": "restored MLP (window {w})",
           "attn": "restored attention (window {w})"}
_CMAPS = {"residual": "Purples", "mlp": "Greens", "attn": "Reds"}


def plot_trace(result: LocateResult, path: str | Path) -> Path:
    """Write the heatmaps of a causal-tracing result (one panel per kind in ``result.states``) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(result.states)
    labels = list(result.tokens)
    if result.subject_span:
        for i in range(*result.subject_span):
            labels[i] = labels[i] + "*"
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 0.35 * len(labels) + 1.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        data = result.states[kind].T  # tokens x layers
        image = ax.pcolormesh(np.ma.masked_invalid(data), cmap=_CMAPS.get(kind, "viridis"),
                              vmin=result.meta.get("corrupted_prob", np.nanmin(data)))
        ax.invert_yaxis()
        ax.set_yticks(np.arange(len(labels)) + 0.5, labels, fontsize=8)
        n_layers = data.shape[1]
        step = max(1, n_layers // 6)
        ax.set_xticks(np.arange(0, n_layers, step) + 0.5, [str(i) for i in range(0, n_layers, step)], fontsize=8)
        ax.set_xlabel("layer")
        ax.set_title(_TITLES.get(kind, kind).format(w=result.meta.get("window")), fontsize=9)
        bar = fig.colorbar(image, ax=ax)
        bar.set_label(f"p({result.answer.strip()})", fontsize=8)
    fig.suptitle(f"{result.prompt!r} -> {result.answer!r}  (clean {result.meta.get('clean_prob', 0):.3f}, "
                 f"corrupted {result.meta.get('corrupted_prob', 0):.3f})", fontsize=9)
    fig.tight_layout()
    kind = Path(path).suffix[1:].lower() or "png"
    try:
        if kind not in fig.canvas.get_supported_filetypes():
            raise EditscopeError(f"{path}: cannot write a plot as {kind!r}; use .png, .pdf or .svg")
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format=kind, dpi=130))
    finally:
        plt.close(fig)
