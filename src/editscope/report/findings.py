"""A findings page generated from the verdicts and measured blocks of other pages (``editscope report --findings
PAGE``), so the one page a reader skims cannot drift from the tables the verdicts rest on.

The findings page is prose its authors write (the questions, grouped as they like) with one marker per finding::

    <!-- editscope:finding reproduction.md claim="MEMIT degrades with edits; AlphaEdit resists"
         block=lifelong-counterfact rows=alphaedit,memit columns="counterfact: ES;general on counterfact: PPL" -->
    (generated: replaced on every regeneration)
    <!-- editscope:end -->

(the opening marker is one line). ``SOURCE`` is a page beside the findings page; ``claim`` names a verdict there:
a row of a Markdown table with a ``finding`` and a ``verdict`` column whose finding cell is the claim (``paper=``
picks one of several rows with the same claim), or a bullet that opens with the claim in bold (``- **claim** ...``).
``block`` names a measured block of the source page (:mod:`editscope.report.reproduction`: its first run
pattern's last component); ``rows`` and ``columns`` cut its tables to the methods and metrics the verdict rests on
(a column is named by its header up to the direction arrow, ``;`` between names). Without ``block`` the evidence is
the section the verdict links to (tables transcribed from earlier runs, no measured block).

Each finding is written as: the claim and its verdict, quoted; the heading the block sits under (a link), the runs
it was made from (model, rows, status) and its protocol lines; the cut of its tables. Regeneration reads only page
text: the measured blocks are brought up to date first (``editscope report --reproduction``), this page after."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.report.reproduction import END, marked_regions, parse_blocks

START = re.compile(r"^<!-- editscope:finding (?P<args>.+?) -->\s*$")
OPTIONS = {"claim", "paper", "block", "rows", "columns"}
RUN_LINE = re.compile(r"^\*Run `(?P<name>[^`]+)`: (?P<model>[^,]+), (?P<rows>\d+) rows, status (?P<status>\w+)")
ARROW = re.compile(r"\s*[↑↓].*$")


@dataclass
class Finding:
    line: int  # 1-based line of the opening marker
    start: int  # index of the opening marker's line
    end: int  # index of the end marker's line
    source: str
    options: dict[str, str] = field(default_factory=dict)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens and underscores dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def parse_findings(text: str, page: str | Path = "page") -> list[Finding]:
    """The finding markers of a page, with a ``page:line`` error for a marker without its end, an unknown option
    or one without ``claim``."""
    found = []
    for first, last, m in marked_regions(text, START, page, "finding"):
        where = f"{page}:{first + 1}"
        try:
            words = shlex.split(m["args"])
        except ValueError as exc:
            raise EditscopeError(f"{where}: finding marker: {exc}") from None
        if not words or "=" in words[0]:
            raise EditscopeError(f"{where}: a finding names its source page first")
        options = {}
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if not eq or key not in OPTIONS:
                raise EditscopeError(f"{where}: option {word!r}: expected KEY=VALUE with KEY one of "
                                     f"{', '.join(sorted(OPTIONS))}")
            options[key] = value
        if "claim" not in options:
            raise EditscopeError(f"{where}: a finding needs claim=\"...\" (the verdict it quotes)")
        found.append(Finding(first + 1, first, last, words[0], options))
    return found


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(lines: list[str]) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table in ``lines``: its header cells and its body rows' cells."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            header, body, i = _cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                body.append(_cells(lines[i]))
                i += 1
            out.append((header, body))
        else:
            i += 1
    return out


def verdict(lines: list[str], claim: str, paper: str | None, where: str) -> str:
    """The claim and its verdict as the source page states them (see the module docstring)."""
    hits = []
    for header, body in _tables(lines):
        lower = [h.lower() for h in header]
        if "finding" in lower and "verdict" in lower:
            fi, vi = lower.index("finding"), lower.index("verdict")
            pi = lower.index("paper") if "paper" in lower else None
            for row in body:
                if row[fi] == claim and (paper is None or (pi is not None and row[pi] == paper)):
                    origin = f" ({row[pi]})" if pi is not None else ""
                    hits.append(f"**{claim}**{origin} — {row[vi]}")
    for i, line in enumerate(lines):
        if line.startswith(f"- **{claim}**"):
            text = [line[2:]]
            for more in lines[i + 1:]:
                if not more.startswith("  ") or more.lstrip().startswith("- "):
                    break
                text.append(more.strip())
            hits.append(" ".join(text))
    if len(hits) != 1:
        why = "no" if not hits else f"{len(hits)}"
        raise EditscopeError(f"{where}: {why} verdicts state the claim {claim!r} (a finding/verdict table row or a "
                             f"'- **claim**' bullet){'; name its paper= cell' if hits else ''}")
    return hits[0]


def _heading_above(lines: list[str], index: int) -> str:
    for line in reversed(lines[:index]):
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def _runs_line(block_lines: list[str]) -> str:
    runs = [m for m in map(RUN_LINE.match, block_lines) if m]
    return "; ".join(f"`{m['name']}` ({m['model']}, {m['rows']} rows, {m['status']})" for m in runs)


def _cut(block_lines: list[str], rows: list[str], columns: list[str], where: str) -> list[str]:
    """Of each table of the block that has any of ``columns`` (named by header up to the arrow), those columns, and
    the rows whose first cell is in ``rows`` (all rows when ``rows`` is empty), in the order ``rows`` names them."""
    out, seen = [], set()
    for header, body in _tables(block_lines):
        names = [ARROW.sub("", h) for h in header]
        keep = [i for i, n in enumerate(names) if n in columns and i > 0]
        if not keep:
            continue
        seen.update(names[i] for i in keep)
        picked = [r for r in body if not rows or r[0] in rows]
        missing = set(rows) - {r[0] for r in picked}
        if missing:
            raise EditscopeError(f"{where}: rows {', '.join(sorted(missing))}: not in the table of "
                                 f"{', '.join(names[i] for i in keep)} (it has {', '.join(r[0] for r in body)})")
        if rows:
            picked.sort(key=lambda r: rows.index(r[0]))
        out += ["| " + " | ".join([header[0], *(header[i] for i in keep)]) + " |",
                "|---|" + "---:|" * len(keep),
                *("| " + " | ".join([r[0], *(r[i] for i in keep)]) + " |" for r in picked), ""]
    missing = [c for c in columns if c not in seen]
    if missing:
        raise EditscopeError(f"{where}: columns {'; '.join(missing)}: no table of the block has them")
    return out


def render(finding: Finding, source: Path, where: str) -> list[str]:
    """The generated lines of one finding."""
    if not source.is_file():
        raise EditscopeError(f"{where}: {finding.source}: no such page beside the findings page")
    text = source.read_text(encoding="utf-8")
    lines = text.split("\n")
    opts = finding.options
    out = [verdict(lines, opts["claim"], opts.get("paper"), where), ""]
    name = opts.get("block")
    if name is None:
        return out + [f"Evidence: tables transcribed from earlier runs in [{finding.source}]({finding.source}) "
                      "(no measured block)."]
    blocks = [b for b in parse_blocks(text, source) if b.name == name]
    if not blocks:
        raise EditscopeError(f"{where}: {finding.source} has no measured block {name!r}")
    block = blocks[0]
    body = lines[block.start + 1:block.end]
    heading = _heading_above(lines, block.start)
    protocols = [line.strip().rstrip() for line in body if line.startswith("*Protocol")]
    against = block.options.get("baseline", "the unedited model")
    out.append(f"Evidence: [{heading}]({finding.source}#{slug(heading)}), measured block `{name}`: "
               f"{_runs_line(body) or 'no run'}; Δ against {against} (the block's baseline).  ")
    out += [f"{p}  " for p in protocols] + [""]
    if "columns" in opts:
        rows = [r for r in opts.get("rows", "").split(",") if r]
        out += _cut(body, rows, [c.strip() for c in opts["columns"].split(";")], where)
    while out and out[-1] == "":
        out.pop()
    return out


def generate(page: str | Path) -> tuple[str, str]:
    """The page's text as it is and as it regenerates (each finding's lines from its source page)."""
    page = Path(page)
    if not page.is_file():
        raise EditscopeError(f"{page}: no such page")
    text = page.read_text(encoding="utf-8")
    findings = parse_findings(text, page)
    if not findings:
        raise EditscopeError(f"{page}: no findings (mark one with '<!-- editscope:finding SOURCE claim=\"...\" -->' "
                             f"... '{END}')")
    lines, out, done = text.split("\n"), [], 0
    for f in findings:
        out += lines[done:f.start + 1]
        out += render(f, page.parent / f.source, f"{page}:{f.line}")
        done = f.end
    out += lines[done:]
    return text, "\n".join(out)


def regenerate(page: str | Path) -> int:
    """Rewrite the findings of ``page`` from their source pages; the number of findings. Written (atomically) only
    when something changed."""
    text, new = generate(page)
    if new != text:
        atomic_write_text(Path(page), new)
    return len(parse_findings(new, page))
