"""The report's document model and its three writers (editscope.report.document, editscope.report.writers): a
document built from a small hand-made Analysis (no run, no model) holds what the report shows, and each writer
renders every section of it."""

from __future__ import annotations

import html as html_lib
import io
import re
from pathlib import Path

import pytest

from editscope.metrics.registry import MetricSpec
from editscope.report import writers
from editscope.report.build import Analysis, Run
from editscope.report.document import IN_PROGRESS_NOTE, NOTE, Figure, ReportDocument, Section, build_document
from editscope.run.summary import SummaryRow
from editscope.tables import Table

ES = MetricSpec("ES", "paper", "eq. 1", True, paper_scale=100)
METHODS = ["rome", "memit"]


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    return buf.getvalue()


def _row(dataset: str, suite: str, method: str, metric: str, mean: float) -> SummaryRow:
    return SummaryRow(dataset, suite, method, metric, 10, mean, mean - 0.05, mean + 0.05, 0.1)


def _analysis() -> Analysis:
    """Two methods: one suite with final rows (compact table, all metrics, bars, a protocol note), one sequential
    block with checkpoints alone (still in progress: its curve), one case study, one listed model missing."""
    summary = [_row("cf", "alpha", m, col, v) for m, v in (("rome", 0.9), ("memit", 0.7))
               for col in ("ES_pre", "ES_post")]
    curves = {("cf2", "beta"): {edits: [_row("cf2", "beta", m, "ES_post", 0.9 - edits / 100) for m in METHODS]
                                for edits in (3, 6)}}
    png = _png()
    figs = [Figure("bars-cf-alpha", "alpha on cf", "bars caption", png),
            Figure("curve-cf2-beta", "beta on cf2 vs number of edits", "curve caption", png),
            Figure("peak-cf-1", "PEAK of case 1", "a case study", png)]
    meta = {"config": {"mode": "single"}, "model": {"name": "tiny", "fingerprint": "abc"}, "planned_rows": 4,
            "status": "complete"}
    return Analysis([Run(Path("runs/a"), meta, [])], METHODS, [], {("cf", "alpha"): (ES,), ("cf2", "beta"): (ES,)},
                    summary, None, {("cf", "alpha"): ["A protocol note."]}, curves, figs,
                    missing=["model 'other': no rows yet"])


@pytest.fixture
def doc() -> ReportDocument:
    return build_document(_analysis(), {("cf", "1", "rome"): "cards/1-rome.html"})


def test_the_document_holds_what_the_report_shows(doc):
    assert doc.note == NOTE and doc.missing == ["model 'other': no rows yet"] and doc.pivot is None
    assert [s.title for s in doc.sections] == ["alpha on cf", "beta on cf2"]
    final, running = doc.sections
    assert final.compact is not None and final.compact.bold  # the best method per column bold
    assert final.metrics is not None and final.notes == ["A protocol note."]
    assert [f.slug for f in final.figures] == ["bars-cf-alpha"] and final.curve is None
    assert running.compact is None and running.metrics is None and running.figures == []
    assert running.notes == [IN_PROGRESS_NOTE]
    assert running.curve is not None and [f.slug for f in running.curve.figures] == ["curve-cf2-beta"]
    assert [f.slug for f in doc.case_studies] == ["peak-cf-1"]
    assert doc.cards == {("cf", "1", "rome"): "cards/1-rome.html"}


def _html_headings(page: str, level: int) -> list[str]:
    return [html_lib.unescape(t) for t in re.findall(rf"<h{level}[^>]*>(.*?)</h{level}>", page)]


def test_each_writer_renders_every_section(doc):
    """An independent count: the sections of the document against the headings of each text."""
    titles = [s.title for s in doc.sections]
    md = writers.markdown(doc)
    md_sections = [line[3:] for line in md.split("\n") if line.startswith("## ") and " on " in line]
    assert md_sections == titles
    page = writers.html(doc)
    assert [t for t in _html_headings(page, 2) if " on " in t] == titles
    assert [s.curve.title for s in doc.sections if s.curve] == [t for t in _html_headings(page, 3)
                                                                 if t.endswith("number of edits")]
    tex = writers.latex(doc)  # the compact tables alone
    assert [line[2:] for line in tex.split("\n") if line.startswith("% ") and " on " in line] == [
        s.title for s in doc.sections if s.compact is not None]
    for text in (md, html_lib.unescape(page)):
        assert "Case studies" in text and "PEAK of case 1" in text and "Edit cards" in text
        assert IN_PROGRESS_NOTE in text


def test_bold_only_where_the_format_shows_it(doc):
    """Markdown prints the compact table as summary.md does (no bold); the page and the LaTeX bold the best and the
    page says so under the table; the missing model is named in Markdown and on the page."""
    md, page, tex = writers.markdown(doc), html_lib.unescape(writers.html(doc)), writers.latex(doc)
    assert "**" not in md.split("## alpha on cf")[1].split("All metrics:")[0]
    assert "<strong>" in page and writers.BOLD_NOTE in page and writers.BOLD_NOTE not in md
    assert r"\textbf" in tex and "alpha on cf." in tex
    assert "*Not in this report: model 'other': no rows yet.*" in md
    assert "<em>Not in this report: model 'other': no rows yet.</em>" in page
    assert "![alpha on cf](figures/bars-cf-alpha.png)" in md and "data:image/png;base64," in page


def test_writers_need_the_document_alone():
    """A document made by hand (no Analysis): a section without tables or figures still gets its heading."""
    doc = ReportDocument("a report", [[("run", "x")]], [{"mode": "single"}], "the note",
                         gaps=Table(["method", "Δ"], [["rome", "+1"]], caption="Gaps"),
                         sections=[Section("s on d", None, None, ["only a note"], [])])
    md, page, tex = writers.markdown(doc), writers.html(doc), writers.latex(doc)
    assert md.startswith("# a report\n\n- **run**: x\n") and "## Gaps" in md and "## s on d" in md
    assert _html_headings(page, 2) == ["Gaps", "s on d"] and "only a note" in page
    assert "% Gaps" in tex and "s on d" not in tex
