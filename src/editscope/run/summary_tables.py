"""Turns a summary (:mod:`editscope.run.summary`) into tables and text: ``summary.csv`` (:func:`to_csv`),
``summary.md`` (:func:`to_markdown`; both written by :func:`write_summary`), the paper-style tables
(:func:`compact_table`: headers carry the direction (↑/↓), unit and paper scale), the tables of the curves against
the number of edits, across edit orders and of the chains' break points, the protocol-gap table, the plain text a
run prints at its end (:func:`results_text`) and the numbers as printed (``mean ± half-width``; an interval cut to
the metric's range, a log-scale or bootstrap one, as ``mean [lo, hi]``).

Every table is followed by the protocol its numbers follow (DESIGN rule 10; :func:`protocol_notes`): the
suite's protocol as stored in each results row (``row["protocol"][suite]``: paper / reference code / EasyEdit
token accuracy, with the choices that move the numbers) and each editor's ``convention`` from the row's
resolved ``hparams`` where the editor has one, so "why does my number differ from the paper" is answered under
the table."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from editscope.atomic import atomic_write_text
from editscope.metrics.intervals import N_BOOTSTRAP, clip_interval, mean_ci, paired_mean_ci
from editscope.metrics.registry import MetricSpec
from editscope.run.plan import base_label
from editscope.run.store import SUMMARY_CSV, SUMMARY_MD
from editscope.run.suites import FactsMap, facts_of
from editscope.run.summary import (
    BREAK_METRIC,
    BREAK_SHARE,
    LOG_UNITS,
    BreakPoint,
    CurveMap,
    OrderPoint,
    SpecMap,
    SummaryRow,
    across_orders,
    break_points,
    spec_of,
    summarize,
    summarize_by_edits,
)
from editscope.suites.wild import recorded_judges
from editscope.tables import Cell, Table

CSV_FIELDS = ("dataset", "suite", "method", "metric", "n", "mean", "ci95_low", "ci95_high", "std", "ci")


def _num(x: float) -> str:
    return "" if not math.isfinite(x) else f"{x:.6g}"


def to_csv(summary: Sequence[SummaryRow]) -> str:
    """``summary.csv``: a header (:data:`CSV_FIELDS`), then one line per row (numbers to 6 significant digits, empty
    where not finite)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for r in summary:
        writer.writerow([r.dataset, r.suite, r.method, r.metric, r.n, _num(r.mean), _num(r.ci95_low),
                         _num(r.ci95_high), _num(r.std), r.ci])
    return buf.getvalue()


def _fmt(x: float, digits: int) -> str:
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 10 ** -digits):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


def symmetric(r: SummaryRow) -> bool:
    """Whether the interval is ``mean ± half`` (a t interval not cut by the metric's range)."""
    return math.isclose(r.mean - r.ci95_low, r.ci95_high - r.mean, rel_tol=1e-9, abs_tol=1e-12)


def fmt_mean_ci(r: SummaryRow, digits: int = 3) -> str:
    """``mean ± half-width`` (fixed point; scientific for very large or small values); ``mean [lo, hi]`` when the
    interval is not symmetric (cut to the metric's range, a log-scale or bootstrap interval)."""
    if not math.isfinite(r.mean):
        return "–"
    if not (math.isfinite(r.ci95_low) and math.isfinite(r.ci95_high)):
        return _fmt(r.mean, digits)
    if symmetric(r):
        return f"{_fmt(r.mean, digits)} ± {_fmt(r.half_width, digits)}"
    return f"{_fmt(r.mean, digits)} [{_fmt(r.ci95_low, digits)}, {_fmt(r.ci95_high, digits)}]"


def metric_label(column: str, spec: MetricSpec | None) -> str:
    """A table header: ``ES_post ↑ (share, paper ×100)``; the bare column name for undeclared metrics."""
    if spec is None:
        return column
    arrow = f" {spec.arrow}" if spec.arrow else ""
    return f"{column}{arrow} ({spec.unit_label})"


TABLE_NOTE = ("Mean ± half-width of the 95% confidence interval over cases (Student t; percentile bootstrap "
              f"with {N_BOOTSTRAP} resamples for aggregates such as Score; perplexities (unit ppl): geometric mean, "
              "t interval on log PPL); n = cases. ↑ higher is better, "
              "↓ lower is better; the unit follows each name, with the factor the paper prints it with.")
MIN_CI_N = 5
"""Fewer cases than this: the compact table prints no interval and calls the numbers anecdotal."""
UNEDITED = "unedited"


def paper_num(x: float, scale: float) -> str:
    """``x`` as the compact tables print it: ×``scale`` with one decimal, else 2 decimals (1 from 100, scientific
    from 1e4)."""
    if scale != 1:
        return f"{x * scale:.1f}"
    return _fmt(x, 2) if abs(x) < 100 else _fmt(x, 1) if abs(x) < 1e4 else f"{x:.2e}"


def paper_cell(r: SummaryRow, spec: MetricSpec) -> str:
    """A compact-table cell in the paper's units (``× paper_scale``): the mean, then for n >= ``MIN_CI_N`` its 95%
    interval clipped to the metric's declared range (``± half`` when symmetric and unclipped, else ``[lo, hi]``)."""
    if not math.isfinite(r.mean):
        return "–"
    text = paper_num(r.mean, spec.paper_scale)
    if r.n < MIN_CI_N or not (math.isfinite(r.ci95_low) and math.isfinite(r.ci95_high)):
        return text
    lo, hi = clip_interval(r.ci95_low, r.ci95_high, spec.range)
    if r.ci in ("t", "t-strata") and (lo, hi) == (r.ci95_low, r.ci95_high) and symmetric(r):
        return f"{text} ± {paper_num(r.half_width, spec.paper_scale)}"
    return f"{text} [{paper_num(lo, spec.paper_scale)}, {paper_num(hi, spec.paper_scale)}]"


def paper_header(spec: MetricSpec) -> str:
    """``ES ↑ (%)``; ``NKL ↓ (nats)``; ``GE ↑ (bits ×100)``."""
    unit = "%" if spec.unit == "share" and spec.paper_scale == 100 else (
        spec.unit + (f" ×{spec.paper_scale:g}" if spec.paper_scale != 1 else ""))
    return f"{spec.name}{' ' + spec.arrow if spec.arrow else ''} ({unit})"


def compact_table(rs: Sequence[SummaryRow], methods: Sequence[str], specs: Sequence[MetricSpec],
                  no_edit: str = "none") -> Table | None:
    """The paper-style table of one (dataset, suite), with its notes; None without declarations.

    Columns: the declared ``headline`` metrics with a direction, in declaration order, in the paper's units;
    rows: the unedited model (each ``NAME_pre``; post-only metrics –), then one row per edit method (``NAME_post``
    or ``NAME``). Intervals only where n >= ``MIN_CI_N``; notes say when numbers are anecdotal and how PPL is
    averaged."""
    cols = [s for s in specs if s.headline and s.higher_is_better is not None]
    if not cols:
        return None
    cell = {(r.method, r.metric): r for r in rs}
    present = [m for m in methods if any(r.method == m for r in rs)]
    body: list[list[str]] = []
    ns: dict[str, int] = {}

    def row(label: str, pick) -> None:
        found = [(s, cell.get(pick(s))) for s in cols]
        n = max((r.n for _, r in found if r is not None), default=0)
        ns[label] = n
        body.append([label, str(n)] + [paper_cell(r, s) if r is not None else "–" for s, r in found])

    if present:  # the unedited model: pre values are shared by all methods (same cases, probed once)
        ref = max(present, key=lambda m: sum(1 for r in rs if r.method == m))
        if any(s.pre is not None and (ref, s.pre) in cell for s in cols):
            row(UNEDITED, lambda s: (ref, s.pre) if s.pre is not None else None)
    for m in present:
        if m != no_edit:
            row(m, lambda s, m=m: (m, s.post))
    headers = ["method", "n"] + [paper_header(s) for s in cols]
    notes = []
    few = [label for label, n in ns.items() if n < MIN_CI_N]
    if few:
        notes.append(f"Anecdotal: fewer than {MIN_CI_N} cases ({', '.join(few)}); no confidence interval shown.")
    if any(r.n >= MIN_CI_N for r in rs):
        notes.append("± / [lo, hi]: 95% confidence interval over cases, clipped to the metric's range "
                     "(bootstrap for aggregates such as Score).")
    if any(s.unit in LOG_UNITS for s in cols):
        notes.append("PPL: geometric mean over cases (mean of log PPL; interval on the log scale), not the "
                     "arithmetic mean, which one case's 1e10 would dominate.")
    return Table(headers, body, notes=notes)


def compact_markdown(rs: Sequence[SummaryRow], methods: Sequence[str], specs: Sequence[MetricSpec] | None,
                     ) -> list[str]:
    """:func:`compact_table` as Markdown lines, its notes under it (empty without declarations)."""
    table = compact_table(rs, methods, specs or ())
    return [] if table is None else table.markdown().split("\n")


def results_text(summary: Sequence[SummaryRow], specs: SpecMap | None = None) -> str:
    """Every (dataset, suite)'s :func:`compact_table` as aligned plain text, for a terminal at the end of a run (a
    suite without declared headline metrics is left out: summary.md has all of them)."""
    tables: dict[tuple[str, str], list[SummaryRow]] = {}
    for r in summary:
        tables.setdefault((r.dataset, r.suite), []).append(r)
    out: list[str] = []
    for (dataset, suite), rs in tables.items():
        table = compact_table(rs, list(dict.fromkeys(r.method for r in rs)), (specs or {}).get((dataset, suite), ()))
        if table is not None:
            out += ["", replace(table, caption=f"{suite} on {dataset}", notes=()).plain()]
    return "\n".join(out).lstrip("\n")


def curve_columns(specs: Sequence[MetricSpec] | None) -> list[MetricSpec]:
    """The metrics a suite's curves against the number of edits show: its headline metrics with a direction; a
    suite that declares none (a diagnostic one, such as ``weights``: norm growth has no better direction) shows its
    per-case metrics."""
    cols = [s for s in specs or () if s.headline and s.higher_is_better is not None]
    return cols or [s for s in specs or () if s.aggregate is None]


def curve_table(points: Mapping[int, Sequence[SummaryRow]], methods: Sequence[str],
                specs: Sequence[MetricSpec] | None) -> Table | None:
    """The metrics of one (dataset, suite) after each number of edits (:func:`curve_columns`), one row per (method,
    edits), in the paper's units (the edited model's values); None without them."""
    cols = curve_columns(specs)
    if not cols or not points:
        return None
    body: list[list[Cell]] = []
    for m in methods:
        for edits, rs in points.items():
            cell = {r.metric: r for r in rs if r.method == m}
            if cell:
                body.append([m, edits, max(r.n for r in cell.values())]
                            + [paper_cell(cell[s.post], s) if s.post in cell else "–" for s in cols])
    return Table(["method", "edits", "n"] + [paper_header(s) for s in cols], body, notes=[TIMING_NOTE])


TIMING_NOTE = ("Evaluation timing: the point after N edits probes, with all N on the model, the cases first probed "
               "there (the batch just written, probed just after writing it: AlphaEdit's code's timing) and the "
               "earlier cases again (probed after every later edit); the last point is the evaluation after the "
               "whole chain (UltraEdit's and EasyEdit's timing).")


def curve_markdown(points: Mapping[int, Sequence[SummaryRow]], methods: Sequence[str],
                   specs: Sequence[MetricSpec] | None) -> list[str]:
    """:func:`curve_table` as Markdown lines (empty without headline metrics or points)."""
    table = curve_table(points, methods, specs)
    return [] if table is None else table.markdown().split("\n")


def orders_table(points: Sequence[OrderPoint], specs: Sequence[MetricSpec] | None) -> Table | None:
    """One (block, suite) across edit orders: a row per (method, edits), per headline metric the mean over orders,
    its 95% t interval over them and the orders' range, in the paper's units; None without headline metrics."""
    cols = curve_columns(specs)
    if not cols or not points:
        return None
    cells: dict[tuple[str, int], dict[str, OrderPoint]] = {}
    for p in points:
        cells.setdefault((p.row.method, p.edits), {})[p.row.metric] = p

    def cell(p: OrderPoint | None, spec: MetricSpec) -> str:
        if p is None or not math.isfinite(p.row.mean):
            return "–"
        low, high = clip_interval(p.row.ci95_low, p.row.ci95_high, spec.range)
        lo, mean, hi, least, most = (paper_num(x, spec.paper_scale) for x in (
            low, p.row.mean, high, min(p.values), max(p.values)))
        return f"{mean}{f' [{lo}, {hi}]' if math.isfinite(p.row.ci95_low) else ''}; {least}–{most}"

    body: list[list[Cell]] = [[m, e, len(next(iter(c.values())).values)] + [cell(c.get(s.post), s) for s in cols]
                              for (m, e), c in cells.items()]
    return Table(["method", "edits", "orders"] + [paper_header(s) for s in cols], body,
                 notes=[ORDERS_NOTE])


ORDERS_NOTE = ("Across edit orders: the mean of the orders' means, [its 95% Student t interval over the orders, "
               "clipped to the metric's range]; the range of the orders' means.")


def break_table(points: Sequence[BreakPoint], share: float = BREAK_SHARE) -> Table | None:
    """The break points of each (block, method) across its edit orders: how many orders broke, the median, range
    and 95% t interval of their break points, and the same of the σ₁ jump; None without chains."""
    if not points:
        return None
    groups: dict[tuple[str, str], list[BreakPoint]] = {}
    for p in points:
        groups.setdefault((base_label(p.dataset)[0], p.method), []).append(p)
    body: list[list[Cell]] = []
    for (dataset, method), ps in groups.items():
        body.append([dataset, method, len(ps), f"{sum(p.edits is not None for p in ps)} of {len(ps)}",
                     _spread([p.edits for p in ps], ps[0].last), _spread([p.sigma_jump for p in ps], ps[0].last)])
    return Table(["block", "method", "orders", "broke", "break point (edits)", "σ₁ jump (edits)"], body,
                 notes=[f"Break point: the first checkpoint where the cases first probed there (the batch just "
                        f"written) have a mean {BREAK_METRIC.removesuffix('_post')} below {share:g}; σ₁ jump: the "
                        "checkpoint where σ₁(ΔW)/σ₁(W₀) rose most over the one before. Median, range and [95% t "
                        "interval] over the orders that reached one."])


def _spread(values: Sequence[int | None], last: int) -> str:
    reached = [v for v in values if v is not None]
    if not reached:
        return f"none by {last}"
    median = float(np.median(reached))
    text = f"{median:g}; {min(reached)}–{max(reached)}"
    if len(reached) >= 2:
        _, low, high, _ = mean_ci(reached)
        if math.isfinite(low):
            text += f" [{low:.0f}, {high:.0f}]"
    return text


def table_rows(rs: Sequence[SummaryRow], methods: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(metric columns, one ``[method, n, cells...]`` list per method) of one (dataset, suite) table."""
    metrics = list(dict.fromkeys(r.metric for r in rs))
    cell = {(r.method, r.metric): r for r in rs}
    body = []
    for m in [m for m in methods if any(r.method == m for r in rs)]:
        n = max((cell[(m, k)].n for k in metrics if (m, k) in cell), default=0)
        body.append([m, str(n)] + [fmt_mean_ci(cell[(m, k)]) if (m, k) in cell else "" for k in metrics])
    return metrics, body


def metrics_table(rs: Sequence[SummaryRow], methods: Sequence[str], specs: SpecMap | None = None,
                  notes: Sequence[str] = ()) -> Table:
    """Every metric of one (dataset, suite) (:func:`table_rows`; headers :func:`metric_label`), ``notes`` under it."""
    metrics, body = table_rows(rs, methods)
    labels = [metric_label(k, spec_of(specs, rs[0].dataset, rs[0].suite, k)) for k in metrics]
    return Table(["method", "n", *labels], body, notes=notes)


GAPS_TITLE = "Wild minus teacher-forced (paired by case)"
GAPS_NOTE = ("Mean over cases of (wild − teacher-forced) in points (× 100), 95% paired t interval; † the interval "
             "excludes 0. The wild answer is generated greedily and judged by the judge its row names (Locality: "
             "the neighbourhood judge); the teacher-forced number reads probabilities under the gold prefix (each "
             "table above names its protocol).")


def _judge_of(row: dict[str, Any], suite: str, column: str) -> str:
    """The judge that produced ``column`` of ``suite`` in ``row`` (the neighbourhood judge for Locality), as its
    protocol records it; "–" for a suite without judges."""
    judges = recorded_judges((row.get("protocol") or {}).get(suite) or {})
    return "–" if judges is None else judges[1 if column == "Locality" else 0]


def protocol_gap_table(rows: Iterable[dict[str, Any]], method_order: Sequence[str] = (),
                       facts: FactsMap | None = None) -> Table | None:
    """The protocol-minus-teacher-forced table of every dataset whose rows hold a suite of another protocol
    (``wild``, or any registered suite declaring ``counterparts``) and a teacher-forced suite it declares a
    counterpart for (:attr:`editscope.suites.base.Suite.counterparts`): per method and column pair, the mean over
    cases of (wild - teacher-forced) with its paired t interval (clipped to [-1, 1]), in points (× 100); † where the
    interval excludes 0. Checkpoint rows are left out. None without such a dataset."""
    pairs: dict[tuple[str, str, str, str, str, str], tuple[list[float], list[float]]] = {}
    for row in rows:
        metrics = row["metrics"]
        if row.get("checkpoint"):
            continue
        for name in metrics:
            for suite, columns in facts_of(facts, name).counterparts.items():
                for tf, own in columns:
                    if tf in metrics.get(suite, {}) and own in metrics[name]:
                        label = f"{name} {own}" if name != "wild" else own
                        a, b = pairs.setdefault((row["dataset"], suite, tf, label, _judge_of(row, name, own),
                                                 row["method"]), ([], []))
                        a.append(float(metrics[name][own]))
                        b.append(float(metrics[suite][tf]))
    if not pairs:
        return None
    methods = list(dict.fromkeys([*method_order, *(k[5] for k in pairs)]))
    body: list[list[Cell]] = []
    for key in sorted(pairs, key=lambda k: (k[0], k[1], methods.index(k[5]), k[4])):
        dataset, suite, tf, wild, judge, method = key
        a, b = pairs[key]
        mean, lo, hi, n = paired_mean_ci(a, b)
        lo, hi = clip_interval(lo, hi, (-1.0, 1.0))  # a gap of two shares lies in [-1, 1]
        interval = "" if math.isnan(lo) else f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        mark = "†" if not math.isnan(lo) and (lo > 0 or hi < 0) else ""
        body.append([dataset, method, f"{suite} {tf}", wild, judge, n, f"{100 * float(np.mean(b)):.1f}",
                     f"{100 * float(np.mean(a)):.1f}", f"{100 * mean:+.1f}{interval}{mark}"])
    return Table(["dataset", "method", "teacher-forced", "wild", "judge", "n", "TF", "wild", "gap [95% CI]"], body,
                 align="lllllrrrl", caption=GAPS_TITLE, notes=[GAPS_NOTE])


def protocol_gaps(rows: Iterable[dict[str, Any]], method_order: Sequence[str] = (),
                  facts: FactsMap | None = None) -> list[str]:
    """Markdown lines of :func:`protocol_gap_table` under its heading; empty without such a dataset."""
    table = protocol_gap_table(rows, method_order, facts)
    if table is None:
        return []
    return [f"## {GAPS_TITLE}", "", GAPS_NOTE, "", *replace(table, caption="", notes=[]).markdown().split("\n")]


NotesMap = Mapping[tuple[str, str], Sequence[str]]
"""(dataset label, suite name) -> lines printed under that table (:func:`protocol_notes`)."""


def _methods_text(methods: Sequence[str], all_methods: Sequence[str]) -> str:
    return "" if list(methods) == list(all_methods) else f" ({', '.join(methods)})"


def protocol_notes(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """The protocol lines of every (dataset, suite) table, from the results rows.

    ``Protocol: NAME — NOTE`` from ``row["protocol"][suite]`` (one line per distinct protocol, naming the
    methods when they differ; "not recorded" for rows written before protocol labels), then
    ``Editor conventions: METHOD: CONVENTION, ...`` from ``row["hparams"]["convention"]`` for the methods whose
    editors have one (``paper`` = the paper's equations, ``reference`` = the reference code's)."""
    protos: dict[tuple[str, str], dict[str, list[str]]] = {}
    conventions: dict[str, list[str]] = {}
    methods: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        method = row["method"]
        for suite in row["metrics"]:
            key = (row["dataset"], suite)
            proto = (row.get("protocol") or {}).get(suite)
            text = (f"{proto.get('name', '?')} — {proto.get('note', '')}".rstrip(" —") if proto
                    else "not recorded (row written before protocol labels)")
            users = protos.setdefault(key, {}).setdefault(text, [])
            if method not in users:
                users.append(method)
            seen = methods.setdefault(key, [])
            if method not in seen:
                seen.append(method)
            convention = (row.get("hparams") or {}).get("convention")
            if convention is not None and str(convention) not in conventions.setdefault(method, []):
                conventions[method].append(str(convention))
    out: dict[tuple[str, str], list[str]] = {}
    for key, texts in protos.items():
        lines = [f"Protocol{_methods_text(users, methods[key])}: {text}" for text, users in texts.items()]
        conv = [f"{m}: {', '.join(conventions[m])}" for m in methods[key] if m in conventions]
        if conv:
            lines.append("Editor conventions (paper = the paper's equations, reference = the reference code's): "
                         + "; ".join(conv))
        out[key] = lines
    return out


def to_markdown(summary: Sequence[SummaryRow], *, specs: SpecMap | None = None,
                title: str | None = "Summary", notes: NotesMap | None = None, curves: CurveMap | None = None,
                breaks: Sequence[BreakPoint] = ()) -> str:
    """One table per (dataset, suite): methods as rows, metrics as columns, ``mean ± 95% CI half-width``;
    ``notes`` (:func:`protocol_notes`) printed under each table; ``curves`` (:func:`summarize_by_edits`) add
    the metric-vs-edits table of a sequential_batches run, and its spread across edit orders (:func:`across_orders`)
    where a block was edited in several; ``breaks`` (:func:`break_points`) the chains' break points."""
    lines = [f"# {title}", ""] if title else []
    lines.append(TABLE_NOTE)
    tables: dict[tuple[str, str], list[SummaryRow]] = {}
    for r in summary:
        tables.setdefault((r.dataset, r.suite), []).append(r)
    for (dataset, suite), rs in tables.items():
        methods = list(dict.fromkeys(r.method for r in rs))
        lines += ["", f"## {suite} on {dataset}", ""]
        compact = compact_markdown(rs, methods, (specs or {}).get((dataset, suite)))
        if compact:
            lines += compact + ["", "All metrics:", ""]
        lines += metrics_table(rs, methods, specs, (notes or {}).get((dataset, suite), ())).markdown().split("\n")
        curve = curve_markdown((curves or {}).get((dataset, suite), {}), methods, (specs or {}).get((dataset, suite)))
        if curve:
            lines += ["", "After each number of edits (sequential batches):", ""] + curve
    for (dataset, suite), points in across_orders(curves or {}).items():
        table = orders_table(points, (specs or {}).get((dataset, suite)))
        if table is not None:
            lines += ["", f"## {suite} on {dataset}, across {points[0].chains}", ""]
            lines += table.markdown().split("\n")
    table = break_table(breaks)
    if table is not None:
        lines += ["", "## Where the chains break", ""] + table.markdown().split("\n")
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | Path, rows: Iterable[dict[str, Any]], *, specs: SpecMap | None = None,
                  method_order: Sequence[str] = (), dataset_order: Sequence[str] = (),
                  facts: FactsMap | None = None) -> list[SummaryRow]:
    """Write ``summary.csv`` and ``summary.md`` (with the protocol notes under each table) atomically; return
    the summary."""
    rows = list(rows)
    summary = summarize(rows, specs=specs, method_order=method_order, dataset_order=dataset_order, facts=facts)
    curves = summarize_by_edits(rows, specs=specs, method_order=method_order, dataset_order=dataset_order,
                                facts=facts)
    atomic_write_text(Path(out_dir) / SUMMARY_CSV, to_csv(summary))
    gaps = protocol_gaps(rows, method_order, facts)
    markdown = to_markdown(summary, specs=specs, notes=protocol_notes(rows), curves=curves,
                           breaks=break_points(rows) if curves else ())
    atomic_write_text(Path(out_dir) / SUMMARY_MD, markdown + ("\n" + "\n".join(gaps) + "\n" if gaps else ""))
    return summary
