"""Summaries of a results file: per dataset, suite, method and metric the mean, n and a 95% confidence
interval (Student t over cases: mean ± t₀.₉₇₅,ₙ₋₁ · s/√n; undefined for n < 2). ``null`` (NaN) metric values
are left out of n.

Driven by the suites' metric declarations (:class:`~editscope.metrics.registry.MetricSpec`, keyed by
(dataset label, suite name)): metrics come in declaration order; aggregate metrics (the CounterFact/zsRE
Score) are computed here from the dataset-level means of their components, with a seeded percentile
bootstrap CI over cases (``ci = "bootstrap"``); table headers carry the direction (↑/↓), unit and paper
scale. Metrics of a suite without declarations (an old run) are listed as stored, without aggregates.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as st

from editscope.atomic import atomic_write_text
from editscope.metrics.registry import Declarations, MetricSpec
from editscope.run.store import SUMMARY_CSV, SUMMARY_MD

CSV_FIELDS = ("dataset", "suite", "method", "metric", "n", "mean", "ci95_low", "ci95_high", "std", "ci")
N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 0

SpecMap = Mapping[tuple[str, str], Sequence[MetricSpec]]
"""(dataset label, suite name) -> the suite's metric declarations."""


@dataclass(frozen=True)
class SummaryRow:
    dataset: str
    suite: str
    method: str
    metric: str
    n: int
    mean: float
    ci95_low: float
    ci95_high: float
    std: float
    ci: str = "t"  # "t" (Student t over cases) or "bootstrap" (aggregates)

    @property
    def half_width(self) -> float:
        return (self.ci95_high - self.ci95_low) / 2


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, low, high, sample std) of the finite ``values``; NaN where undefined."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan, math.nan
    sd = float(x.std(ddof=1))
    half = float(st.t.ppf(0.5 + confidence / 2, x.size - 1)) * sd / math.sqrt(x.size)
    return mean, mean - half, mean + half, sd


def bootstrap_aggregate(columns: np.ndarray, spec: MetricSpec, *, n_boot: int = N_BOOTSTRAP,
                        seed: int = BOOTSTRAP_SEED, confidence: float = 0.95) -> tuple[float, float, float]:
    """(value, low, high) of an aggregate metric from ``columns`` ([cases, components], NaN = no value).

    The value is the aggregate of the per-component means over cases (each over its finite values: ROME's
    summaries average every metric over the cases that have it, then take the harmonic mean, paper 002
    appendix C); the CI is the percentile interval of the same statistic over ``n_boot`` resamples of the
    cases with replacement (seeded; NaN for fewer than 2 cases)."""
    assert spec.aggregate is not None
    means = [float(np.mean(c[np.isfinite(c)])) for c in columns.T]
    value = spec.aggregate.compute(means)
    n = columns.shape[0]
    if n < 2:
        return value, math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    sample = columns[idx]  # [n_boot, n, components]
    finite = np.isfinite(sample)
    counts = finite.sum(axis=1)
    sums = np.where(finite, sample, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_means = sums / counts  # NaN where a resample holds no value of a component
    stats = np.array([spec.aggregate.compute(m) for m in boot_means])
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return value, math.nan, math.nan
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return value, float(lo), float(hi)


def _declarations(specs: SpecMap | None, dataset: str, suite: str) -> Declarations | None:
    found = (specs or {}).get((dataset, suite))
    return Declarations(tuple(found)) if found is not None else None


def summarize(rows: Iterable[dict[str, Any]], *, specs: SpecMap | None = None, method_order: Sequence[str] = (),
              dataset_order: Sequence[str] = ()) -> list[SummaryRow]:
    """Aggregate results rows (order: datasets and methods as given, else first seen; metrics in declaration
    order, undeclared ones after them as stored; checkpoint rows left out). Aggregate metrics of ``specs`` are
    computed from the dataset-level means of their components (:func:`bootstrap_aggregate`)."""
    cases: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    stored: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.get("checkpoint"):  # sequential_batches rows probed before the last round: curves, not tables
            continue
        for suite, metrics in row["metrics"].items():
            cases.setdefault((row["dataset"], suite, row["method"]), []).append(metrics)
            order = stored.setdefault((row["dataset"], suite), [])
            order.extend(k for k in metrics if k not in order)
    seen_d = list(dict.fromkeys(list(dataset_order) + [k[0] for k in cases]))
    seen_m = list(dict.fromkeys(list(method_order) + [k[2] for k in cases]))
    seen_s = list(dict.fromkeys(k[1] for k in cases))
    out = []
    for key in sorted(cases, key=lambda k: (seen_d.index(k[0]), seen_s.index(k[1]), seen_m.index(k[2]))):
        dataset, suite, method = key
        per_case = cases[key]
        decl = _declarations(specs, dataset, suite)
        columns: list[tuple[str, MetricSpec | None]] = []
        if decl is not None:
            columns = [(c, s) for s in decl.specs for c in s.columns]
        declared = {c for c, _ in columns}
        columns += [(c, None) for c in stored[(dataset, suite)] if c not in declared]
        for column, spec in columns:
            if spec is not None and spec.aggregate is not None:
                suffix = column[len(spec.name):]
                parts = [f"{p}{suffix}" for p in spec.aggregate.of]
                matrix = np.array([[_value(m.get(p)) for p in parts] for m in per_case], dtype=np.float64)
                n = int(np.isfinite(matrix).sum(axis=0).min()) if matrix.size else 0
                if n == 0:
                    continue
                value, lo, hi = bootstrap_aggregate(matrix, spec)
                out.append(SummaryRow(dataset, suite, method, column, n, value, lo, hi, math.nan, "bootstrap"))
                continue
            vals = [_value(m[column]) for m in per_case if column in m]
            if not vals:
                continue
            mean, lo, hi, sd = mean_ci(vals)
            n = sum(1 for v in vals if math.isfinite(v))
            out.append(SummaryRow(dataset, suite, method, column, n, mean, lo, hi, sd))
    return out


def _value(v: Any) -> float:
    return math.nan if v is None else float(v)


def _num(x: float) -> str:
    return "" if not math.isfinite(x) else f"{x:.6g}"


def to_csv(summary: Sequence[SummaryRow]) -> str:
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


def fmt_mean_ci(r: SummaryRow, digits: int = 3) -> str:
    """``mean ± half-width`` (fixed point; scientific for very large or small values)."""
    if not math.isfinite(r.mean):
        return "–"
    if not math.isfinite(r.half_width):
        return _fmt(r.mean, digits)
    return f"{_fmt(r.mean, digits)} ± {_fmt(r.half_width, digits)}"


def metric_label(column: str, spec: MetricSpec | None) -> str:
    """A table header: ``ES_post ↑ (share, paper ×100)``; the bare column name for undeclared metrics."""
    if spec is None:
        return column
    arrow = f" {spec.arrow}" if spec.arrow else ""
    return f"{column}{arrow} ({spec.unit_label})"


def spec_of(specs: SpecMap | None, dataset: str, suite: str, column: str) -> MetricSpec | None:
    """The declaration that owns ``column`` of (dataset, suite), or None."""
    decl = _declarations(specs, dataset, suite)
    return decl.by_column.get(column) if decl is not None else None


TABLE_NOTE = ("Mean ± half-width of the 95% confidence interval over cases (Student t; percentile bootstrap "
              f"with {N_BOOTSTRAP} resamples for aggregates such as Score); n = cases. ↑ higher is better, "
              "↓ lower is better; the unit follows each name, with the factor the paper prints it with.")


def table_rows(rs: Sequence[SummaryRow], methods: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(metric columns, one ``[method, n, cells...]`` list per method) of one (dataset, suite) table."""
    metrics = list(dict.fromkeys(r.metric for r in rs))
    cell = {(r.method, r.metric): r for r in rs}
    body = []
    for m in [m for m in methods if any(r.method == m for r in rs)]:
        n = max((cell[(m, k)].n for k in metrics if (m, k) in cell), default=0)
        body.append([m, str(n)] + [fmt_mean_ci(cell[(m, k)]) if (m, k) in cell else "" for k in metrics])
    return metrics, body


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
                title: str | None = "Summary", notes: NotesMap | None = None) -> str:
    """One table per (dataset, suite): methods as rows, metrics as columns, ``mean ± 95% CI half-width``;
    ``notes`` (:func:`protocol_notes`) printed under each table."""
    lines = [f"# {title}", ""] if title else []
    lines.append(TABLE_NOTE)
    tables: dict[tuple[str, str], list[SummaryRow]] = {}
    for r in summary:
        tables.setdefault((r.dataset, r.suite), []).append(r)
    for (dataset, suite), rs in tables.items():
        methods = list(dict.fromkeys(r.method for r in rs))
        metrics, body = table_rows(rs, methods)
        labels = [metric_label(k, spec_of(specs, dataset, suite, k)) for k in metrics]
        lines += ["", f"## {suite} on {dataset}", ""]
        lines.append("| method | n | " + " | ".join(labels) + " |")
        lines.append("|---|---:|" + "---:|" * len(metrics))
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        if notes and notes.get((dataset, suite)):
            lines += [""] + [f"*{n}*  " for n in notes[(dataset, suite)]]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | Path, rows: Iterable[dict[str, Any]], *, specs: SpecMap | None = None,
                  method_order: Sequence[str] = (), dataset_order: Sequence[str] = ()) -> list[SummaryRow]:
    """Write ``summary.csv`` and ``summary.md`` (with the protocol notes under each table) atomically; return
    the summary."""
    rows = list(rows)
    summary = summarize(rows, specs=specs, method_order=method_order, dataset_order=dataset_order)
    atomic_write_text(Path(out_dir) / SUMMARY_CSV, to_csv(summary))
    atomic_write_text(Path(out_dir) / SUMMARY_MD, to_markdown(summary, specs=specs, notes=protocol_notes(rows)))
    return summary
