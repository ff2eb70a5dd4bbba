"""The report's pivot table: methods × every (dataset, suite)'s headline metrics, in the paper's units, the best
method per column bold, and each method's paired difference against a named baseline with its 95% interval,
marked † where the interval excludes no change (PEAK's way of marking significance, paper 003).

Pairing: the methods of a report are probed on the same cases (same dataset and ``case_id``), so the
difference is taken per case and its interval is the paired one (:func:`~editscope.metrics.intervals.
paired_mean_ci`); aggregates such as the CounterFact Score get a bootstrap over one shared resample of the
cases (:func:`~editscope.metrics.intervals.paired_bootstrap_aggregate`); perplexities (unit ppl, averaged on
the log scale) get the ratio of geometric means, exp of the paired mean of log differences, significant when
its interval excludes 1.

The baseline is the unedited model (each metric's ``_pre`` value of the same case; metrics without one get no
difference) unless a method is named, whose ``_post`` values are then paired with each other method's by case.
Several named methods, one per editor (``rome+app,memit+app``), pair each method with the baseline of its own
editor (the rows' ``editor``), as an ablation compares each variant with its editor's full method; a method whose
editor has no baseline gets no difference.
A suite that measures the model as a whole (``model_level``: every case of a run carries the same value) gets
the difference without interval or †: its cases are not independent samples; so does a difference over fewer than
``MIN_CI_N`` cases, as the compact tables print no interval for such anecdotal numbers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from editscope.errors import EditscopeError
from editscope.metrics.intervals import clip_interval, paired_bootstrap_aggregate, paired_mean_ci
from editscope.metrics.registry import MetricSpec
from editscope.run.summary import LOG_UNITS, SpecMap, SummaryRow
from editscope.run.summary_tables import MIN_CI_N, UNEDITED, paper_cell, paper_header, paper_num
from editscope.tables import Table

MAX_COLUMNS = 6
"""Metric columns per pivot table: wider pivots are split (between suites where possible) so that none needs
horizontal scrolling on a 1,400 px screen."""
LATEX_COLUMNS = 4
"""Metric columns per pivot tabular: four columns of ``mean [lo, hi]`` fit an article's text width (checked with
pdflatex on the SmolLM2 report: no overfull box)."""


class BaselineError(EditscopeError):
    """``--baseline`` names no method of the runs, or two of one editor (a bad command-line argument: exit
    status 2)."""


@dataclass(frozen=True)
class Column:
    dataset: str
    suite: str
    spec: MetricSpec

    @property
    def group(self) -> str:
        """``counterfact`` (suite and dataset of one name) or ``general on counterfact``."""
        return self.suite if self.suite == self.dataset else f"{self.suite} on {self.dataset}"

    @property
    def header(self) -> str:
        """``ES ↑ (%)``, as the compact tables print it."""
        return paper_header(self.spec)


@dataclass(frozen=True)
class Diff:
    """A paired difference (or, for ``ratio``, the ratio of geometric means) with its 95% interval."""

    value: float
    low: float
    high: float
    n: int
    ratio: bool = False
    interval: bool = True  # False for model-level suites: the value alone, never significant

    @property
    def significant(self) -> bool:
        """The interval excludes no change (0 for a difference, 1 for a ratio)."""
        if not self.interval or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return False
        none = 1.0 if self.ratio else 0.0
        return self.low > none or self.high < none


@dataclass
class Pivot:
    baseline: str  # UNEDITED, a method label, or labels joined by ", " (one per editor)
    columns: list[Column]
    rows: list[str]  # UNEDITED first where any column has pre values, then the methods
    cells: dict[tuple[str, int], SummaryRow] = field(default_factory=dict)
    diffs: dict[tuple[str, int], Diff] = field(default_factory=dict)
    best: set[tuple[str, int]] = field(default_factory=set)
    model_level: set[tuple[str, str]] = field(default_factory=set)  # (dataset, suite) measured on the whole model

    @property
    def baseline_note(self) -> str:
        """The sentence printed with the table: what the differences are taken against, and how."""
        return self.note()

    def note(self, chunk: Sequence[int] | None = None) -> str:
        """:attr:`baseline_note` for the columns ``chunk`` (default: all): the model-level remark only where one of
        them is model-level."""
        if self.baseline == UNEDITED:
            what = "the unedited model (each metric's value before the edit, on the same case)"
        elif ", " in self.baseline:
            what = f"the baseline of the method's own editor ({self.baseline}; its value on the same case)"
        else:
            what = f"{self.baseline} (its value on the same case)"
        columns = [self.columns[j] for j in (range(len(self.columns)) if chunk is None else chunk)]
        level = dict.fromkeys(c.group for c in columns if (c.dataset, c.suite) in self.model_level)
        return (f"Δ: paired difference against {what}, in the column's units, with its 95% interval (t over the "
                "per-case differences; bootstrap over a shared resample of the cases for aggregates such as Score; "
                "PPL: ratio × of geometric means, t interval on the log differences); † the interval excludes no "
                "change. Bold: the best method per column (direction ↑/↓ from the metric's declaration; the "
                f"unedited row does not compete). Fewer than {MIN_CI_N} cases: no interval."
                + "".join(f" {g}: one measurement of the whole model, repeated on every case, so its difference has "
                          "no interval." for g in level))

    def cell_text(self, row: str, j: int) -> str:
        r = self.cells.get((row, j))
        return "–" if r is None else paper_cell(r, self.columns[j].spec)

    def diff_text(self, row: str, j: int) -> str:
        """``+64.7 [59.1, 70.2]†``, ``×1.070 [1.060, 1.080]†``, ``+0.2`` (model level) or ``""`` (no difference)."""
        d = self.diffs.get((row, j))
        if d is None or not math.isfinite(d.value):
            return ""
        scale = self.columns[j].spec.paper_scale
        if d.ratio:
            num = _ratio
            text = f"×{num(d.value)}"
        else:
            num = lambda x: ("−" if x < 0 else "") + _nonzero(abs(x), scale)  # noqa: E731
            text = ("+" if d.value >= 0 else "") + num(d.value)
        if d.interval and math.isfinite(d.low) and math.isfinite(d.high):
            text += f" [{num(d.low)}, {num(d.high)}]"
        return text + ("†" if d.significant else "")

    def chunks(self, width: int = MAX_COLUMNS) -> list[list[int]]:
        """Column indices per table: whole suites packed greedily up to ``width`` columns; a suite wider than that
        is cut into pieces of ``width``."""
        groups: list[list[int]] = []
        for j, c in enumerate(self.columns):
            if groups and (self.columns[groups[-1][0]].dataset, self.columns[groups[-1][0]].suite) == (c.dataset,
                                                                                                      c.suite):
                groups[-1].append(j)
            else:
                groups.append([j])
        pieces = [g[i:i + width] for g in groups for i in range(0, len(g), width)]
        out: list[list[int]] = []
        for p in pieces:
            if out and len(out[-1]) + len(p) <= width:
                out[-1] += p
            else:
                out.append(list(p))
        return out

    def table(self, chunk: Sequence[int], *, diff_rows: bool = False) -> Table:
        """The columns ``chunk`` as a :class:`~editscope.tables.Table`: a row per method with its mean (and
        interval), grouped by (dataset, suite), the best bold; each paired difference against the baseline is the
        cell's secondary text, or with ``diff_rows`` a ``Δ`` row under the method's (narrower: LaTeX)."""
        groups: list[tuple[str, int]] = []
        for j in chunk:
            label = self.columns[j].group
            if groups and groups[-1][0] == label:
                groups[-1] = (label, groups[-1][1] + 1)
            else:
                groups.append((label, 1))
        body: list[list[str]] = []
        bold: set[tuple[int, int]] = set()
        sub: dict[tuple[int, int], str] = {}
        for row in self.rows:
            i = len(body)
            body.append([row] + [self.cell_text(row, j) for j in chunk])
            bold |= {(i, k) for k, j in enumerate(chunk, 1) if (row, j) in self.best}
            diffs = [self.diff_text(row, j) for j in chunk]
            if diff_rows and any(diffs):
                body.append(["Δ"] + diffs)  # against what: the caption says
            elif not diff_rows:
                sub |= {(i, k): f"Δ {d}" for k, d in enumerate(diffs, 1) if d}
        return Table(["method"] + [self.columns[j].header for j in chunk], body, bold=bold, sub=sub, groups=groups,
                     caption=f"{', '.join(g for g, _ in groups)}: every method. {self.note(chunk)}")

    def markdown(self) -> list[str]:
        """Markdown lines: one table per :meth:`chunks` (columns headed ``group: header``), then the
        :attr:`baseline_note`."""
        lines: list[str] = []
        for chunk in self.chunks():
            lines += self.table(chunk).markdown().split("\n") + [""]
        return lines + [f"*{self.baseline_note}*", ""]

    def latex(self) -> list[str]:
        """One booktabs ``table`` per chunk of :data:`LATEX_COLUMNS` columns, a ``Δ`` row under each method."""
        # footnotesize, narrow column gaps: a 4-column pivot with intervals fits an article's text width
        return [self.table(chunk, diff_rows=True).latex(size=r"\footnotesize", colsep="3pt")
                for chunk in self.chunks(LATEX_COLUMNS)]


def _nonzero(x: float, scale: float) -> str:
    """:func:`paper_num` of ``x`` >= 0, with more digits where it would print a non-zero value as 0 (an interval
    bound of 0.03 that excludes 0 should not read 0.0)."""
    text = paper_num(x, scale)
    if x > 0 and float(text) == 0:
        return f"{x * scale:.2g}"
    return text


def _ratio(x: float) -> str:
    """A ratio with 3 decimals, more where a ratio other than 1 would print as 1.000."""
    if not 1e-3 <= x < 1e3:
        return f"{x:.3g}"
    for digits in (3, 4, 5, 6):
        text = f"{x:.{digits}f}"
        if x == 1 or float(text) != 1:
            break
    return text


def _headline(specs: Sequence[MetricSpec]) -> list[MetricSpec]:
    return [s for s in specs if s.headline and s.higher_is_better is not None]


def _case_table(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, dict[str, Any]]]:
    """(dataset, suite, method) -> {case_id: that case's metrics} of the final (non-checkpoint) rows."""
    out: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.get("checkpoint"):
            continue
        for suite, metrics in row["metrics"].items():
            out.setdefault((row["dataset"], suite, row["method"]), {})[str(row["case_id"])] = metrics
    return out


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


def paired_diff(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], a_col: str, b_col: str,
                spec: MetricSpec, *, model_level: bool = False) -> Diff | None:
    """The difference of ``spec`` between the paired case metrics ``a[i]`` (column ``a_col``) and ``b[i]``
    (``b_col``); None when no pair has both values. Aggregates pair their components (same suffix)."""
    if spec.aggregate is not None:
        sa, sb = a_col[len(spec.name):], b_col[len(spec.name):]
        ma = np.array([[_num(m.get(p + sa)) for p in spec.aggregate.of] for m in a], dtype=np.float64)
        mb = np.array([[_num(m.get(p + sb)) for p in spec.aggregate.of] for m in b], dtype=np.float64)
        ma, mb = ma.reshape(len(a), -1), mb.reshape(len(b), -1)
        n = int((np.isfinite(ma) & np.isfinite(mb)).all(axis=1).sum())
        if n == 0:
            return None
        value, lo, hi = paired_bootstrap_aggregate(ma, mb, spec)
        d = Diff(value, lo, hi, n)
    else:
        xa = [_num(m.get(a_col)) for m in a]
        xb = [_num(m.get(b_col)) for m in b]
        ratio = spec.unit in LOG_UNITS
        if ratio:  # geometric means: differences of logs, reported as a ratio
            xa = [math.log(x) if x > 0 else math.nan for x in xa]
            xb = [math.log(x) if x > 0 else math.nan for x in xb]
        value, lo, hi, n = paired_mean_ci(xa, xb)
        if n == 0:
            return None
        if ratio:
            value, lo, hi = (math.exp(x) if math.isfinite(x) else math.nan for x in (value, lo, hi))
        d = Diff(value, lo, hi, n, ratio=ratio)
    if not d.ratio and spec.range is not None:  # a difference of two values in [a, b] lies in [a − b, b − a]
        span = spec.range[1] - spec.range[0]
        d = Diff(d.value, *clip_interval(d.low, d.high, (-span, span)), d.n, d.ratio)
    if model_level or d.n < MIN_CI_N:  # as the compact tables: no interval for anecdotal numbers
        d = Diff(d.value, math.nan, math.nan, d.n, d.ratio, interval=False)
    return d


def baseline_names(baseline: str) -> list[str]:
    """The method labels of a ``--baseline`` value (comma-separated, spaces around a label ignored)."""
    return [b.strip() for b in baseline.split(",") if b.strip()]


def baselines_by_method(rows: Iterable[dict[str, Any]], methods: Sequence[str],
                        baseline: str | None) -> dict[str, str]:
    """method -> the method its paired differences are taken against ({} for the unedited model). ``baseline``:
    one label (every method against it) or comma-separated labels of different editors (each method against the
    one of its own editor, from the rows' ``editor``); a label not among ``methods`` or two labels of one editor
    is a :class:`BaselineError`."""
    if baseline is None:
        return {}
    names = baseline_names(baseline)
    for b in names:
        if b not in methods:
            raise BaselineError(f"--baseline: no method {b!r} in these runs; methods: {', '.join(methods)}")
    if len(names) == 1:
        return {m: names[0] for m in methods if m != names[0]}
    editor = {r["method"]: r.get("editor", r["method"]) for r in rows}
    of_editor: dict[str, str] = {}
    for b in names:
        e = editor.get(b, b)
        if e in of_editor:
            raise BaselineError(f"--baseline: {of_editor[e]!r} and {b!r} are both {e} methods; name one baseline "
                                "per editor")
        of_editor[e] = b
    return {m: of_editor[editor.get(m, m)] for m in methods
            if m not in names and editor.get(m, m) in of_editor}


CaseTable = dict[tuple[str, str, str], dict[str, dict[str, Any]]]
"""(dataset, suite, method) -> {case id: that case's metrics} (:func:`_case_table`)."""


def _column_diff(c: Column, m: str, cases: CaseTable, against: Mapping[str, str], unedited: bool,
                 level: bool) -> Diff | None:
    """Method ``m``'s paired difference in column ``c``: post minus pre against the unedited model, else its
    cases minus its baseline's; None where there is nothing to pair."""
    mine = cases.get((c.dataset, c.suite, m), {})
    if unedited:
        if c.spec.pre is None:
            return None
        ids = list(mine)
        return paired_diff([mine[i] for i in ids], [mine[i] for i in ids], c.spec.post, c.spec.pre, c.spec,
                           model_level=level)
    if m not in against:  # a baseline itself, or an editor without one
        return None
    theirs = cases.get((c.dataset, c.suite, against[m]), {})
    ids = [i for i in mine if i in theirs]
    return paired_diff([mine[i] for i in ids], [theirs[i] for i in ids], c.spec.post, c.spec.post, c.spec,
                       model_level=level)


def _mark_best(pivot: Pivot, j: int, c: Column, with_values: list[str]) -> None:
    """Bold column ``j``'s best: the methods' means as printed, in the declared direction; ties are all bold."""
    shown = {m: float(paper_num(pivot.cells[(m, j)].mean, c.spec.paper_scale))
             for m in with_values if math.isfinite(pivot.cells[(m, j)].mean)}
    if len(shown) > 1:
        top = (max if c.spec.higher_is_better else min)(shown.values())
        pivot.best |= {(m, j) for m, v in shown.items() if v == top}


def _fill_column(pivot: Pivot, j: int, c: Column, present: list[str],
                 cell: Mapping[tuple[str, str, str, str], SummaryRow], cases: CaseTable, against: Mapping[str, str],
                 unedited: bool) -> None:
    """Column ``j``'s cells: the shared pre value, each method's post value and its difference, the best."""
    with_values = [m for m in present if (c.dataset, c.suite, m, c.spec.post) in cell]
    with_pre = [m for m in present if c.spec.pre is not None and (c.dataset, c.suite, m, c.spec.pre) in cell]
    if with_pre:  # pre values are shared: the method with most cases
        ref = max(with_pre, key=lambda m: cell[(c.dataset, c.suite, m, c.spec.pre)].n)
        pivot.cells[(UNEDITED, j)] = cell[(c.dataset, c.suite, ref, c.spec.pre)]
    level = (c.dataset, c.suite) in pivot.model_level
    for m in with_values:
        pivot.cells[(m, j)] = cell[(c.dataset, c.suite, m, c.spec.post)]
        d = _column_diff(c, m, cases, against, unedited, level)
        if d is not None:
            pivot.diffs[(m, j)] = d
    _mark_best(pivot, j, c, with_values)


def build_pivot(rows: Sequence[dict[str, Any]], summary: Sequence[SummaryRow], specs: SpecMap,
                methods: Sequence[str], *, baseline: str | None = None,
                model_level: Iterable[tuple[str, str]] = ()) -> Pivot | None:
    """The pivot of the final rows of a report (None when no (dataset, suite) declares a headline metric).
    ``baseline``: None for the unedited model, else as :func:`baselines_by_method`."""
    against = baselines_by_method(rows, methods, baseline)
    model_level = set(model_level)
    keys = list(dict.fromkeys((r.dataset, r.suite) for r in summary))
    columns = [Column(d, s, spec) for d, s in keys for spec in _headline(specs.get((d, s), ()))]
    if not columns:
        return None
    present = [m for m in methods if any(r.method == m for r in summary)]
    cell = {(r.dataset, r.suite, r.method, r.metric): r for r in summary}
    label = UNEDITED if baseline is None else ", ".join(baseline_names(baseline))
    pivot = Pivot(label, columns, [], model_level=model_level & set(keys))
    has_pre = any(c.spec.pre is not None for c in columns)
    if has_pre:
        pivot.rows.append(UNEDITED)
    # a method with no post-edit value in any column (``none``, a probe-only run) has only the unedited row's values
    pivot.rows += [m for m in present if any((c.dataset, c.suite, m, c.spec.post) in cell for c in columns)]
    cases = _case_table(rows)
    for j, c in enumerate(columns):
        _fill_column(pivot, j, c, present, cell, cases, against, baseline is None)
    return pivot


def best_in_compact(rs: Sequence[SummaryRow], methods: Sequence[str], specs: Sequence[MetricSpec],
                    no_edit: str = "none") -> set[tuple[str, int]]:
    """(row label, column index in the compact table's headers) of the best method per headline column of
    :func:`~editscope.run.summary_tables.compact_table` (means as printed; ties all bold; needs two methods)."""
    cell = {(r.method, r.metric): r for r in rs}
    out: set[tuple[str, int]] = set()
    for k, s in enumerate(_headline(specs)):
        shown = {m: float(paper_num(cell[(m, s.post)].mean, s.paper_scale)) for m in methods
                 if m != no_edit and (m, s.post) in cell and math.isfinite(cell[(m, s.post)].mean)}
        if len(shown) > 1:
            top = (max if s.higher_is_better else min)(shown.values())
            out |= {(m, k + 2) for m, v in shown.items() if v == top}
    return out
