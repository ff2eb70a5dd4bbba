"""One table model for every table editscope writes: a :class:`Table` (headers, rows of cells, the cells to bold,
notes, a caption, column alignment, column groups) and its writers: Markdown (pipe tables), LaTeX (a booktabs
``table``, every piece of text escaped in one place, :func:`latex_escape`) and aligned plain text for a terminal.
The HTML pages render the same objects with a Jinja2 macro (``editscope/report/templates/_tables.html``).

Standard library only: any package may build and write a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

Cell = str | int | float
"""A table cell: text, or a number written with ``str``."""

LATEX_SYMBOLS = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
    "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "↑": r"$\uparrow$", "↓": r"$\downarrow$",
    "±": r"$\pm$", "×": r"$\times$", "†": r"$^\dagger$", "−": r"$-$", "–": "--", "Δ": r"$\Delta$", "…": r"\dots{}",
    "σ": r"$\sigma$", "≥": r"$\geq$", "≤": r"$\leq$",
}
"""Characters LaTeX treats specially, and the symbols editscope's tables print, with what stands for them."""

_MARKDOWN_RULE = {"l": "---", "r": "---:", "c": ":---:"}


def latex_escape(text: str) -> str:
    """``text`` as LaTeX source that prints it (one pass: a replacement is never escaped again)."""
    return "".join(LATEX_SYMBOLS.get(ch, ch) for ch in text)


def markdown_escape(text: str) -> str:
    """``text`` as the content of a Markdown table cell: ``|`` escaped, line breaks as spaces."""
    return text.replace("|", r"\|").replace("\n", " ")


@dataclass(frozen=True)
class Table:
    """A table: ``headers``, one list of cells per row, and how to show them.

    ``bold``: (row, column) indices into ``rows`` of the cells to bold (an empty cell stays plain). ``sub``: a
    cell's secondary text (e.g. a difference against a baseline): under the main text in HTML, after it in
    parentheses in Markdown, LaTeX and plain text. ``notes``: sentences printed under the table (in LaTeX, after the
    caption). ``caption``: the LaTeX caption and the plain-text title (a Markdown page has a heading instead).
    ``align``: one of ``l``/``r``/``c`` per column; empty for the first column left and the rest right. ``groups``:
    (label, columns spanned) over the columns after the first: a spanning header row in LaTeX and HTML, ``label:
    header`` in Markdown and plain text. ``rules``: rows preceded by a rule (LaTeX ``\\midrule``)."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Cell]]
    bold: Set[tuple[int, int]] = frozenset()
    notes: Sequence[str] = ()
    caption: str = ""
    align: str = ""
    groups: Sequence[tuple[str, int]] = ()
    sub: Mapping[tuple[int, int], str] = field(default_factory=dict)
    rules: Set[int] = frozenset()

    def __post_init__(self) -> None:
        width = len(self.headers)
        for i, row in enumerate(self.rows):
            if len(row) != width:
                raise ValueError(f"table row {i} has {len(row)} cells, the headers {width}")
        if self.align and (len(self.align) != width or set(self.align) - set(_MARKDOWN_RULE)):
            raise ValueError(f"table align {self.align!r}: expected one of l/r/c per column ({width})")
        if self.groups and sum(span for _, span in self.groups) != width - 1:
            raise ValueError("table groups must span every column after the first")

    @property
    def alignment(self) -> str:
        """One of ``l``/``r``/``c`` per column (:attr:`align`, or first left and the rest right)."""
        return self.align or "l" + "r" * (len(self.headers) - 1)

    def text(self, i: int, j: int) -> str:
        """The text of cell (``i``, ``j``)."""
        return str(self.rows[i][j])

    def flat_headers(self) -> list[str]:
        """The headers with each group's label before its columns' (``group: header``), for writers without a
        spanning header row."""
        if not self.groups:
            return list(self.headers)
        labels = [label for label, span in self.groups for _ in range(span)]
        return [self.headers[0]] + [f"{g}: {h}" for g, h in zip(labels, self.headers[1:], strict=True)]

    def _cell(self, i: int, j: int, bold: str, escape) -> str:
        text = escape(self.text(i, j))
        if text and (i, j) in self.bold:
            text = bold.format(text)
        return text + (f" ({escape(self.sub[(i, j)])})" if (i, j) in self.sub else "")

    def markdown(self) -> str:
        """A pipe table (bold ``**x**``), then a blank line and each note in italics (``*note*`` with a hard line
        break) when there are notes."""
        lines = ["| " + " | ".join(markdown_escape(h) for h in self.flat_headers()) + " |",
                 "|" + "".join(_MARKDOWN_RULE[a] + "|" for a in self.alignment)]
        lines += ["| " + " | ".join(self._cell(i, j, "**{}**", markdown_escape) for j in range(len(row))) + " |"
                  for i, row in enumerate(self.rows)]
        if self.notes:
            lines += [""] + [f"*{n}*  " for n in self.notes]
        return "\n".join(lines)

    def latex(self, *, size: str = r"\small", colsep: str | None = None) -> str:
        """A ``table`` holding a booktabs ``tabular`` (``\\usepackage{booktabs}``); bold is ``\\textbf``; the caption
        is :attr:`caption` followed by the notes. ``size``: a font size command; ``colsep``: a ``\\tabcolsep`` local
        to the table."""
        lines = [r"\begin{table}[t]", r"\centering", size]
        if colsep is not None:
            lines.append(rf"\setlength{{\tabcolsep}}{{{colsep}}}")
        lines += [r"\begin{tabular}{" + self.alignment + "}", r"\toprule"]
        if self.groups:
            cells, cmidrules, start = [""], [], 2
            for label, span in self.groups:
                cells.append(rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(label)}}}")
                cmidrules.append(rf"\cmidrule(lr){{{start}-{start + span - 1}}}")
                start += span
            lines += [" & ".join(cells) + r" \\", " ".join(cmidrules)]
        lines += [" & ".join(latex_escape(h) for h in self.headers) + r" \\", r"\midrule"]
        for i, row in enumerate(self.rows):
            if i in self.rules:
                lines.append(r"\midrule")
            lines.append(" & ".join(self._cell(i, j, r"\textbf{{{}}}", latex_escape) for j in range(len(row)))
                         + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}"]
        caption = " ".join(t for t in (self.caption, *self.notes) if t)
        if caption:
            lines.append(rf"\caption{{{latex_escape(caption)}}}")
        lines.append(r"\end{table}")
        return "\n".join(lines)

    def plain(self) -> str:
        """Aligned plain text for a terminal: the caption, the header line and one line per row (columns two
        spaces apart, aligned as :attr:`alignment`; no bold), then the notes."""
        grid = [self.flat_headers()] + [[self._cell(i, j, "{}", str) for j in range(len(row))]
                                        for i, row in enumerate(self.rows)]
        widths = [max(len(r[j]) for r in grid) for j in range(len(self.headers))]
        pad = {"l": str.ljust, "r": str.rjust, "c": str.center}
        lines = [self.caption] if self.caption else []
        lines += ["  ".join(pad[a](c, w) for a, c, w in zip(self.alignment, r, widths, strict=True)).rstrip()
                  for r in grid]
        return "\n".join(lines + list(self.notes))
