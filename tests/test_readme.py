"""The README's commands are commands editscope has: every ``editscope COMMAND`` in its code blocks (and in the
docs' code blocks) is a registered subcommand whose ``--help`` succeeds, and every docs page the README links to
exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from editscope.cli import COMMANDS, main
from editscope.report.findings import slug

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```([a-z]*)\n(.*?)```", re.S)
_SHELL = {"", "bash", "sh", "shell", "console"}
_COMMAND = re.compile(r"(?:^|[\s$(;&|])editscope\s+([a-z][a-z-]*)")


def commands(page: Path) -> set[str]:
    found = set()
    for language, block in _BLOCK.findall(page.read_text()):
        if language not in _SHELL:
            continue
        for line in block.splitlines():
            if line.lstrip().startswith("#"):
                continue
            found |= set(_COMMAND.findall(line))
    return found


def test_the_readme_shows_commands():
    assert {"demo", "edit", "run", "report"} <= commands(ROOT / "README.md")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_in_a_code_block_exists_and_has_help(page, capsys):
    for command in sorted(commands(page)):
        assert command in COMMANDS, f"{page.name}: 'editscope {command}' is no editscope command"
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0, f"{page.name}: editscope {command} --help failed"
    capsys.readouterr()


def test_docs_the_readme_links_exist():
    text = (ROOT / "README.md").read_text()
    links = set(re.findall(r"\]\(((?:docs|src|benchmarks|examples)/[^)#\s]+)", text))
    links |= set(re.findall(r"`(docs/[a-z_./-]+\.md)`", text))
    assert links, "the README links no docs page"
    missing = [link for link in sorted(links) if not (ROOT / link).exists()]
    assert missing == []


def test_every_findings_line_links_to_an_existing_block():
    """The README's findings table: each line links to a heading of a docs page that exists."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## What it found", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| finding")]
    assert len(rows) >= 6
    for row in rows:
        links = re.findall(r"\]\((docs/[^)#]+)#([^)]+)\)", row)
        assert links, f"a findings line without a link to its block: {row[:80]}"
        for page, anchor in links:
            headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{page}#{anchor}: no such heading"


def test_every_picture_the_readme_shows_is_there():
    """The README's images (the report screenshot, ``python -m tests.browser``) exist and are PNGs a browser draws at
    the report's 1,400 px."""
    from PIL import Image

    readme = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", readme)
    assert pictures
    for path in pictures:
        with Image.open(ROOT / path) as im:
            assert im.format == "PNG" and im.size[0] == 1400, path
