"""Report figures (matplotlib, Agg backend): metric bars with 95% CIs, drawn from the metrics' declarations
(pre/post pairing, direction, range). Suite-specific figures live with their suites (``Suite.figures``).
Every function returns PNG bytes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.ticker import FuncFormatter, MaxNLocator

from editscope.metrics.registry import MetricSpec
from editscope.plotting import method_colors, plt, png
from editscope.run.summary import LOG_UNITS, SummaryRow
from editscope.run.summary_tables import curve_columns

UNIT_TEXT = {"share": "share (0–1)", "prob": "probability (0–1)", "ppl": "perplexity (ppl)",
             "prob-diff": "probability difference", "log-prob": "log-probability (nats)", "flag": "flag (0/1)"}
"""The y-axis label of a metric's raw values, by declared unit (others print the unit itself)."""


def _plain_log_ticks(ax, values: Sequence[float] = ()) -> None:
    """Log y axis with plain numbers (``45``, ``50``), not ``4.5×10¹``: perplexities of an edited model often
    span less than a decade, where matplotlib labels the minor ticks in scientific notation. Over more than a
    decade of ``values`` only the minor ticks at 2× and 5× a power of ten keep a label (40, 50, ..., 900 would
    pile up)."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    positive = [v for v in values if math.isfinite(v) and v > 0]
    if positive and math.log10(max(positive) / min(positive)) > 1:
        def sparse(v: float, _pos: int) -> str:
            return f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6) in (2.0, 5.0) else ""

        ax.yaxis.set_minor_formatter(FuncFormatter(sparse))
    else:
        ax.yaxis.set_minor_formatter(plain)


def y_label(spec: MetricSpec | None, *, paper_units: bool = False, log: bool = False) -> str:
    """The y-axis label with unit of a panel of ``spec``'s values: raw (``share (0–1)``) or, with
    ``paper_units``, as the paper prints them (``ES (%)``, ``GE (bits ×100)``); ``, log scale`` on a log axis."""
    if spec is None:
        text = "value (unit not declared)"
    elif paper_units:
        unit = "%" if spec.unit == "share" and spec.paper_scale == 100 else (
            spec.unit + (f" ×{spec.paper_scale:g}" if spec.paper_scale != 1 else ""))
        text = f"{spec.name} ({unit})"
    else:
        text = UNIT_TEXT.get(spec.unit, spec.unit)
    return text + (", log scale" if log else "")


def _pre_partners(all_metrics: list[str], specs: Mapping[str, MetricSpec]) -> dict[str, str]:
    """``_post`` column -> its ``_pre`` column, for the pre/post metrics whose both columns are present."""
    partners: dict[str, str] = {}
    for m in all_metrics:
        spec = specs.get(m)
        if spec is not None and spec.pre is not None and m == spec.post and spec.pre in all_metrics:
            partners[m] = spec.pre
    return partners


def _draw_pre_line(ax, cell: Mapping[tuple[str, str], SummaryRow], methods: Sequence[str], pre: str) -> None:
    """The methods' mean ``_pre`` value as a dashed line (none where no mean is finite)."""
    pre_means = [cell[(m, pre)].mean for m in methods if (m, pre) in cell]
    pre_means = [v for v in pre_means if math.isfinite(v)]
    if pre_means:
        ax.axhline(float(np.mean(pre_means)), color="#222222", linestyle="--", linewidth=1.0, zorder=3)


def _scale_bars_axis(ax, spec: MetricSpec | None, bounds: tuple[float, float], finite: np.ndarray) -> bool:
    """Fit the y axis to the metric: a log axis for perplexities and positive values spanning orders of magnitude,
    else the declared range (its lower bound where only that is finite). Returns whether the axis is log."""
    low, high = bounds
    if spec is not None and spec.unit in LOG_UNITS and finite.size and np.all(finite > 0):
        _plain_log_ticks(ax, finite.tolist())  # perplexities: averaged on the log scale, drawn on one
        return True
    if math.isfinite(low) and math.isfinite(high):
        pad = 0.05 * (high - low)
        ax.set_ylim(low - (pad if low < 0 else 0), high + pad)
    elif (low >= 0 and finite.size and np.all(finite > 0)
          and finite.max() / max(finite.min(), 1e-300) > 1e3):
        ax.set_yscale("log")
        return True
    elif math.isfinite(low):
        ax.set_ylim(bottom=low)
    return False


def _bars_title(metric: str, spec: MetricSpec | None, paired: bool, ns: list[int]) -> str:
    """The panel's title: the metric (its ``_post`` column when paired), its direction and the cases' count."""
    name = (spec.post if paired and spec is not None else metric) + (f" {spec.arrow}" if spec and spec.arrow else "")
    return f"{name}  (n={min(ns)})" if len(set(ns)) == 1 else f"{name}  (n={min(ns)}–{max(ns)})"


def _bars_panel(ax, metric: str, spec: MetricSpec | None, methods: Sequence[str],
                cell: Mapping[tuple[str, str], SummaryRow], colors: Mapping[str, str], pre: str | None) -> None:
    """One metric's panel: a bar per method with its CI (cut to the declared range), the ``_pre`` line."""
    x = np.arange(len(methods))
    rs = [cell.get((m, metric)) for m in methods]
    means = np.array([r.mean if r else np.nan for r in rs])
    lo = np.array([r.ci95_low if r else np.nan for r in rs])
    hi = np.array([r.ci95_high if r else np.nan for r in rs])
    finite = means[np.isfinite(means)]
    bounds = spec.range if spec is not None and spec.range is not None else (-math.inf, math.inf)
    lo, hi = np.clip(lo, *bounds), np.clip(hi, *bounds)
    err = np.vstack([np.where(np.isfinite(lo), means - lo, 0), np.where(np.isfinite(hi), hi - means, 0)])
    err = np.nan_to_num(np.clip(err, 0, None))
    ax.bar(x, np.nan_to_num(means), yerr=err if err.any() else None, color=[colors[m] for m in methods],
           width=0.7, capsize=3, error_kw={"elinewidth": 0.9, "ecolor": "#333333"}, zorder=2)
    if pre:
        _draw_pre_line(ax, cell, methods, pre)
    log = _scale_bars_axis(ax, spec, bounds, finite)
    ax.set_ylabel(y_label(spec, log=log))
    if bounds[0] < 0:
        ax.axhline(0, color="#555555", linewidth=0.6)
    ax.set_title(_bars_title(metric, spec, bool(pre), [r.n if r else 0 for r in rs]))
    rot = len(methods) > 3
    ax.set_xticks(x, methods, rotation=30 if rot else 0, ha="right" if rot else "center")
    ax.set_xlim(-0.6, len(methods) - 0.4)


def _finish(fig, title: str, handles: list, labels: list[str]) -> bytes:
    """Lay the panels out below room for the title and a one-row legend; the PNG bytes."""
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
    fig.suptitle(title, y=1 - 0.08 / height, va="top", fontsize=10)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.32 / height))
    return png(fig)


def metric_bars(rows: Sequence[SummaryRow], methods: Sequence[str], title: str,
                specs: Mapping[str, MetricSpec] | None = None, *, columns: int = 4) -> bytes:
    """One panel per metric, one bar per method (mean), error bars = 95% CI. ``specs`` maps a metric column to
    its declaration: a ``pre_post`` metric is one panel of its ``_post`` values with the ``_pre`` mean as a
    dashed line; the title carries the direction (↑/↓), the y label the unit; a declared range bounds the axis and
    the CIs (the whole range when it is finite; log axis for perplexities and when an open-ended positive metric
    spans orders of magnitude).
    Undeclared metrics get one panel each and a free axis."""
    specs = specs or {}
    all_metrics = list(dict.fromkeys(r.metric for r in rows))
    partners = _pre_partners(all_metrics, specs)
    paired_pre = set(partners.values())
    metrics = [m for m in all_metrics if m not in paired_pre]
    cell = {(r.method, r.metric): r for r in rows}
    colors = method_colors(methods)
    cols = min(columns, len(metrics))
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(2.4 * cols + 0.6, 2.2 * nrows + 0.8), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        _bars_panel(ax, metric, specs.get(metric), methods, cell, colors, partners.get(metric))
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[m]) for m in methods]
    labels = list(methods)
    if paired_pre:
        handles.append(plt.Line2D([0], [0], color="#222222", linestyle="--", linewidth=1.0))
        labels.append("before edit (_pre)")
    return _finish(fig, title + " — mean over cases, error bars: 95% CI", handles, labels)


LOG_X_SPAN = 10.0
"""Curves against the number of edits use a log x-axis when the checkpoints span more than this factor (1,000 to
17,732 edits of a stream; not 100 to 1,000 of paper 004's protocol)."""


def log_edits_axis(edits: Sequence[int]) -> bool:
    """Whether curves over these numbers of edits are drawn on a log x-axis (:data:`LOG_X_SPAN`)."""
    positive = [e for e in edits if e > 0]
    return len(positive) > 1 and max(positive) / min(positive) > LOG_X_SPAN


def _method_curve(ax, spec: MetricSpec, cells: list[dict[str, SummaryRow]], edits: list[int], color: str,
                  label: str) -> None:
    """One method's means through the checkpoints where it has the metric, its CI (cut to the range) as a band."""
    low, high = spec.range if spec.range is not None else (-math.inf, math.inf)
    xs = [e for e, c in zip(edits, cells, strict=True) if spec.post in c]
    rs = [c[spec.post] for c in cells if spec.post in c]
    mean = np.array([r.mean for r in rs]) * spec.paper_scale
    lo = np.clip([r.ci95_low for r in rs], low, high) * spec.paper_scale
    hi = np.clip([r.ci95_high for r in rs], low, high) * spec.paper_scale
    ax.plot(xs, mean, marker="o", markersize=3, color=color, label=label, zorder=3)
    if np.isfinite(lo).any():
        ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0, zorder=2)


Faint = Mapping[tuple[str, str], Sequence[tuple[Sequence[int], Sequence[float]]]]
"""(method, metric) -> the (edits, means) of each of several curves drawn faintly under the method's own (one per
edit order)."""


def _curve_lines(ax, spec: MetricSpec, points: Mapping[int, Sequence[SummaryRow]], edits: list[int],
                 methods: Sequence[str], colors: Mapping[str, str], faint: Faint | None = None) -> None:
    """Every method's curve (and its ``faint`` ones), then the unedited model's mean as a dashed line where the
    metric has a pre value."""
    pre_means: list[float] = []
    for m in methods:
        for xs, ys in (faint or {}).get((m, spec.post), ()):
            ax.plot(xs, np.array(ys) * spec.paper_scale, color=colors[m], alpha=0.3, linewidth=0.8, zorder=1)
        cells = [{r.metric: r for r in points[e] if r.method == m} for e in edits]
        if not any(spec.post in c for c in cells):
            continue
        _method_curve(ax, spec, cells, edits, colors[m], m)
        if spec.pre is not None and spec.pre in cells[-1]:  # the last point probed every case of the run
            pre_means.append(cells[-1][spec.pre].mean)
    if pre_means:
        ax.axhline(float(np.nanmean(pre_means)) * spec.paper_scale, color="#222222", linestyle="--",
                   linewidth=1.0, zorder=1)


def _edits_axis(ax, edits: list[int], log_x: bool) -> None:
    """The x axis of edits: log scale, the checkpoints themselves when few, else at most 5 integer ticks."""
    if log_x:
        ax.set_xscale("log")
    elif len(edits) <= 6:  # the checkpoints themselves: 100, 200, 300 rather than 100, 125, ..., 300
        ax.set_xticks(edits)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))  # 10 checkpoint labels collide


def spans_decades(values: Sequence[float], decades: float = 2.0) -> bool:
    """Whether positive ``values`` span more than ``decades`` orders of magnitude (a condition number that goes from
    1e6 to 1e10 across a stream): a linear axis would flatten all but the largest to zero."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and math.log10(max(finite) / min(finite)) > decades


def _curve_panel(ax, spec: MetricSpec, points: Mapping[int, Sequence[SummaryRow]], edits: list[int],
                 methods: Sequence[str], colors: Mapping[str, str], log_x: bool, faint: Faint | None = None) -> None:
    """One metric's panel: the methods' curves, the y axis fit to the declared range and unit, the edits axis."""
    _curve_lines(ax, spec, points, edits, methods, colors, faint)
    low, high = spec.range if spec.range is not None else (-math.inf, math.inf)
    if math.isfinite(low) and math.isfinite(high):
        pad = 0.05 * (high - low) * spec.paper_scale
        ax.set_ylim(low * spec.paper_scale - pad, high * spec.paper_scale + pad)
    values = [r.mean for e in edits for r in points[e] if r.metric == spec.post]
    wide = spans_decades(values)
    log = spec.unit in LOG_UNITS or wide
    if wide:
        ax.set_yscale("log")  # matplotlib's 10ⁿ labels on the decades: plain minor labels would pile up
    elif log:
        _plain_log_ticks(ax, values)
    ax.set_title(f"{spec.name} {spec.arrow}".strip())
    ax.set_xlabel("edits on the model" + (", log scale" if log_x else ""))
    ax.set_ylabel(y_label(spec, paper_units=True, log=log))
    _edits_axis(ax, edits, log_x)


def edit_curves(points: Mapping[int, Sequence[SummaryRow]], methods: Sequence[str], title: str,
                specs: Sequence[MetricSpec], *, log_x: bool | None = None, faint: Faint | None = None,
                caption: str = "mean over the cases edited so far, band: 95% CI") -> bytes:
    """Metric vs number of edits on the model (sequential batches): one panel per metric of
    :func:`~editscope.run.summary_tables.curve_columns`, one line per method through the edited model's means, the
    95% CI as a band (clipped to the metric's range), the unedited model's mean as a dashed line where the metric has
    a pre-edit value. ``log_x`` (default: :func:`log_edits_axis`) draws the edits on a log scale; ``faint`` adds thin
    curves under each method's (its edit orders: ``points`` then hold the mean across them)."""
    cols = curve_columns(specs)
    colors = method_colors(methods)
    edits = sorted(points)
    log_x = log_edits_axis(edits) if log_x is None else log_x
    ncols = min(4, max(1, len(cols)))
    nrows = math.ceil(len(cols) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols + 0.6, 2.3 * nrows + 0.8), squeeze=False)
    for ax, spec in zip(axes.flat, cols, strict=False):
        _curve_panel(ax, spec, points, edits, methods, colors, log_x, faint)
    for ax in axes.flat[len(cols):]:
        ax.set_visible(False)
    handles = [plt.Line2D([0], [0], color=colors[m], marker="o", markersize=3) for m in methods]
    labels = list(methods)
    handles.append(plt.Line2D([0], [0], color="#222222", linestyle="--", linewidth=1.0))
    labels.append("before edit")
    return _finish(fig, f"{title} — {caption}", handles, labels)


def retention_heatmap(matrices: Mapping[str, Mapping[tuple[int, int], float]], spec: MetricSpec, title: str) -> bytes:
    """One heatmap per method: rows = the batch (edits on the model when its cases were first probed), columns =
    the checkpoint (edits on the model at the probe), colour and text = the mean of ``spec``'s post-edit value."""
    methods = list(matrices)
    fig, axes = plt.subplots(1, len(methods), figsize=(3.2 * len(methods) + 0.8, 3.2), squeeze=False)
    low, high = spec.range if spec.range is not None and all(map(math.isfinite, spec.range)) else (None, None)
    for ax, m in zip(axes.flat, methods, strict=True):
        cells = matrices[m]
        batches, checks = sorted({i for i, _ in cells}), sorted({j for _, j in cells})
        grid = np.full((len(batches), len(checks)), np.nan)
        for (i, j), v in cells.items():
            grid[batches.index(i), checks.index(j)] = v * spec.paper_scale
        vmin = None if low is None else low * spec.paper_scale
        vmax = None if high is None else high * spec.paper_scale
        image = ax.imshow(grid, cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto")
        for (r, c), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(c, r, f"{v:.0f}" if abs(v) >= 10 else f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if vmax is None or v < 0.6 * vmax else "black")
        ax.set_xticks(range(len(checks)), [str(c) for c in checks], fontsize=7, rotation=45)
        ax.set_yticks(range(len(batches)), [str(b) for b in batches], fontsize=7)
        ax.set_xlabel("edits on the model at the probe")
        ax.set_ylabel("batch (edits when first probed)")
        ax.set_title(m, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=y_label(spec, paper_units=True))
    fig.suptitle(f"{title}: retention of each batch's {spec.name}", fontsize=10)
    fig.tight_layout()
    return png(fig)
