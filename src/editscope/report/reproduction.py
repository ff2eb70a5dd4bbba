"""The measured blocks of a reproduction page, regenerated from run directories (``editscope report
--reproduction PAGE``).

A page such as ``docs/reproduction.md`` is prose its authors write (the paper's numbers, the readings, the
verdicts) with blocks of measured tables inside it::

    <!-- editscope:measured runs/lifelong-counterfact* baseline=memit -->
    (generated: replaced on every regeneration)
    <!-- editscope:end -->

A block names one or more run directories, relative to the runs root; shell patterns are allowed, so a config run
in shards (one folder per method, one per core) is one block. Options: ``baseline=METHOD`` (the pivot's paired
differences; ``baseline=A,B`` names one per editor) and ``figures=none``. Regenerating replaces the text between
the markers with the report's pivot of every method against every headline metric
(:func:`editscope.report.build.analyse`, the tables of ``editscope report``), the table after each number of edits
of a sequential run, the protocol lines, and the curve and retention figures, written beside the page under
``reproduction/<block>/``. Everything outside the blocks is left byte for byte.

Run directories do not outlive the machine they ran on, so each block keeps an archive of the runs it was made from
under ``reproduction/<block>/runs/<run name>/`` (:func:`editscope.run.archive.archive_run`: run.json and the rows
without raw probes; sealed with a content digest, checked before it is read: :mod:`editscope.integrity`; one without
a digest is refused unless ``--trust-unverified``, and a block made from such an archive says so). A regeneration
reads the runs its patterns match and, for every name none of them has, the
archived one; so a block grows run by run across machines, and a later run of the same name replaces its archive.
A block with neither keeps its text."""

from __future__ import annotations

import glob
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from editscope.atomic import atomic_write_bytes, atomic_write_text
from editscope.errors import EditscopeError
from editscope.integrity import unverified, verify_folder
from editscope.report.build import Analysis, analyse, png_name
from editscope.run.archive import archive_run
from editscope.run.store import MODELS_JSON, has_rows
from editscope.run.summary import break_points
from editscope.run.summary_tables import break_table, curve_markdown, orders_table

START = re.compile(r"^<!-- editscope:measured (?P<args>.+?) -->\s*$")
END = "<!-- editscope:end -->"
OPTIONS = {"baseline", "figures"}
FIGURE_DIR = "reproduction"
"""Folder beside the page that holds each block's figures, one sub-folder per block."""
ARCHIVE_DIR = "runs"
"""Sub-folder of a block's folder that holds the archives of the runs it was made from."""


@dataclass
class Block:
    line: int  # 1-based line of the start marker
    start: int  # index of the start marker's line
    end: int  # index of the end marker's line
    patterns: list[str]
    options: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The block's figure folder: the first pattern's last component, pattern characters dropped."""
        return re.sub(r"[^A-Za-z0-9._-]+", "", Path(self.patterns[0]).name).strip("._-") or f"block-{self.line}"


@dataclass
class Outcome:
    line: int
    patterns: list[str]
    runs: list[Path]  # empty: the block was kept as it was
    archived: list[Path] = field(default_factory=list)  # of ``runs``, those read from the block's archive

    def describe(self, page: Path) -> str:
        where = f"{page}:{self.line}"
        if not self.runs:
            return f"{where}: kept (no run matches {' '.join(self.patterns)})"
        live = [p for p in self.runs if p not in self.archived]
        parts = ([", ".join(str(p) for p in live)] if live else []) + \
            ([f"the archive ({', '.join(p.name for p in self.archived)})"] if self.archived else [])
        return f"{where}: regenerated from {' and '.join(parts)}"


def _block_arguments(args: str, where: str) -> tuple[list[str], dict[str, str]]:
    """The run directory patterns and the KEY=VALUE options of a block's opening line (``where``: ``page:line``)."""
    patterns, options = [], {}
    for word in args.split():
        key, eq, value = word.partition("=")
        if not eq:
            patterns.append(word)
        elif key in OPTIONS and value:
            options[key] = value
        else:
            raise EditscopeError(f"{where}: option {word!r}: expected one of {', '.join(sorted(OPTIONS))} as KEY=VALUE")
    if not patterns:
        raise EditscopeError(f"{where}: a measured block names no run directory")
    if options.get("figures", "curves") not in ("curves", "none"):
        raise EditscopeError(f"{where}: figures={options['figures']}: expected 'curves' or 'none'")
    return patterns, options


def marked_regions(text: str, start: re.Pattern, page: str | Path, what: str) -> list[tuple[int, int, re.Match]]:
    """Each region of ``text`` opened by a line ``start`` matches and closed by an :data:`END` line: (the opening
    line's index, the end line's index, the opening match). A ``page:line`` error names a region opened inside
    another, an end without an opening and an opening without its end (``what`` names the region)."""
    regions, opened = [], None
    for i, line in enumerate(text.split("\n")):
        m = start.match(line)
        if m:
            if opened is not None:
                raise EditscopeError(f"{page}:{i + 1}: a {what} starts inside the one opened at line "
                                     f"{opened[0] + 1} (close it with '{END}')")
            opened = (i, m)
        elif line.strip() == END:
            if opened is None:
                raise EditscopeError(f"{page}:{i + 1}: '{END}' without a {what} before it")
            regions.append((opened[0], i, opened[1]))
            opened = None
    if opened is not None:
        raise EditscopeError(f"{page}:{opened[0] + 1}: {what} has no '{END}' after it")
    return regions


def parse_blocks(text: str, page: str | Path = "page") -> list[Block]:
    """The measured blocks of a page, with a ``page:line`` error for a block without its end, a nested block or
    an unknown option."""
    blocks = []
    for first, last, m in marked_regions(text, START, page, "measured block"):
        patterns, options = _block_arguments(m["args"], f"{page}:{first + 1}")
        blocks.append(Block(first + 1, first, last, patterns, options))
    return blocks


def _run_dirs(patterns: list[str], root: Path) -> list[Path]:
    """The run directories (folders with a run.json, or a ``models`` list's folder) the patterns match that hold
    results (a run just started, with no row yet, is left out)."""
    out: list[Path] = []
    for pattern in patterns:
        full = pattern if Path(pattern).is_absolute() else str(root / pattern)
        for match in sorted(glob.glob(full)):
            path = Path(match)
            if path.is_dir() and path not in out and has_rows(path):
                out.append(path)
    return out


def _archived(folder: Path, live: list[Path]) -> list[Path]:
    """The archived runs of a block (``folder``/runs/*) whose names no run in ``live`` has."""
    names = {p.name for p in live}
    runs = folder / ARCHIVE_DIR
    out = [p for p in sorted(runs.iterdir()) if p.is_dir() and p.name not in names and has_rows(p)] \
        if runs.is_dir() else []
    for p in out:  # a models list's folder: its list of runs (each run's files are checked when its rows are read)
        if (p / MODELS_JSON).is_file():
            verify_folder(p, [MODELS_JSON], what="run archive", hint="delete the folder")
    return out


def render_block(a: Analysis, block: Block, figure_dir: Path, link_prefix: str) -> list[str]:
    """The block's Markdown (and its figures, written under ``figure_dir``)."""
    lines = []
    for run in a.runs:
        m = run.meta
        version = (m.get("versions") or {}).get("editscope", "?")
        lines.append(f"*Run `{run.path.name}`: {m.get('model', {}).get('name')}, {len(run.rows)} rows, status "
                     f"{m.get('status')}, finished {m.get('finished') or '–'}, editscope {version}.*  ")
    lines.append("")
    if a.pivot is not None:
        lines += a.pivot.markdown()
    if a.gaps is not None:
        lines += [f"{a.gaps.caption}:", "", *a.gaps.markdown().split("\n"), ""]
    for (dataset, suite), points in a.curves.items():
        curve = curve_markdown(points, a.methods, a.specs.get((dataset, suite)))
        if curve:
            lines += [f"{suite} on {dataset}, after each number of edits:", "", *curve, ""]
    for (dataset, suite), points in a.orders.items():
        table = orders_table(points, a.specs.get((dataset, suite)))
        if table is not None:
            lines += [f"{suite} on {dataset}, across {points[0].chains}:", "",
                      *table.markdown().split("\n"), ""]
    breaks = break_table(break_points(a.rows)) if a.orders else None
    if breaks is not None:
        lines += ["Where the chains break:", "", *breaks.markdown().split("\n"), ""]
    notes = list(dict.fromkeys(n for ns in a.notes.values() for n in ns))
    notes += [f"Read from an archive without a content digest, unverified (--trust-unverified): {p}"
              for p in unverified() if Path(p).is_relative_to(figure_dir)]
    lines += [f"*{n}*  " for n in notes] + ([""] if notes else [])
    if block.options.get("figures", "curves") == "curves":
        for f in a.figures:
            if f.slug.startswith(("curve-", "retention-", "orders-")):
                name = png_name(f.slug)
                atomic_write_bytes(figure_dir / name, f.png)
                lines += [f"![{f.title}]({link_prefix}/{name})", ""]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def _page_text(page: Path) -> str:
    """The page as text; bytes that are not UTF-8 are one line naming the page, the line and the byte (the page is
    rewritten in place, so it is not read with replacement characters that would then be written back)."""
    data = page.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise EditscopeError(f"{page}: line {line}: not valid UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                             f"{exc.start}); save the page as UTF-8") from None


def regenerate(page: str | Path, root: str | Path = ".", *,
               log: Callable[[str], None] = lambda _m: None) -> list[Outcome]:
    """Rewrite the measured blocks of ``page`` from the runs under ``root``; return what each block did. The page
    is written (atomically) only when a block changed."""
    page, root = Path(page), Path(root)
    if not page.is_file():
        raise EditscopeError(f"{page}: no such page")
    text = _page_text(page)
    blocks = parse_blocks(text, page)
    if not blocks:
        raise EditscopeError(f"{page}: no measured blocks (mark one with '<!-- editscope:measured RUN_DIR -->' "
                             f"... '{END}')")
    lines = text.split("\n")
    out, outcomes, done = [], [], 0
    for block in blocks:
        folder = page.parent / FIGURE_DIR / block.name
        live = _run_dirs(block.patterns, root)
        archived = _archived(folder, live)
        runs = sorted(live + archived, key=lambda p: p.name)  # one order whichever of them are live
        out += lines[done:block.start + 1]
        line = len(out)  # the start marker's line in the new page
        if runs:
            log(f"{page}:{block.line}: {len(live)} run(s) for {' '.join(block.patterns)}, {len(archived)} archived")
            try:
                a = analyse([str(p) for p in runs], baseline=block.options.get("baseline"))
            except EditscopeError as exc:
                raise EditscopeError(f"{page}:{block.line}: {exc}") from exc
            for missing in a.missing:
                log(f"{page}:{block.line}: {missing}; regenerated without it")
            out += render_block(a, block, folder, f"{FIGURE_DIR}/{block.name}")
            for run in live:
                archive_run(run, folder / ARCHIVE_DIR / run.name)
        else:
            out += lines[block.start + 1:block.end]
        done = block.end
        outcomes.append(Outcome(line, block.patterns, runs, archived))
    out += lines[done:]
    new = "\n".join(out)
    if new != text:
        atomic_write_text(page, new)
    return outcomes
