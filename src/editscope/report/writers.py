"""The three writers of a :class:`~editscope.report.document.ReportDocument`, each a function of the document
alone: :func:`markdown` (``report.md``: figures linked under ``figures/``, named by :func:`png_name`),
:func:`latex` (``tables.tex``: the pivot, the protocol gaps and every compact table as booktabs tables) and
:func:`html` (``report.html``: the template ``report.html`` filled, figures embedded).

Every table sits in its own scroll box on the page and is kept narrow enough (pivot split by columns, "All
metrics" transposed and split by methods, :func:`transposed`) that none scrolls on a 1,400 px screen."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from editscope.plotting import png_axes
from editscope.report.document import CurvePart, Figure, ReportDocument, Section
from editscope.report.pages import png_src, render
from editscope.report.pivot import Pivot
from editscope.tables import Table

PIVOT_TITLE = "All methods × headline metrics"

BOLD_NOTE = "Bold: the best method per column (direction from the metric's declaration)."
"""The note the page adds under a compact table with bold cells (Markdown prints it without bold)."""

ALL_METRICS_METHODS = 5
"""Methods per 'All metrics' table: the table is transposed (a row per metric, a column per method), and more
methods than this are split over several tables, so none is wider than a 1,400 px screen."""

TEX_HEADER = "% editscope report: booktabs tables (\\usepackage{booktabs}); paste into a paper."


def png_name(slug: str) -> str:
    """A figure's file name: labels such as ``counterfact [smollm2-135m]`` (runs of several models) hold spaces and
    brackets, which a Markdown image link cannot."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", slug) + ".png"


def baseline_line(pivot: Pivot) -> str:
    """The sentence over the pivot naming the baseline of its differences."""
    return f"Baseline of the differences: {pivot.baseline}."


def transposed(table: Table) -> list[Table]:
    """The 'All metrics' table of the HTML page: a row per metric (the first row: n), a column per method, at most
    :data:`ALL_METRICS_METHODS` methods per table."""
    out = []
    for start in range(0, len(table.rows), ALL_METRICS_METHODS):
        part = table.rows[start:start + ALL_METRICS_METHODS]
        out.append(Table(["metric", *(cells[0] for cells in part)],
                         [[table.headers[k], *(cells[k] for cells in part)] for k in range(1, len(table.headers))]))
    return out


# Markdown


def markdown(doc: ReportDocument) -> str:
    """``report.md``: the runs' facts, the pivot, the gaps, a section per suite on a dataset (tables without bold,
    as summary.md prints them; figures linked), the case studies and the edit cards."""
    lines = [f"# {doc.title}", ""]
    for facts in doc.runs:
        lines += [f"- **{k}**: {v}" for k, v in facts] + [""]
    lines += [line for m in doc.missing for line in (f"*Not in this report: {m}.*", "")]
    lines += [doc.note, ""]
    if doc.pivot is not None:
        lines += [f"## {PIVOT_TITLE}", "", baseline_line(doc.pivot), ""] + doc.pivot.markdown()
    if doc.gaps is not None:
        lines += [f"## {doc.gaps.caption}", "", *doc.gaps.markdown().split("\n"), ""]
    for section in doc.sections:
        lines += _markdown_section(section)
    if doc.case_studies:
        lines += ["## Case studies", ""]
        for f in doc.case_studies:
            lines += [f"### {f.title}", "", *_markdown_figure(f)]
    if doc.cards:
        lines += ["## Edit cards", ""] + [f"- [{d} {c} {m}]({link})" for (d, c, m), link in doc.cards.items()] + [""]
    return "\n".join(lines) + "\n"


def _markdown_figure(f: Figure) -> list[str]:
    """A link to the figure's PNG under ``figures/``, its caption in italics under it."""
    return [f"![{f.title}](figures/{png_name(f.slug)})", "", f"*{f.caption}*", ""]


def _markdown_section(section: Section) -> list[str]:
    """The paper's columns, every metric, the notes, the bars and the curves of one section."""
    lines = [f"## {section.title}", ""]
    if section.compact is not None:
        lines += replace(section.compact, bold=frozenset()).markdown().split("\n") + ["", "All metrics:", ""]
    if section.metrics is not None:
        lines += section.metrics.markdown().split("\n") + [""]
    lines += [f"*{n}*  " for n in section.notes] + ([""] if section.notes else [])
    for f in section.figures:
        lines += _markdown_figure(f)
    if section.curve is not None:
        lines += _markdown_curve(section.curve)
    return lines


def _markdown_curve(curve: CurvePart) -> list[str]:
    """The table after each number of edits, its figures, then the spread across edit orders and its figure."""
    lines = ["After each number of edits (sequential batches):", "", *curve.table.markdown().split("\n"), ""]
    for f in curve.figures:
        lines += _markdown_figure(f)
    if curve.orders is not None:
        lines += [f"Across {curve.orders.chains}:", "", *curve.orders.table.markdown().split("\n"), ""]
        lines += _markdown_figure(curve.orders.figure)
    return lines


# LaTeX


def latex(doc: ReportDocument) -> str:
    """``tables.tex``: the pivot, the protocol gaps and each section's compact table (the best bold, captioned with
    the section's title) as booktabs tables, each under a comment naming it."""
    lines = [TEX_HEADER, ""]
    if doc.pivot is not None:
        lines += [f"% pivot: all methods x headline metrics; {baseline_line(doc.pivot)}"] + doc.pivot.latex() + [""]
    if doc.gaps is not None:
        lines += [f"% {doc.gaps.caption}", doc.gaps.latex(), ""]
    for s in doc.sections:
        if s.compact is not None:
            lines += [f"% {s.title}", replace(s.compact, caption=f"{s.title}.").latex(), ""]
    return "\n".join(lines) + "\n"


# HTML


def html(doc: ReportDocument) -> str:
    """``report.html``: the template ``report.html`` filled with the document (figures embedded as data URIs, each
    with its axes for the page's readers; each run's config as JSON under "configs")."""
    pivot = None if doc.pivot is None else {
        "baseline_line": baseline_line(doc.pivot), "note": doc.pivot.baseline_note,
        "tables": [doc.pivot.table(chunk) for chunk in doc.pivot.chunks()]}
    return render("report.html", title=doc.title, runs=doc.runs, missing=doc.missing, note=doc.note, pivot=pivot,
                  gaps=doc.gaps,
                  sections=[_html_section(s) for s in doc.sections],
                  case_studies=[_html_figure(f) for f in doc.case_studies], cards=_html_cards(doc.cards),
                  configs=[json.dumps(c, indent=2) for c in doc.configs])


def _html_figure(f: Figure) -> dict[str, Any]:
    """A figure's template fields: title, alt text (the title and each panel's axes), axes (JSON), src (a data
    URI), caption."""
    axes = png_axes(f.png) or []
    alt = f.title + "".join(f"; panel {i + 1}: y axis {a['y'] or '(none)'}, x axis {a['x'] or '(ticks)'}"
                            for i, a in enumerate(axes) if not a["colorbar"])
    return {"title": f.title, "alt": alt, "axes": json.dumps(axes), "src": png_src(f.png), "caption": f.caption}


def _html_section(s: Section) -> dict[str, Any]:
    """A section's template fields: the compact table (with :data:`BOLD_NOTE` where it has bold cells), the 'All
    metrics' tables (:func:`transposed`), the notes, the bars and the curves."""
    compact = s.compact
    if compact is not None and compact.bold:
        compact = replace(compact, notes=[*compact.notes, BOLD_NOTE])
    curve = None if s.curve is None else {
        "title": s.curve.title,
        "figures": [_html_figure(f) for f in [*s.curve.figures, *([s.curve.orders.figure] if s.curve.orders else [])]]}
    return {"title": s.title, "compact": compact, "all": [] if s.metrics is None else transposed(s.metrics),
            "notes": s.notes, "figures": [_html_figure(f) for f in s.figures], "curve": curve}


def _html_cards(cards: dict[tuple[str, str, str], str]) -> dict[str, Any] | None:
    """The cards' template fields: a column per method, a row per (dataset, case) with each method's link (None
    where it has no card); None without cards."""
    if not cards:
        return None
    methods = list(dict.fromkeys(m for _, _, m in cards))
    return {"methods": methods, "rows": [(d, c, [cards.get((d, c, m)) for m in methods])
                                         for d, c in dict.fromkeys((d, c) for d, c, _ in cards)]}
