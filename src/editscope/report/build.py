"""``report``: one self-contained ``report.html`` (figures embedded as base64 PNG), a ``report.md`` (figures
written next to it under ``figures/``) and ``tables.tex`` (booktabs) from one or more run directories.

This module reads the runs and analyses them once (:func:`analyse`: the summary, the pivot of every method
against every headline metric (:mod:`editscope.report.pivot`: best bold, paired differences against a named
baseline, † where significant), the curves of sequential runs, the protocol gaps and notes, the figures);
:func:`build_report` turns the :class:`Analysis` into one document (:func:`editscope.report.document.
build_document`: what appears) and writes it three times (:mod:`editscope.report.writers`: how it looks in
Markdown, LaTeX and HTML).

Everything suite-specific comes from declarations: the metric declarations stored in each run's
``run.json`` (directions, units, ranges, pre/post pairing, aggregates) and each suite's ``figures`` hook
(suites built from the run's config through the registry or ``suite_factories``). Under every table it prints
the protocol its numbers follow and the editors' conventions (:func:`editscope.run.summary_tables.protocol_notes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from editscope.atomic import atomic_write_bytes, atomic_write_text, make_dirs
from editscope.errors import EditscopeError
from editscope.metrics.registry import MetricSpec
from editscope.report import figures, writers
from editscope.report.document import Cards, Figure, build_document
from editscope.report.pivot import Pivot, build_pivot
from editscope.report.writers import png_name
from editscope.run.config import check_stored_config
from editscope.run.models import expand_run_dirs
from editscope.run.store import RESULTS, ROW_CONFIG_KEY, RUN_JSON, read_json, row_key, run_rows
from editscope.run.suites import (
    DeclaredMetrics,
    FactsMap,
    SuiteFactory,
    SuiteFacts,
    declared_metrics,
    facts_of,
    make_suite,
    recorded_facts,
)
from editscope.run.summary import (
    CurveMap,
    OrderMap,
    OrderPoint,
    SummaryRow,
    across_orders,
    edit_info_curves,
    retention,
    spec_of,
    summarize,
    summarize_by_edits,
)
from editscope.run.summary_tables import protocol_gap_table, protocol_notes
from editscope.suites.base import Suite
from editscope.tables import Table

__all__ = ["TABLES_TEX", "Analysis", "Figure", "Run", "analyse", "build_figures", "build_report", "load_runs",
           "png_name"]


@dataclass
class Run:
    """One run as the report reads it: its folder, its ``run.json`` and its rows (labels as the report keys them:
    :func:`load_runs`)."""
    path: Path
    meta: dict[str, Any]
    rows: list[dict[str, Any]]


def load_runs(run_dirs: list[str | Path], missing: list[str] | None = None) -> list[Run]:
    """Read each run (the folder of a ``models`` list: each model's run, :func:`~editscope.run.models.
    expand_run_dirs`). Runs of more than one model are keyed by model: every dataset label becomes
    ``label [model]``, so each model gets its own tables, its own unedited row and its own pivot columns, and
    differences pair cases within one model. When several runs of one model hold rows of one method label on one
    dataset, that label becomes ``label [run dir name]`` in each of them; runs that split a config by dataset block
    (one run per dataset) keep their labels, so the pivot joins them as one run's. ``missing`` gets one line per
    model of a models list that has no rows (:func:`~editscope.run.models.expand_run_dirs`)."""
    runs = [_read_run(path) for path in expand_run_dirs(run_dirs, missing)]
    if len({r["model"] for run in runs for r in run.rows}) > 1:
        for run in runs:
            _key_by_model(run)
    if len(runs) > 1:
        _label_shared_methods(runs)
    return runs


def _read_run(path: Path) -> Run:
    """One run folder's ``run.json`` and rows (each naming its model); a run without rows is an error."""
    meta = read_json(path / RUN_JSON)
    check_stored_config(meta.get("config", {}), path / RUN_JSON)  # the report reads its labels and blocks
    rows = run_rows(path)
    if not rows:
        raise EditscopeError(f"{path}: no results yet ({RESULTS} is empty or missing)")
    own = meta.get("config_digest")
    for r in rows:
        if r.get(ROW_CONFIG_KEY, own) != own:
            raise EditscopeError(f"{path}: row {'/'.join(row_key(r))} belongs to a run of another config (digest "
                                 f"{r[ROW_CONFIG_KEY]}, this run's {own}); remove it, or resume the run to compute "
                                 "it again")
    name = str(meta.get("model", {}).get("name"))
    for r in rows:
        r.setdefault("model", name)  # rows written before rows named their model
    return Run(path, meta, rows)


def _label_shared_methods(runs: list[Run]) -> None:
    """Method labels ``label [run dir name]`` where several runs hold rows of one model, method and dataset."""
    seen: dict[tuple[str, str, str], int] = {}
    for run in runs:
        for key in {(r["model"], r["method"], r["dataset"]) for r in run.rows}:
            seen[key] = seen.get(key, 0) + 1
    for run in runs:
        clash = {(r["model"], r["method"]) for r in run.rows if seen[(r["model"], r["method"], r["dataset"])] > 1}
        for r in run.rows:
            if (r["model"], r["method"]) in clash:
                r["method"] = f"{r['method']} [{run.path.name}]"


def _key_by_model(run: Run) -> None:
    """Dataset labels ``label [model]`` in the run's rows, config blocks and stored metric declarations."""
    for r in run.rows:
        r["dataset"] = f"{r['dataset']} [{r['model']}]"
    name = run.meta.get("model", {}).get("name")
    for block in run.meta.get("config", {}).get("blocks", []):
        block["label"] = f"{block['label']} [{name}]"
    for entry in run.meta.get("metrics", []):
        entry["dataset"] = f"{entry['dataset']} [{name}]"


def _ordered(runs: list[Run], field: str, config_key: str) -> list[str]:
    """The labels in the runs' rows' ``field`` (method or dataset), each once: run by run, in the order of the run's
    config list ``config_key`` (a label's part before `` [`` counts), labels the config lacks after its own."""
    out: list[str] = []
    for run in runs:
        labels = [x["label"] for x in run.meta.get("config", {}).get(config_key, [])]
        present = list(dict.fromkeys(r[field] for r in run.rows))
        for x in present:
            base = x.split(" [")[0]
            if base not in labels:
                labels.append(base)
        out += [x for x in sorted(present, key=lambda x: labels.index(x.split(" [")[0])) if x not in out]
    return out


def _suites(runs: list[Run], suite_factories: Mapping[str, SuiteFactory] | None) -> dict[tuple[str, str], Suite]:
    """(dataset, suite name) -> the suite as each run's config built it (first run wins); suites that are
    neither registered nor in ``suite_factories`` are left out (their tables still render)."""
    out: dict[tuple[str, str], Suite] = {}
    for run in runs:
        for block in run.meta.get("config", {}).get("blocks", []):
            for spec in block.get("suites", []):
                key = (block["label"], spec["name"])
                if key in out:
                    continue
                try:
                    out[key] = make_suite(spec["name"], spec.get("options") or {}, suite_factories)
                except EditscopeError:
                    continue
    return out


def _facts(runs: list[Run]) -> dict[str, SuiteFacts]:
    """The suite facts the runs' ``run.json`` files record (the first run wins); a suite none records is looked up
    in the registry (:func:`editscope.run.suites.facts_of`)."""
    out: dict[str, SuiteFacts] = {}
    for run in runs:
        for name, facts in recorded_facts(run.meta).items():
            out.setdefault(name, facts)
    return out


def _specs(runs: list[Run], suite_factories: Mapping[str, SuiteFactory] | None) -> DeclaredMetrics:
    """The metric declarations of each (dataset, suite) the runs hold (the first run wins)."""
    out: DeclaredMetrics = {}
    for run in runs:
        for key, specs in declared_metrics(run.meta, suite_factories).items():
            out.setdefault(key, specs)
    return out


def build_figures(runs: list[Run], summary: list[SummaryRow], methods: list[str], *, seed: int = 0,
                  specs: DeclaredMetrics | None = None,
                  suite_factories: Mapping[str, SuiteFactory] | None = None) -> list[Figure]:
    """Metric bars per (dataset, suite) from the summary and declarations, then every suite's own figures."""
    rows = [r for run in runs for r in run.rows]
    out = []
    tables: dict[tuple[str, str], list[SummaryRow]] = {}
    for r in summary:
        tables.setdefault((r.dataset, r.suite), []).append(r)
    for (dataset, suite), rs in tables.items():
        present = [m for m in methods if any(r.method == m for r in rs)]
        by_column = {r.metric: spec_of(specs, dataset, suite, r.metric) for r in rs}
        out.append(Figure(f"bars-{dataset}-{suite}", f"{suite} on {dataset}",
                          "Mean over cases per method; error bars are 95% confidence intervals (Student t; "
                          "bootstrap for aggregates); dashed: the mean before the edit.",
                          figures.metric_bars(rs, present, f"{suite} on {dataset}",
                                              {k: v for k, v in by_column.items() if v is not None})))
    for (dataset, name), suite in _suites(runs, suite_factories).items():
        drows = [r for r in rows if r["dataset"] == dataset and name in r["pre"]]
        if drows:
            out += suite.figures(dataset, drows, methods, seed=seed)
    return out


@dataclass
class Analysis:
    """Everything a report shows, computed once from the runs: the summary (mean and CI per method and metric),
    the pivot against the baseline, the curves of sequential runs, the protocol notes and the figures."""
    runs: list[Run]
    methods: list[str]
    rows: list[dict[str, Any]]
    specs: DeclaredMetrics
    summary: list[SummaryRow]
    pivot: Pivot | None
    notes: dict[tuple[str, str], list[str]]
    curves: CurveMap
    figures: list[Figure]
    #: one line per listed model (a models list) left out: no folder, or no rows yet
    missing: list[str] = field(default_factory=list)
    #: wild minus teacher-forced per case, where a block measured both protocols (None: no such block)
    gaps: Table | None = None
    #: each checkpoint's spread across edit orders, where a block was edited in several (``orders``)
    orders: OrderMap = field(default_factory=dict)


def analyse(run_dirs: list[str | Path], *, seed: int = 0, suite_factories: Mapping[str, SuiteFactory] | None = None,
            baseline: str | None = None) -> Analysis:
    """Load the runs and compute the report's tables and figures (:func:`build_report` and the reproduction page
    both render this)."""
    if not run_dirs:
        raise EditscopeError("report: no run directories given")
    missing: list[str] = []
    runs = load_runs(run_dirs, missing)
    methods = _ordered(runs, "method", "methods")
    datasets = _ordered(runs, "dataset", "blocks")
    rows = [r for run in runs for r in run.rows]
    specs = _specs(runs, suite_factories)
    facts = _facts(runs)
    summary = summarize(rows, specs=specs, method_order=methods, dataset_order=datasets, facts=facts)
    pivot = build_pivot(rows, summary, specs, methods, baseline=baseline,
                        model_level=_model_level({(r.dataset, r.suite) for r in summary}, facts))
    figs = build_figures(runs, summary, methods, seed=seed, specs=specs, suite_factories=suite_factories)
    curves = summarize_by_edits(rows, specs=specs, method_order=methods, dataset_order=datasets, facts=facts)
    _add_edit_info_curves(curves, specs, rows, methods, facts)
    figs += [Figure(f"curve-{dataset}-{suite}", f"{suite} on {dataset} vs number of edits",
                    "Sequential batches: each point is the mean over the cases edited so far when the model held "
                    "that many edits (checkpoint rows; the last point is the final evaluation); band: 95% CI; "
                    "dashed: before any edit.",
                    figures.edit_curves(points, [m for m in methods if any(r.method == m for rs in points.values()
                                                                           for r in rs)],
                                        f"{suite} on {dataset}", specs.get((dataset, suite), ())))
             for (dataset, suite), points in curves.items() if specs.get((dataset, suite))]
    figs += _retention_figures(rows, curves, specs, methods, facts)
    orders = across_orders(curves)
    figs += [_orders_figure(dataset, suite, points, methods, specs.get((dataset, suite), ()))
             for (dataset, suite), points in orders.items() if specs.get((dataset, suite))]
    return Analysis(runs, methods, rows, specs, summary, pivot, protocol_notes(rows), curves, figs, missing,
                    protocol_gap_table(rows, methods, facts), orders)


def _orders_figure(dataset: str, suite: str, points: Sequence[OrderPoint], methods: Sequence[str],
                   specs: Sequence[MetricSpec]) -> Figure:
    """The curves of a block edited in several orders: per method the mean across orders with its t band, each
    order's curve faint beneath."""
    means: dict[int, list[SummaryRow]] = {}
    faint: dict[tuple[str, str], list[tuple[list[int], list[float]]]] = {}
    for p in points:
        means.setdefault(p.edits, []).append(p.row)
    for key in {(p.row.method, p.row.metric) for p in points}:
        mine = sorted((p for p in points if (p.row.method, p.row.metric) == key), key=lambda p: p.edits)
        faint[key] = [([p.edits for p in mine], [p.values[k] for p in mine]) for k in range(len(mine[0].values))]
    across = points[0].chains
    shown = [m for m in methods if any(p.row.method == m for p in points)]
    return Figure(f"orders-{dataset}-{suite}", f"{suite} on {dataset} across {across}",
                  f"Each line: the mean across {across} of the mean over the cases edited so far; band: 95% t "
                  "interval over the orders; faint: each order's own curve.",
                  figures.edit_curves(dict(sorted(means.items())), shown, f"{suite} on {dataset}", specs,
                                      faint=faint, caption=f"mean across {across}, band: 95% t interval"))


def _add_edit_info_curves(curves: CurveMap, specs: DeclaredMetrics, rows: list[dict[str, Any]],
                          methods: list[str], facts: FactsMap) -> None:
    """The per-round quantities of the editors that a suite's curves show beside its own metrics (the condition
    number of the solve beside the weight drift: why an editor collapses, read off one figure)."""
    by_suite: dict[str, dict[str, dict[int, list[SummaryRow]]]] = {}  # one pass over the rows per suite
    for dataset, suite in list(curves):
        declared = facts_of(facts, suite).edit_info_curves
        if not declared:
            continue
        if suite not in by_suite:
            by_suite[suite] = edit_info_curves(rows, suite, declared, methods)
        points = by_suite[suite].get(dataset)
        if not points:
            continue
        merged = curves[(dataset, suite)]
        for edits, rs in points.items():
            merged.setdefault(edits, []).extend(rs)
        curves[(dataset, suite)] = dict(sorted(merged.items()))
        specs[(dataset, suite)] = (*specs.get((dataset, suite), ()), *declared.values())


def build_report(run_dirs: list[str | Path], out_dir: str | Path | None = None, *, seed: int = 0,
                 suite_factories: Mapping[str, SuiteFactory] | None = None,
                 baseline: str | None = None,
                 cards: Cards | None = None,
                 log: Callable[[str], None] = lambda _m: None) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` (plus ``figures/*.png``) and ``tables.tex`` (the pivot and every
    compact table as booktabs tabulars) to ``out_dir`` (default: the first run directory); return the paths of
    the first two. ``baseline``: the method the pivot's paired differences are taken against (default: the
    unedited model). ``suite_factories`` supplies suites that are not registered (for their figures and, in
    runs without stored declarations, their metric declarations). ``cards``: (dataset, case id, method) -> the
    path of its edit card relative to ``out_dir`` (:func:`editscope.report.card.make_cards`), linked from an
    "Edit cards" section. ``log`` gets one line per listed model the report lacks (also said on the page and in
    ``report.md``)."""
    a = analyse(run_dirs, seed=seed, suite_factories=suite_factories, baseline=baseline)
    out = make_dirs(Path(out_dir if out_dir is not None else run_dirs[0]), "report folder")
    for f in a.figures:
        atomic_write_bytes(out / "figures" / png_name(f.slug), f.png)

    for line in a.missing:  # the user sees at once that a model is missing, not only when reading the page
        log(f"report: {line}; reported without it")
    doc = build_document(a, cards)
    html_path = atomic_write_text(out / "report.html", writers.html(doc))
    md_path = atomic_write_text(out / "report.md", writers.markdown(doc))
    atomic_write_text(out / TABLES_TEX, writers.latex(doc))
    return html_path, md_path


TABLES_TEX = "tables.tex"


def _model_level(keys: Iterable[tuple[str, str]], facts: FactsMap) -> set[tuple[str, str]]:
    """The (dataset, suite) pairs whose suite measures the model as a whole."""
    return {(dataset, suite) for dataset, suite in keys if facts_of(facts, suite).whole_model}


def _retention_figures(rows, curves, specs, methods, facts: FactsMap) -> list[Figure]:
    """The retention heatmap of each (dataset, suite) with curves: its first headline metric that is measured
    per case after the edit and has a direction (ES for counterfact, Efficacy for zsRE); none for suites that
    measure the model as a whole (``chooses_edits = False``)."""
    out = []
    for dataset, suite in curves:
        if facts_of(facts, suite).whole_model:
            continue  # a model-level suite (general): every batch carries the same value, nothing to retain
        spec = next((s for s in specs.get((dataset, suite), ()) if s.headline and s.aggregate is None
                     and s.higher_is_better is not None), None)
        if spec is None:
            continue
        matrices = {key[2]: cells for key, cells in retention(rows, suite, spec.post).items() if key[0] == dataset}
        ordered = {m: matrices[m] for m in methods if m in matrices}
        if ordered:
            out.append(Figure(f"retention-{dataset}-{suite}", f"{suite} on {dataset}: retention",
                              "Sequential batches: cell (i, j) is the mean of the metric over the cases first probed "
                              "when the model held i edits (one batch), measured when it held j edits; a row read "
                              "left to right is how that batch's edits hold up as later batches are written.",
                              figures.retention_heatmap(ordered, spec, f"{suite} on {dataset}")))
    return out
