"""``tables.tex``: the report's compact tables and pivot as booktabs tabulars a researcher pastes into a paper
(``\\usepackage{booktabs}``; every cell's text is escaped, the report's symbols become math: ↑ ``$\\uparrow$``,
± ``$\\pm$``, † ``$^\\dagger$``). The best method per column is ``\\textbf``; each method's paired difference
against the baseline is the row below it."""

from __future__ import annotations

from collections.abc import Sequence, Set

from editscope.report.pivot import Pivot

SYMBOLS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
    "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "↑": r"$\uparrow$", "↓": r"$\downarrow$",
    "±": r"$\pm$", "×": r"$\times$", "†": r"$^\dagger$", "−": r"$-$", "–": "--", "Δ": r"$\Delta$", "…": r"\dots{}",
    "σ": r"$\sigma$", "≥": r"$\geq$", "≤": r"$\leq$",
}
"""Characters LaTeX treats specially, and the report's symbols, with what stands for them in a tabular."""


def escape(text: str) -> str:
    """``text`` as LaTeX source that prints it (one pass: a replacement is never escaped again)."""
    return "".join(SYMBOLS.get(ch, ch) for ch in text)


def tabular(headers: Sequence[str], body: Sequence[Sequence[str]], *, bold: Set[tuple[int, int]] = frozenset(),
            caption: str = "", groups: Sequence[tuple[str, int]] = (), midrules: Set[int] = frozenset(),
            size: str = r"\small", colsep: str | None = None) -> str:
    """A ``table`` with a booktabs ``tabular``: first column left, the rest right; ``bold`` = (row, column)
    indices into ``body``; ``groups`` = (label, columns spanned) over the data columns (after the first column),
    drawn as a ``\\multicolumn`` header row with ``\\cmidrule``s; ``midrules``: body row indices preceded by a
    ``\\midrule``; ``size`` a font size command, ``colsep`` a ``\\tabcolsep`` (local to the table)."""
    width = len(headers)
    lines = [r"\begin{table}[t]", r"\centering", size]
    if colsep is not None:
        lines.append(rf"\setlength{{\tabcolsep}}{{{colsep}}}")
    lines += [r"\begin{tabular}{l" + "r" * (width - 1) + "}", r"\toprule"]
    if groups:
        cells, rules, start = [""], [], 2
        for label, span in groups:
            cells.append(rf"\multicolumn{{{span}}}{{c}}{{{escape(label)}}}")
            rules.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
            start += span
        lines += [" & ".join(cells) + r" \\", " ".join(rules)]
    lines += [" & ".join(escape(h) for h in headers) + r" \\", r"\midrule"]
    for i, row in enumerate(body):
        if i in midrules:
            lines.append(r"\midrule")
        cells = [rf"\textbf{{{escape(c)}}}" if (i, j) in bold and c else escape(c) for j, c in enumerate(row)]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(rf"\caption{{{escape(caption)}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines)


LATEX_COLUMNS = 4
"""Metric columns per pivot tabular: four columns of ``mean [lo, hi]`` fit an article's text width (checked with
pdflatex on the SmolLM2 report: no overfull box)."""


def pivot_tabulars(pivot: Pivot) -> list[str]:
    """One ``table`` per column chunk of ``pivot`` (:meth:`Pivot.chunks`): a row per method with its mean (and
    interval), then a ``Δ`` row with its difference against the baseline."""
    out = []
    for chunk in pivot.chunks(LATEX_COLUMNS):
        groups: list[tuple[str, int]] = []
        for j in chunk:
            label = pivot.columns[j].group
            if groups and groups[-1][0] == label:
                groups[-1] = (label, groups[-1][1] + 1)
            else:
                groups.append((label, 1))
        headers = ["method"] + [pivot.columns[j].header for j in chunk]
        body: list[list[str]] = []
        bold: set[tuple[int, int]] = set()
        for row in pivot.rows:
            i = len(body)
            body.append([row] + [pivot.cell_text(row, j) for j in chunk])
            bold |= {(i, k + 1) for k, j in enumerate(chunk) if (row, j) in pivot.best}
            diffs = [pivot.diff_text(row, j) for j in chunk]
            if any(diffs):
                body.append(["Δ"] + diffs)  # against what: the caption says
        # footnotesize, narrow column gaps: a 4-column pivot with intervals fits an article's text width
        caption = f"{', '.join(g for g, _ in groups)}: every method. {pivot.note(chunk)}"
        out.append(tabular(headers, body, bold=bold, groups=groups, caption=caption,
                           size=r"\footnotesize", colsep="3pt"))
    return out
