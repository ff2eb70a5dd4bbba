"""The findings page: each finding quotes its verdict and cuts its measured block's tables exactly as the source page
states them (a hand-written source page and the lines expected from it), errors name the page and the line, and
docs/findings.md is up to date with its sources and leaves no verdict of them out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.report.findings import generate, regenerate, slug

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

SOURCE = """# Source

## Findings at a glance

| paper | finding | verdict |
|---|---|---|
| 001 | editors write facts | holds (ES 90) |
| 002 | editors write facts | does not hold |
| 003 | neighbours survive | holds inside the noise |

## Verdicts

- **"Context wins"** (someone, 2025): *supported*, mostly
  in generation.
- **Other** claim: not measured.

### Table 9: the run `t9`

<!-- editscope:measured runs/t9 baseline=rome -->
*Run `t9`: smollm2-135m, 100 rows, status complete, finished 2026-12-01, editscope 0.1.0.*<BR>

| method | counterfact: ES ↑ (%) | counterfact: NS ↑ (%) |
|---|---:|---:|
| unedited | 30.0 ± 9.0 | 70.0 ± 9.0 |
| rome | 100.0 ± 0.0 | 64.0 ± 9.0 |
| memit | 98.0 [94.0, 100.0] (Δ −2.0 [−6.0, 2.0]) | 66.0 ± 9.0 (Δ +2.0 [−1.0, 5.0]) |

| method | edits | n | ES |
|---|---:|---:|---:|
| rome | 10 | 5 | 1.00 |

*Protocol: paper — ES/NS of paper 002*<BR>
<!-- editscope:end -->
""".replace("<BR>", "  ")  # Markdown's line break: two trailing spaces

MARKER = ('<!-- editscope:finding source.md claim="editors write facts" paper=002 block=t9 rows=memit,unedited '
          'columns="counterfact: NS" -->')
EVIDENCE = ("Evidence: [Table 9: the run `t9`](source.md#table-9-the-run-t9), measured block `t9`: `t9` (smollm2-135m, "
            "100 rows, complete); Δ against rome (the block's baseline).")

PAGE = """# Findings

## Q

<MARKER>
old text
<!-- editscope:end -->

<!-- editscope:finding source.md claim='"Context wins"' -->
<!-- editscope:end -->
""".replace("<MARKER>", MARKER)

EXPECTED = """# Findings

## Q

<MARKER>
**editors write facts** (002) — does not hold

<EVIDENCE><BR>
*Protocol: paper — ES/NS of paper 002*<BR>

| method | counterfact: NS ↑ (%) |
|---|---:|
| memit | 66.0 ± 9.0 (Δ +2.0 [−1.0, 5.0]) |
| unedited | 70.0 ± 9.0 |
<!-- editscope:end -->

<!-- editscope:finding source.md claim='"Context wins"' -->
**"Context wins"** (someone, 2025): *supported*, mostly in generation.

Evidence: tables transcribed from earlier runs in [source.md](source.md) (no measured block).
<!-- editscope:end -->
""".replace("<BR>", "  ").replace("<MARKER>", MARKER).replace("<EVIDENCE>", EVIDENCE)


def _pages(tmp_path: Path, page: str = PAGE) -> Path:
    (tmp_path / "source.md").write_text(SOURCE)
    (tmp_path / "findings.md").write_text(page)
    return tmp_path / "findings.md"


def test_a_finding_quotes_its_verdict_and_cuts_its_block(tmp_path):
    page = _pages(tmp_path)
    assert regenerate(page) == 2
    assert page.read_text() == EXPECTED
    assert regenerate(page) == 2 and page.read_text() == EXPECTED  # a second pass changes nothing


@pytest.mark.parametrize("marker, message", [
    ('claim="nobody says this"', "no verdicts state the claim 'nobody says this'"),
    ('claim="editors write facts"', "2 verdicts state the claim 'editors write facts'"),
    ('claim="neighbours survive" block=t8', "source.md has no measured block 't8'"),
    ('claim="neighbours survive" block=t9 rows=alphaedit columns="counterfact: ES"', "rows alphaedit: not in"),
    ('claim="neighbours survive" block=t9 columns="counterfact: PS"', "columns counterfact: PS: no table"),
    ('claim="neighbours survive" colour=red', "option 'colour=red'"),
    ('block=t9', "a finding needs claim="),
])
def test_a_bad_marker_is_one_line_naming_the_page_and_its_line(tmp_path, marker, message):
    page = _pages(tmp_path, f"# F\n\n<!-- editscope:finding source.md {marker} -->\n<!-- editscope:end -->\n")
    with pytest.raises(EditscopeError, match=re.escape(message)) as err:
        regenerate(page)
    assert str(err.value).startswith(f"{page}:3: ") and "\n" not in str(err.value)


def test_an_unclosed_marker_and_a_missing_source_are_refused(tmp_path):
    page = _pages(tmp_path, '<!-- editscope:finding source.md claim="x" -->\n')
    with pytest.raises(EditscopeError, match=r"findings.md:1: finding has no '<!-- editscope:end -->'"):
        regenerate(page)
    page.write_text('<!-- editscope:finding gone.md claim="x" -->\n<!-- editscope:end -->\n')
    with pytest.raises(EditscopeError, match="gone.md: no such page"):
        regenerate(page)


def test_the_command_rewrites_the_page(tmp_path, capsys):
    page = _pages(tmp_path)
    assert main(["report", "--findings", str(page)]) == 0
    assert page.read_text() == EXPECTED and "2 findings regenerated" in capsys.readouterr().out
    assert main(["report", "--findings", str(tmp_path / "none.md")]) == 2
    assert "none.md: no such page" in capsys.readouterr().err


def test_slug_is_githubs_anchor():
    assert slug("Table 1: editors on CounterFact / zsRE / EVK-Bench: `evk-table1`") == \
        "table-1-editors-on-counterfact--zsre--evk-bench-evk-table1"
    assert slug("5,000 edits, 3 orders") == "5000-edits-3-orders"


def _glance_claims(page: Path) -> list[str]:
    """The finding cells of a page's finding/verdict tables."""
    claims, columns = [], None
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            columns = None
        elif columns is None and "finding" in cells and "verdict" in cells:
            columns = cells.index("finding")
        elif columns is not None and not set(line) <= set("|-: "):
            claims.append(cells[columns])
    return claims


def test_docs_findings_is_up_to_date_and_leaves_no_verdict_out():
    page = DOCS / "findings.md"
    text, new = generate(page)
    assert new == text, "docs/findings.md differs from its sources: run editscope report --findings docs/findings.md"
    quoted = set(re.findall(r'claim=(?:"([^"]+)"|\'([^\']+)\')', text))
    quoted = {a or b for a, b in quoted}
    for source in ("reproduction.md", "scale.md", "orders.md", "second-model.md"):
        claims = _glance_claims(DOCS / source)
        assert claims, source
        assert not set(claims) - quoted, f"{source}: verdicts missing from docs/findings.md"
    verdicts = (DOCS / "beyond-weights.md").read_text().split("\n## Verdicts", 1)[1].split("\n## ", 1)[0]
    bullets = re.findall(r"^- \*\*(.+?)\*\*", verdicts, re.M)
    assert len(bullets) >= 4 and not set(bullets) - quoted
