"""Statistics of a results file: per dataset, suite, method and metric the mean, n and a 95% confidence
interval (Student t over cases: mean ± t₀.₉₇₅,ₙ₋₁ · s/√n; undefined for n < 2), cut to the metric's declared
range (a share's interval never leaves [0, 1]). ``null`` (NaN) metric values are left out of n.

Driven by the suites' metric declarations (:class:`~editscope.metrics.registry.MetricSpec`, keyed by
(dataset label, suite name)): metrics come in declaration order; aggregate metrics (the CounterFact/zsRE
Score) are computed here from the dataset-level means of their components, with a seeded percentile
bootstrap CI over cases (``ci = "bootstrap"``); perplexities are averaged on a log scale (geometric mean). Metrics
of a suite without declarations (an old run) are listed as stored, without aggregates.

Besides the summary per method (:func:`summarize`): the curves against the number of edits of
``sequential_batches`` runs (:func:`summarize_by_edits`, :func:`edit_info_curves`), their spread across edit
orders (:func:`across_orders`), where the chains break (:func:`break_points`) and the retention matrix
(:func:`retention`). Numbers only: :mod:`editscope.run.summary_tables` turns them into tables and text."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from editscope.metrics.intervals import (
    Strata,
    bootstrap_aggregate,
    clip_interval,
    geometric_mean_ci,
    mean_ci,
    stratified_mean_ci,
)
from editscope.metrics.registry import Declarations, MetricSpec
from editscope.run.plan import base_label, label_threads
from editscope.run.suites import FactsMap, facts_of

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
    #: "t" (Student t over cases), "t-log" (on log values: geometric mean), "t-strata" (a stratified sample: a
    #: lifelong checkpoint beyond ``reprobe``), "bootstrap", or "model" (a suite that measures the whole model, one
    #: value carried by every case: no interval)
    ci: str = "t"

    @property
    def half_width(self) -> float:
        return (self.ci95_high - self.ci95_low) / 2


LOG_UNITS = ("ppl",)
"""Units aggregated on a log scale: perplexities of 1-to-N answers span 1e1..1e11 per case (paper 000 §2.2 (3)
averages per query without saying how over queries), so an arithmetic mean is one case's value."""


def _declarations(specs: SpecMap | None, dataset: str, suite: str) -> Declarations | None:
    found = (specs or {}).get((dataset, suite))
    return Declarations(tuple(found)) if found is not None else None


Groups = dict[tuple[str, str, str], list[Any]]
"""(dataset, suite, method) -> one entry per case."""


def _group_cases(rows: Iterable[dict[str, Any]]) -> tuple[Groups, Groups, dict[tuple[str, str], list[str]]]:
    """Per (dataset, suite, method): each case's metrics and its stratum; per (dataset, suite): the metric names in
    the order first stored. Checkpoint rows are left out."""
    cases: Groups = {}
    strata_of: Groups = {}
    stored: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.get("checkpoint"):  # sequential_batches rows probed before the last round: curves, not tables
            continue
        for suite, metrics in row["metrics"].items():
            cases.setdefault((row["dataset"], suite, row["method"]), []).append(metrics)
            strata_of.setdefault((row["dataset"], suite, row["method"]), []).append(_row_stratum(row))
            order = stored.setdefault((row["dataset"], suite), [])
            order.extend(k for k in metrics if k not in order)
    return cases, strata_of, stored


def _ordered_groups(cases: Groups, method_order: Sequence[str],
                    dataset_order: Sequence[str]) -> list[tuple[str, str, str]]:
    """The groups by dataset, suite and method: those given first, the rest as first seen."""
    seen_d = list(dict.fromkeys(list(dataset_order) + [k[0] for k in cases]))
    seen_m = list(dict.fromkeys(list(method_order) + [k[2] for k in cases]))
    seen_s = list(dict.fromkeys(k[1] for k in cases))
    return sorted(cases, key=lambda k: (seen_d.index(k[0]), seen_s.index(k[1]), seen_m.index(k[2])))


def _columns(decl: Declarations | None, stored: list[str]) -> list[tuple[str, MetricSpec | None]]:
    """The declared columns with their specs, then the undeclared ones as stored (no spec)."""
    columns: list[tuple[str, MetricSpec | None]] = []
    if decl is not None:
        columns = [(c, s) for s in decl.specs for c in s.columns]
    declared = {c for c, _ in columns}
    return columns + [(c, None) for c in stored if c not in declared]


def _aggregate_row(key: tuple[str, str, str], column: str, spec: MetricSpec, per_case: list[dict[str, Any]],
                   case_strata: list[tuple[Hashable, int] | None]) -> SummaryRow | None:
    """An aggregate metric from the dataset-level means of its components, with its bootstrap CI; None where no
    case has every component."""
    suffix = column[len(spec.name):]
    parts = [f"{p}{suffix}" for p in spec.aggregate.of]
    matrix = np.array([[_value(m.get(p)) for p in parts] for m in per_case], dtype=np.float64)
    n = int(np.isfinite(matrix).sum(axis=0).min()) if matrix.size else 0
    if n == 0:
        return None
    value, lo, hi = bootstrap_aggregate(matrix, spec, strata=_strata(case_strata))
    lo, hi = clip_interval(lo, hi, spec.range)
    return SummaryRow(*key, column, n, value, lo, hi, math.nan, "bootstrap")


def _mean_and_interval(vals: list[float], spec: MetricSpec | None, strata: Strata | None,
                       whole_model: bool) -> tuple[float, float, float, float, str]:
    """(mean, lo, hi, sd, the interval's kind) of one metric's values."""
    if whole_model and len({v for v in vals if math.isfinite(v)}) <= 1:
        # one measurement of the whole model carried by every case (a lifelong checkpoint): no interval
        # over cases; in single mode each case has its own edit, and the t interval below applies
        return float(np.nanmean(vals)), math.nan, math.nan, math.nan, "model"
    if spec is not None and spec.unit in LOG_UNITS:
        return (*geometric_mean_ci(vals, strata=strata), "t-log")
    if strata is not None:
        return (*stratified_mean_ci(vals, strata), "t-strata")
    return (*mean_ci(vals), "t")


def _metric_row(key: tuple[str, str, str], column: str, spec: MetricSpec | None, per_case: list[dict[str, Any]],
                case_strata: list[tuple[Hashable, int] | None], whole_model: bool = False) -> SummaryRow | None:
    """One stored metric's mean and CI over the cases that hold it (cut to the declared range); None where none
    does."""
    vals = [_value(m[column]) for m in per_case if column in m]
    if not vals:
        return None
    strata = _strata([h for m, h in zip(per_case, case_strata, strict=True) if column in m])
    mean, lo, hi, sd, kind = _mean_and_interval(vals, spec, strata, whole_model)
    if spec is not None:
        lo, hi = clip_interval(lo, hi, spec.range)
    n = sum(1 for v in vals if math.isfinite(v))
    return SummaryRow(*key, column, n, mean, lo, hi, sd, kind)


def summarize(rows: Iterable[dict[str, Any]], *, specs: SpecMap | None = None, method_order: Sequence[str] = (),
              dataset_order: Sequence[str] = (), facts: FactsMap | None = None) -> list[SummaryRow]:
    """Aggregate results rows (order: datasets and methods as given, else first seen; metrics in declaration
    order, undeclared ones after them as stored; checkpoint rows left out). Aggregate metrics of ``specs`` are
    computed from the dataset-level means of their components (:func:`bootstrap_aggregate`). ``facts``: the suites'
    recorded facts (:func:`editscope.run.suites.recorded_facts`), else the registry's."""
    cases, strata_of, stored = _group_cases(rows)
    out = []
    for key in _ordered_groups(cases, method_order, dataset_order):
        dataset, suite, _method = key
        for column, spec in _columns(_declarations(specs, dataset, suite), stored[(dataset, suite)]):
            if spec is not None and spec.aggregate is not None:
                row = _aggregate_row(key, column, spec, cases[key], strata_of[key])
            else:
                row = _metric_row(key, column, spec, cases[key], strata_of[key],
                                  facts_of(facts, suite).whole_model)
            if row is not None:
                out.append(row)
    return out


_STRATUM = "_stratum"
"""Private row key set by :func:`summarize_by_edits` on the rows of a checkpoint that re-probed a sample of the
earlier cases: (stratum, its population size), so :func:`summarize` weighs each stratum by its size."""


def _row_stratum(row: Mapping[str, Any]) -> tuple[Hashable, int] | None:
    """A row's stratum: the one :func:`summarize_by_edits` marked, else the one the runner recorded for a sampled
    lifelong probe (``sequential_batches.sampled``: the batch just written, or the sample of the earlier cases,
    with the number of cases it stands for), else None."""
    if _STRATUM in row:
        return row[_STRATUM]
    stored = row.get("stratum")
    return ((row.get("group"), bool(stored[0])), int(stored[1])) if stored else None


def _strata(entries: Sequence[tuple[Hashable, int] | None]) -> Strata | None:
    """The :data:`Strata` of a group of rows, or None where they are no stratified sample."""
    if not entries or any(e is None for e in entries):
        return None
    return [label for label, _ in entries], {label: size for label, size in entries}


def _checkpoint_strata(point: list[dict[str, Any]], first: Mapping[tuple, int], edits: int) -> list[dict[str, Any]]:
    """The rows probed with ``edits`` edits on the model, each marked with its stratum where a checkpoint re-probed
    only a sample of the earlier cases (``sequential_batches.reprobe``): per (dataset, method, group), the cases
    first probed now (the batch just written, all probed) and the earlier ones (a sample). Unmarked, the curve
    point would be the plain mean over both and lean toward the newest batch."""
    if all("stratum" in r for r in point):  # a sampled probe: the runner recorded each row's stratum
        return point

    def stratum(row: dict[str, Any]) -> tuple:
        key = (row["dataset"], row["method"], row.get("group"))
        return (*key, first[(*key, str(row["case_id"]))] == edits)

    population = Counter((d, m, g, f == edits) for (d, m, g, _c), f in first.items() if f <= edits)
    probed = Counter(stratum(r) for r in point)
    if all(probed[h] == population[h] for h in probed):
        return point
    return [{**r, _STRATUM: (h, population[h])} for r in point for h in (stratum(r),)]


CurveMap = dict[tuple[str, str], dict[int, list[SummaryRow]]]
"""(dataset label, suite name) -> {edits on the model: that point's summary rows} (:func:`summarize_by_edits`)."""


def summarize_by_edits(rows: Iterable[dict[str, Any]], *, specs: SpecMap | None = None,
                       method_order: Sequence[str] = (), dataset_order: Sequence[str] = (),
                       facts: FactsMap | None = None) -> CurveMap:
    """The curves of metric vs number of edits of ``sequential_batches`` runs: rows grouped by
    ``edits_applied`` (checkpoint rows and the final rows alike: what was on the model when they were probed),
    each group summarised like :func:`summarize`. Only (dataset, suite) pairs with two or more points. A point whose
    checkpoint re-probed a sample of the earlier cases (``reprobe``) is their stratified mean: the batch just
    written and the sample each weigh by the number of cases they stand for (:func:`stratified_mean_ci`)."""
    by_edits: dict[int, list[dict[str, Any]]] = {}
    first: dict[tuple, int] = {}  # (dataset, method, group, case): edits on the model when first probed
    for row in rows:
        if row.get("edits_applied") is not None:
            edits = int(row["edits_applied"])
            by_edits.setdefault(edits, []).append({**row, "checkpoint": False})
            key = (row["dataset"], row["method"], row.get("group"), str(row["case_id"]))
            first[key] = min(first.get(key, edits), edits)
    out: CurveMap = {}
    for edits in sorted(by_edits):
        point = _checkpoint_strata(by_edits[edits], first, edits)
        for r in summarize(point, specs=specs, method_order=method_order, dataset_order=dataset_order, facts=facts):
            out.setdefault((r.dataset, r.suite), {}).setdefault(edits, []).append(r)
    return {key: points for key, points in out.items() if len(points) >= 2}


@dataclass(frozen=True)
class OrderPoint:
    """One metric of one method after ``edits`` edits, across the edit orders of a block (``orders``): ``values``
    holds each order's mean (order 0 first), ``row`` their mean with a Student t interval over the orders (n = the
    number of orders, ci ``orders``): the spread a reader needs where one chain is an anecdote."""

    edits: int
    row: SummaryRow
    values: tuple[float, ...]
    #: whether the chains include runs under several torch thread counts (mode ``threads``)
    threads: bool = False

    @property
    def chains(self) -> str:
        """What the values are across, as a reader needs it: "3 edit orders", or "4 chains (edit orders × torch
        thread counts)"."""
        n = len(self.values)
        return f"{n} chains (edit orders × torch thread counts)" if self.threads else f"{n} edit orders"


OrderMap = dict[tuple[str, str], list[OrderPoint]]


def across_orders(curves: CurveMap) -> OrderMap:
    """For every (block, suite) whose curves (:func:`summarize_by_edits`) exist in two or more chains -- edit orders
    (block labels ``LABEL~orderK``) and, where the mode lists them, thread counts (``...~threadsN``: each a chain of
    its own, counted as one more order) --, each (method, metric, edits) point every chain reached, keyed by the
    block's own label (:class:`OrderPoint`)."""
    by: dict[tuple[str, str], dict[tuple[int, str, str], dict[tuple[int, int], float]]] = {}
    threaded = {base_label(d)[0] for d, _ in curves if label_threads(d) is not None}
    for (dataset, suite), points in curves.items():
        base, order = base_label(dataset)
        chain = (order, label_threads(dataset) or 0)
        for edits, rs in points.items():
            for r in rs:
                by.setdefault((base, suite), {}).setdefault((edits, r.method, r.metric), {})[chain] = r.mean
    out: OrderMap = {}
    for (base, suite), points in by.items():
        orders = sorted({o for per in points.values() for o in per})
        if len(orders) < 2:
            continue
        for (edits, method, metric), per in sorted(points.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if sorted(per) != orders:
                continue
            values = tuple(per[o] for o in orders)
            mean, low, high, sd = mean_ci(values)
            row = SummaryRow(base, suite, method, metric, len(values), mean, low, high, sd, ci="orders")
            out.setdefault((base, suite), []).append(OrderPoint(edits, row, values, base in threaded))
    return out


BREAK_SUITE, BREAK_METRIC, BREAK_SHARE = "counterfact", "ES_post", 0.5
"""Where a lifelong chain breaks by default: the first checkpoint at which the cases first probed there (the batch
just written) have a mean CounterFact ES below one half."""


@dataclass(frozen=True)
class BreakPoint:
    """One chain (a block label, edit order included, and a method): ``edits``, the first checkpoint where the mean
    of ``metric`` over the batch just written (a sampled probe's recorded stratum; else the cases first probed
    there) falls below ``share`` (None: it never does); ``sigma_jump``,
    the checkpoint with the largest rise of σ₁(ΔW)/σ₁(W₀) (the weights suite's DeltaSigma) over the checkpoint
    before (None: fewer than two finite, positive values)."""

    dataset: str
    method: str
    edits: int | None
    sigma_jump: int | None
    last: int


def break_points(rows: Iterable[dict[str, Any]], *, suite: str = BREAK_SUITE, metric: str = BREAK_METRIC,
                 share: float = BREAK_SHARE) -> list[BreakPoint]:
    """The :class:`BreakPoint` of every lifelong chain in ``rows`` that probed ``suite``'s ``metric``."""
    rows = [r for r in rows if r.get("edits_applied") is not None]
    first: dict[tuple, int] = {}
    for r in rows:
        key = (r["dataset"], r["method"], r.get("group"), str(r["case_id"]))
        first[key] = min(first.get(key, r["edits_applied"]), r["edits_applied"])
    new: dict[tuple[str, str], dict[int, list[float]]] = {}
    sigma: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        chain, edits = (r["dataset"], r["method"]), int(r["edits_applied"])
        value = r.get("metrics", {}).get(suite, {}).get(metric)
        stratum = r.get("stratum")  # a sampled probe records whether the row is of the batch just written
        just_written = bool(stratum[0]) if stratum else first[(*chain, r.get("group"), str(r["case_id"]))] == edits
        if value is not None and just_written:
            new.setdefault(chain, {}).setdefault(edits, []).append(float(value))
        s = r.get("metrics", {}).get("weights", {}).get("DeltaSigma")
        if s is not None and math.isfinite(s):
            sigma.setdefault(chain, {}).setdefault(edits, float(s))
    out = []
    for chain, points in new.items():
        below = [e for e in sorted(points) if sum(points[e]) / len(points[e]) < share]
        out.append(BreakPoint(*chain, below[0] if below else None, _largest_rise(sigma.get(chain, {})),
                              max(points)))
    return out


def _largest_rise(values: Mapping[int, float]) -> int | None:
    """The key whose value rose most, as a ratio, over the value at the key before (positive values only)."""
    keys = [k for k in sorted(values) if values[k] > 0]
    rises = [(values[b] / values[a], b) for a, b in zip(keys, keys[1:], strict=False)]
    return max(rises)[1] if rises else None


def edit_info_curves(rows: Iterable[dict[str, Any]], suite: str, declared: Mapping[str, MetricSpec],
                     method_order: Sequence[str] = ()) -> dict[str, dict[int, list[SummaryRow]]]:
    """Per dataset, {edits on the model: summary rows} of the per-round quantities ``declared`` (``edit_info`` key ->
    spec) that ``suite``'s curves show (:attr:`~editscope.suites.base.Suite.edit_info_curves`): for each method, the
    largest value over the rows whose case was first probed at that checkpoint, i.e. over the rounds written since
    the previous one (a row carries the info of the round that edited its case). A value per round, not per case:
    no interval. Only methods whose editor reports the key; datasets with two or more points."""
    first: dict[tuple, int] = {}
    infos: dict[tuple, dict[str, Any]] = {}  # (dataset, method, group, case) -> its round's edit_info
    for row in rows:
        info = row.get("edit_info") or {}
        if row.get("edits_applied") is None or not any(key in info for key in declared):
            continue
        case = (row["dataset"], row["method"], row.get("group"), str(row["case_id"]))
        first[case] = min(first.get(case, int(row["edits_applied"])), int(row["edits_applied"]))
        infos[case] = info
    written: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for case, edits in first.items():
        written.setdefault((case[0], case[1], edits), []).append(infos[case])
    order = {m: i for i, m in enumerate(method_order)}
    out: dict[str, dict[int, list[SummaryRow]]] = {}
    for (dataset, method, edits), group in sorted(written.items(), key=lambda kv: (order.get(kv[0][1], len(order)),
                                                                                   kv[0])):
        for key, spec in declared.items():
            values = [float(info[key]) for info in group if key in info]
            if values:
                top = max(values)
                out.setdefault(dataset, {}).setdefault(edits, []).append(
                    SummaryRow(dataset, suite, method, spec.post, len(values), top, math.nan, math.nan, math.nan,
                               ci="model"))
    return {d: dict(sorted(points.items())) for d, points in out.items() if len(points) >= 2}


RetentionMap = dict[tuple[str, str, str], dict[tuple[int, int], float]]
"""(dataset, suite, method) -> {(edits when the cases were first probed, edits at the probe): mean of the metric}."""


def retention(rows: Iterable[dict[str, Any]], suite: str, column: str) -> RetentionMap:
    """The retention matrix of ``sequential_batches`` runs: each case labelled by the number of edits on the model
    when it was first probed (the checkpoint right after its own batch: it names the batch), its ``column`` (a
    post-edit metric of ``suite``) averaged per (batch label, edits at the probe). A row i read across the
    checkpoints is how the edits of batch i hold up while later batches are written (AlphaEdit Fig. 1, paper 004)."""
    rows = [r for r in rows if r.get("edits_applied") is not None
            and (r.get("metrics") or {}).get(suite, {}).get(column) is not None]
    first: dict[tuple[str, str, str], int] = {}
    for r in rows:
        key = (r["dataset"], r["method"], str(r["case_id"]))
        first[key] = min(first.get(key, int(r["edits_applied"])), int(r["edits_applied"]))
    cells: dict[tuple[str, str, str], dict[tuple[int, int], list[float]]] = {}
    for r in rows:
        batch = first[(r["dataset"], r["method"], str(r["case_id"]))]
        cell = cells.setdefault((r["dataset"], suite, r["method"]), {}).setdefault(
            (batch, int(r["edits_applied"])), [])
        cell.append(float(r["metrics"][suite][column]))
    return {key: {ij: sum(v) / len(v) for ij, v in sorted(c.items())} for key, c in cells.items()
            if len({j for _, j in c}) >= 2}


def _value(v: Any) -> float:
    return math.nan if v is None else float(v)


def spec_of(specs: SpecMap | None, dataset: str, suite: str, column: str) -> MetricSpec | None:
    """The declaration that owns ``column`` of (dataset, suite), or None."""
    decl = _declarations(specs, dataset, suite)
    return decl.by_column.get(column) if decl is not None else None
