"""The report as one document: what ``editscope report`` shows, built once from an
:class:`~editscope.report.build.Analysis` and written three times (Markdown, LaTeX, HTML) by
:mod:`editscope.report.writers`.

The model is plain dataclasses: a :class:`ReportDocument` (title, each run's facts and config, the note on the
tables, the listed models the report lacks, the pivot, the protocol gaps, a :class:`Section` per suite on a
dataset, the case studies and the edit cards); a section holds its compact table (the best method per column
bold), its "all metrics" table, its notes, its figures and, for a sequential run, a :class:`CurvePart` (the table
after each number of edits, its figures, and the spread across edit orders as an :class:`OrdersPart`). It holds
:class:`~editscope.tables.Table`, :class:`~editscope.report.pivot.Pivot` and figure objects; :func:`build_document`
decides only which content appears, never how it is formatted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from editscope.metrics.registry import MetricSpec
from editscope.report.pivot import Pivot, best_in_compact
from editscope.run.planned import planned_count, rows_text
from editscope.run.summary import SummaryRow
from editscope.run.summary_tables import TABLE_NOTE, compact_table, curve_table, metrics_table, orders_table
from editscope.suites.base import SuiteFigure
from editscope.tables import Table

if TYPE_CHECKING:  # build imports this module: the types alone, to type the builder's input
    from editscope.report.build import Analysis, Run

Figure = SuiteFigure  # slug, title, caption, png

TITLE = "editscope report"

NOTE = ("Per suite, first the paper's columns in the paper's units (×100 where the paper prints percentages; "
        "row 'unedited' = the pre-edit values), then every metric. " + TABLE_NOTE
        + " Metrics are recomputable from the raw probes in each run's results.jsonl.")
"""The note on the tables, under the runs' facts."""

IN_PROGRESS_NOTE = ("No final rows yet (the sequential run is still going: `editscope run` resumes it); the "
                    "checkpoints written so far:")
"""The first note of a section whose sequential run has no final rows yet (its checkpoints' curves alone)."""

#: the figure slugs' prefixes of the figures the sections show (bars, curves); the rest are case studies
SECTION_FIGURES = ("bars-", "curve-", "retention-", "orders-")

#: (dataset, case id, method) -> the path of the case's edit card relative to the report's folder
Cards = Mapping[tuple[str, str, str], str]


@dataclass
class OrdersPart:
    """A block edited in several orders: each checkpoint's spread across the orders and its figure."""
    chains: str  # what the spread is across: "3 edit orders" (:attr:`~editscope.run.summary.OrderPoint.chains`)
    table: Table
    figure: Figure


@dataclass
class CurvePart:
    """A sequential run's metrics after each number of edits: the table, the curves' figure (and the retention
    heatmap where there is one), and the spread across edit orders where the block was edited in several."""
    title: str
    table: Table
    figures: list[Figure]
    orders: OrdersPart | None = None


@dataclass
class Section:
    """One suite on one dataset. ``compact``: the paper's columns, the best method per column bold (None: the suite
    declares none); ``metrics``: every metric, a row per method (None: no final rows yet); ``notes``: the protocol
    notes (first :data:`IN_PROGRESS_NOTE` where the run has no final rows); ``figures``: the bars; ``curve``: the
    curves of a sequential run."""
    title: str
    compact: Table | None
    metrics: Table | None
    notes: list[str]
    figures: list[Figure]
    curve: CurvePart | None = None


@dataclass
class ReportDocument:
    """The whole report: ``runs`` holds each run's facts as (name, value) pairs and ``configs`` each run's config;
    ``missing`` one line per listed model the report lacks; ``cards`` links the edit cards of chosen cases (empty:
    no "Edit cards" section)."""
    title: str
    runs: list[list[tuple[str, str]]]
    configs: list[dict[str, Any]]
    note: str
    missing: list[str] = field(default_factory=list)
    pivot: Pivot | None = None
    gaps: Table | None = None
    sections: list[Section] = field(default_factory=list)
    case_studies: list[Figure] = field(default_factory=list)
    cards: dict[tuple[str, str, str], str] = field(default_factory=dict)


def run_facts(run: Run) -> list[tuple[str, str]]:
    """A run's facts as (name, value) pairs: folder, model, mode, rows, status, time, versions, torch threads."""
    m = run.meta
    versions = ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())
    mode = m["config"]["mode"] + ("" if m["config"]["mode"] == "single" else f" {m['config']['group_size']}")
    return [("run", str(run.path)), ("model", f"{m['model']['name']} (fingerprint {m['model']['fingerprint']})"),
            ("mode", mode),
            ("rows", rows_text(len(run.rows), planned_count(m))), ("status", str(m.get("status"))),
            ("time", f"{m.get('started')} – {m.get('finished')}"), ("versions", versions)] + (
        [("torch threads", "/".join(map(str, m["torch_threads"])))] if m.get("torch_threads") else [])


def build_document(a: Analysis, cards: Cards | None = None) -> ReportDocument:
    """The report of ``a``: a section per (dataset, suite) of the summary, then one per sequential block that has
    curves but no final rows yet; ``cards`` (dataset, case id, method) -> the edit card's path."""
    tables: dict[tuple[str, str], list[SummaryRow]] = {}
    for r in a.summary:
        tables.setdefault((r.dataset, r.suite), []).append(r)
    figs = {f.slug: f for f in a.figures}
    sections = [_section(a, figs, dataset, suite, tables.get((dataset, suite), []))
                for dataset, suite in [*tables, *(key for key in a.curves if key not in tables)]]
    return ReportDocument(TITLE, [run_facts(run) for run in a.runs], [run.meta["config"] for run in a.runs], NOTE,
                          list(a.missing), a.pivot, a.gaps, sections,
                          [f for f in a.figures if not f.slug.startswith(SECTION_FIGURES)], dict(cards or {}))


def _with_best(table: Table, rs: list[SummaryRow], methods: list[str], specs: Sequence[MetricSpec]) -> Table:
    """A compact table (:func:`compact_table`) with the best method per column bold (:func:`best_in_compact`)."""
    best = best_in_compact(rs, methods, specs)
    return replace(table, bold={(i, j) for i, cells in enumerate(table.rows) for j in range(len(cells))
                                if (cells[0], j) in best})


def _section(a: Analysis, figs: Mapping[str, Figure], dataset: str, suite: str, rs: list[SummaryRow]) -> Section:
    """One suite on one dataset: the paper's columns, every metric, the protocol notes, the bars and curves. A
    sequential run still in progress has no final rows (``rs`` empty) yet: its checkpoints' curves alone."""
    notes = a.notes.get((dataset, suite), [])
    section = Section(f"{suite} on {dataset}", None, None, notes, [], _curve(a, figs, dataset, suite))
    if not rs:
        section.notes = [IN_PROGRESS_NOTE, *notes]
        return section
    specs = a.specs.get((dataset, suite), ())
    compact = compact_table(rs, a.methods, specs)
    section.compact = None if compact is None else _with_best(compact, rs, a.methods, specs)
    section.metrics = metrics_table(rs, a.methods, a.specs)
    section.figures = [figs[f"bars-{dataset}-{suite}"]]
    return section


def _curve(a: Analysis, figs: Mapping[str, Figure], dataset: str, suite: str) -> CurvePart | None:
    """A sequential run's table and figures of the metrics after each number of edits, where it has them."""
    table = curve_table(a.curves.get((dataset, suite), {}), a.methods, a.specs.get((dataset, suite)))
    if table is None:
        return None
    curve = CurvePart(f"{suite} on {dataset} vs number of edits", table, [figs[f"curve-{dataset}-{suite}"]])
    if f"retention-{dataset}-{suite}" in figs:
        curve.figures.append(figs[f"retention-{dataset}-{suite}"])
    orders = orders_table(a.orders.get((dataset, suite), []), a.specs.get((dataset, suite)))
    if orders is not None:
        curve.orders = OrdersPart(a.orders[(dataset, suite)][0].chains, orders,
                                  figs[f"orders-{dataset}-{suite}"])
    return curve
