"""tables.tex and the figures' axis labels of a report on a small real run (tiny model, two editors): the LaTeX
parses (balanced braces, one cell count per tabular), holds the summary's values with the best bold; every figure
names its axes, with units, and PPL is drawn on a log axis."""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser

import pytest

from editscope.report.build import TABLES_TEX


def tabulars(tex: str) -> list[tuple[int, list[list[str]]]]:
    """(columns declared in the column spec, cell rows) of every tabular; rows split on unescaped & and \\\\."""
    out = []
    for spec, body in re.findall(r"\\begin\{tabular\}\{([a-z]+)\}(.*?)\\end\{tabular\}", tex, flags=re.S):
        rows = []
        for line in body.splitlines():
            line = line.strip()
            if not line.endswith(r"\\"):
                continue  # \toprule, \midrule, \cmidrule
            cells = re.split(r"(?<!\\)&", line[:-2])
            span = sum(int(n) - 1 for n in re.findall(r"\\multicolumn\{(\d+)\}", line))
            rows.append([c.strip() for c in cells] + [""] * span)
        out.append((len(spec), rows))
    return out


def balanced(tex: str) -> bool:
    depth = 0
    for i, ch in enumerate(tex):
        if ch in "{}" and (i == 0 or tex[i - 1] != "\\"):
            depth += 1 if ch == "{" else -1
            if depth < 0:
                return False
    return depth == 0


def test_tables_tex_parses_and_holds_the_summary(two_method_run):
    run, report = two_method_run
    tex = (report / TABLES_TEX).read_text()
    assert balanced(tex)
    assert tex.count(r"\begin{table}") == tex.count(r"\end{table}") >= 3  # pivot (2 parts) + compact tables
    tables = tabulars(tex)
    for width, rows in tables:
        assert rows and all(len(r) == width for r in rows), rows
    rows = list(csv.DictReader((run / "summary.csv").open()))

    def mean(method, metric, suite="counterfact"):
        return float(next(r["mean"] for r in rows if (r["suite"], r["method"], r["metric"]) == (suite, method, metric)))

    compact = next(rows for _, rows in tables if rows[0][:2] == ["method", "n"] and r"ES $\uparrow$ (\%)" in rows[0])
    col = compact[0].index(r"ES $\uparrow$ (\%)")
    cell = {r[0]: r[col] for r in compact[1:]}
    es = {m: mean(m, "ES_post") for m in ("rome", "memit")}
    for m in es:
        assert re.sub(r"\\textbf\{(.*)\}", r"\1", cell[m]).startswith(f"{100 * es[m]:.1f} ")
    assert cell["unedited"].startswith(f"{100 * mean('rome', 'ES_pre'):.1f} ")
    best = max(es, key=es.get)
    if es["rome"] != es["memit"]:  # the best method bold, the other not
        assert cell[best].startswith(r"\textbf{") and not cell[min(es, key=es.get)].startswith(r"\textbf{")
    # the pivot: a Δ row under each method, the difference against the unedited model's ES
    pivot = next(rows for _, rows in tables
                 if rows[1][0] == "method" and any(r[0].startswith("$\\Delta$") for r in rows))
    col = pivot[1].index(r"ES $\uparrow$ (\%)")
    labels = [r[0] for r in pivot]
    delta = pivot[labels.index("rome") + 1]
    assert delta[0] == r"$\Delta$"
    want = 100 * (mean("rome", "ES_post") - mean("rome", "ES_pre"))
    assert float(delta[col].split()[0].replace("$-$", "-")) == pytest.approx(want, abs=0.051)
    source = "\n".join(line for line in tex.splitlines() if not line.startswith("%"))  # comments may hold anything
    assert "one\\_to\\_n" in source and not re.search(r"(?<!\\)_", source), "an unescaped _ in tables.tex"


def test_latex_escape_round_trip_of_special_characters():
    from editscope.tables import Table, latex_escape

    assert latex_escape("rome_v2 & 50% #1 {x} ~^\\") == (r"rome\_v2 \& 50\% \#1 \{x\} \textasciitilde{}"
                                                           r"\textasciicircum{}\textbackslash{}")
    assert latex_escape("ES ↑ 97.3 ± 1.8†") == r"ES $\uparrow$ 97.3 $\pm$ 1.8$^\dagger$"
    tex = Table(["method", "a_b"], [["x&y", "1"]], bold={(0, 1)}, groups=[("g", 1)]).latex()
    assert balanced(tex) and r"x\&y & \textbf{1} \\" in tex and r"\cmidrule(lr){2-2}" in tex


class Figures(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.axes: list[tuple[str, list[dict]]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            a = dict(attrs)
            self.axes.append((a["alt"], json.loads(a["data-axes"])))


def test_every_figure_names_its_axes_with_units_and_ppl_is_log(two_method_run):
    _, report = two_method_run
    parser = Figures()
    parser.feed((report / "report.html").read_text())
    assert len(parser.axes) == 5  # bars of 3 (dataset, suite) tables, the 1-to-N case, the PEAK shift
    ppl_panels = 0
    for alt, axes in parser.axes:
        assert axes, alt
        for panel in axes:
            assert panel["y"], (alt, panel)  # every panel: a y label (inherited from a shared axis counts)
            assert panel["x"] or panel["xticks"] or panel["colorbar"], (alt, panel)
            if "ppl" in panel["y"] or "PPL" in panel["y"]:
                ppl_panels += 1
                assert panel["yscale"] == "log" and "log scale" in panel["y"], panel
            assert panel["y"] in alt or panel["colorbar"]
    assert ppl_panels >= 1


def test_curve_and_heatmap_panels_name_their_axes_with_units():
    """The sequential-batches figures (not in the small run): hand-made summary rows, axes read back from the PNG."""
    import math

    from editscope.metrics.registry import MetricSpec
    from editscope.plotting import png_axes
    from editscope.report import figures
    from editscope.run.summary import SummaryRow

    es = MetricSpec("ES", "002", "eq 24", True, paper_scale=100)
    ppl = MetricSpec("PPL", "000", "2.2 (3)", False, (1.0, math.inf), "ppl")

    def row(metric, mean):
        return SummaryRow("d", "s", "m", metric, 10, mean, mean * 0.9, mean * 1.1, math.nan)

    points = {e: [row("ES_post", 0.9), row("ES_pre", 0.3), row("PPL_post", 40.0 + e / 10), row("PPL_pre", 40.0)]
              for e in (100, 200, 300)}
    axes = png_axes(figures.edit_curves(points, ["m"], "t", [es, ppl]))
    assert [a["y"] for a in axes] == ["ES (%)", "PPL (ppl), log scale"]
    assert [a["yscale"] for a in axes] == ["linear", "log"] and all(a["x"] == "edits on the model" for a in axes)
    assert axes[0]["xticks"] == ["100", "200", "300"]  # ticks at the checkpoints
    heat = png_axes(figures.retention_heatmap({"m": {(100, 100): 0.9, (100, 200): 0.8, (200, 200): 0.95}}, es, "t"))
    assert heat[0]["y"] and heat[0]["x"] and heat[-1]["colorbar"] and heat[-1]["y"] == "ES (%)"


def test_cli_baseline_is_printed_and_a_wrong_one_exits_2(two_method_run, tmp_path, capsys):
    from editscope.cli import main

    run, _ = two_method_run
    assert main(["report", str(run), "--out", str(tmp_path / "r"), "--baseline", "memit"]) == 0
    out = capsys.readouterr().out
    assert "baseline of the paired differences: memit" in out and (tmp_path / "r" / TABLES_TEX).is_file()
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Baseline of the differences: memit." in md and "(Δ " in md.split("| rome |", 1)[1].splitlines()[0]
    assert "(Δ " not in md.split("| memit |", 1)[1].splitlines()[0]  # the baseline has no difference to itself
    assert main(["report", str(run), "--out", str(tmp_path / "x"), "--baseline", "rmoe"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "editscope report: error: --baseline: no method 'rmoe' in these runs; methods: rome, memit"


def test_tables_tex_compiles_with_pdflatex(two_method_run, tmp_path):
    """Where a TeX installation is present (not in CI: texlive-latex-recommended), the tables compile as pasted
    into an article."""
    import shutil
    import subprocess

    pdflatex = shutil.which("pdflatex")
    if pdflatex is None:
        pytest.skip("no pdflatex on PATH (apt-get install texlive-latex-base texlive-latex-recommended)")
    _, report = two_method_run
    shutil.copy(report / TABLES_TEX, tmp_path / TABLES_TEX)
    (tmp_path / "paper.tex").write_text("\\documentclass{article}\n\\usepackage[utf8]{inputenc}\n"
                                        "\\usepackage{booktabs}\n\\begin{document}\n\\input{tables}\n\\end{document}\n")
    done = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 1000
