"""The Table model's writers against hand-written Markdown, LaTeX and plain text (pure: no model)."""

from __future__ import annotations

import pytest

from editscope.tables import Table, latex_escape, markdown_escape

SMALL = Table(["method", "n", "ES ↑ (%)"], [["unedited", 6, "16.7"], ["rome", 6, "66.7 ± 1.5"]], bold={(1, 2)},
              notes=["Anecdotal: few cases."], caption="counterfact on counterfact.")


def test_markdown():
    assert SMALL.markdown() == (
        "| method | n | ES ↑ (%) |\n"
        "|---|---:|---:|\n"
        "| unedited | 6 | 16.7 |\n"
        "| rome | 6 | **66.7 ± 1.5** |\n"
        "\n"
        "*Anecdotal: few cases.*  ")


def test_markdown_alignment_groups_sub_and_escaping():
    table = Table(["method", "ES", "PS"], [["a|b", "1.0", ""], ["c", "2.0", "3.0"]], align="lcl",
                  groups=[("counterfact", 2)], bold={(0, 1), (0, 2)}, sub={(1, 1): "Δ +1.0†"})
    assert table.markdown() == (
        "| method | counterfact: ES | counterfact: PS |\n"
        "|---|:---:|---|\n"
        "| a\\|b | **1.0** |  |\n"  # an empty cell is never bold
        "| c | 2.0 (Δ +1.0†) | 3.0 |")
    assert markdown_escape("x|y\nz") == "x\\|y z"


def test_latex():
    assert SMALL.latex() == "\n".join([
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{lrr}",
        r"\toprule",
        r"method & n & ES $\uparrow$ (\%) \\",
        r"\midrule",
        r"unedited & 6 & 16.7 \\",
        r"rome & 6 & \textbf{66.7 $\pm$ 1.5} \\",
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{counterfact on counterfact. Anecdotal: few cases.}",
        r"\end{table}"])


def test_latex_groups_rules_size_and_colsep():
    table = Table(["method", "ES", "PS", "NKL"], [["rome_v2", "1", "2", "3"], ["Δ", "+1", "", "−0.5"]],
                  groups=[("cf & co", 2), ("peak", 1)], rules={1}, bold={(0, 3)})
    assert table.latex(size=r"\footnotesize", colsep="3pt") == "\n".join([
        r"\begin{table}[t]",
        r"\centering",
        r"\footnotesize",
        r"\setlength{\tabcolsep}{3pt}",
        r"\begin{tabular}{lrrr}",
        r"\toprule",
        r" & \multicolumn{2}{c}{cf \& co} & \multicolumn{1}{c}{peak} \\",
        r"\cmidrule(lr){2-3} \cmidrule(lr){4-4}",
        r"method & ES & PS & NKL \\",
        r"\midrule",
        r"rome\_v2 & 1 & 2 & \textbf{3} \\",
        r"\midrule",
        r"$\Delta$ & +1 &  & $-$0.5 \\",
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}"])


def test_latex_escape_every_special_character_once():
    assert latex_escape("rome_v2 & 50% #1 {x} ~^\\ $") == (r"rome\_v2 \& 50\% \#1 \{x\} \textasciitilde{}"
                                                           r"\textasciicircum{}\textbackslash{} \$")
    assert latex_escape("ES ↑ 97.3 ± 1.8† – ×1.07 σ≥…") == (r"ES $\uparrow$ 97.3 $\pm$ 1.8$^\dagger$ -- "
                                                           r"$\times$1.07 $\sigma$$\geq$\dots{}")


def test_plain_text():
    assert SMALL.plain() == (
        "counterfact on counterfact.\n"
        "method    n    ES ↑ (%)\n"
        "unedited  6        16.7\n"
        "rome      6  66.7 ± 1.5\n"
        "Anecdotal: few cases.")
    assert Table(["a", "b"], [["x", "yy"]], align="cl").plain() == "a  b\nx  yy"


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="row 0 has 1 cells, the headers 2"):
        Table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align"):
        Table(["a", "b"], [], align="lx")
    with pytest.raises(ValueError, match="groups"):
        Table(["a", "b", "c"], [], groups=[("g", 1)])
