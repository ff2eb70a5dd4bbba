"""``editscope report --reproduction PAGE``: the measured blocks of a page are rewritten from the runs they name (a
lifelong config run in two shards, one folder per method, matched by one pattern), the numbers equal a naive
recomputation from the rows, everything outside the blocks is kept byte for byte, a block whose runs are absent
keeps its text, and malformed blocks fail with the page and line."""

from __future__ import annotations

import re
import shutil
from statistics import mean

import pytest

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.report.reproduction import parse_blocks, regenerate
from editscope.run import Runner, parse_config, read_results
from editscope.run.store import run_rows

BATCH, ROUNDS = 3, 2

PAGE = """# Reproduction

Prose the authors wrote, with the paper's numbers: 96.30 | 87.25 | 67.61.

<!-- editscope:measured runs/lifelong-* baseline=memit -->
numbers typed by hand, to be replaced
<!-- editscope:end -->

A reading that stays.

<!-- editscope:measured runs/never-run figures=none -->
| kept | table |
<!-- editscope:end -->
Last line.
"""


def _config(method: str) -> dict:
    return {"model": "tiny-llama", "seed": 0,
            "mode": {"sequential_batches": {"batch": BATCH, "rounds": ROUNDS, "checkpoints": 1}},
            "methods": [{"name": method, "overrides": {"v_steps": 6}}],
            "datasets": [{"dataset": "counterfact", "slice": {"limit": BATCH * ROUNDS}, "suites": ["counterfact"]}]}


@pytest.fixture(scope="module")
def shards(tiny_bundles, tmp_path_factory):
    """A runs root with the lifelong protocol run in two shards (memit, alphaedit), 2 sequential batches of 3."""
    root = tmp_path_factory.mktemp("repro")
    for method in ("memit", "alphaedit"):
        Runner(parse_config(_config(method)), out_dir=root / "runs" / f"lifelong-{method}",
               bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    return root


def _page(root, text=PAGE):
    page = root / "docs" / "reproduction.md"
    page.parent.mkdir(exist_ok=True)
    page.write_text(text)
    return page


def _block(text: str, n: int) -> str:
    return re.findall(r"<!-- editscope:measured [^\n]*-->\n(.*?)<!-- editscope:end -->", text, re.S)[n]


def test_blocks_are_regenerated_from_the_runs_they_name(shards):
    page = _page(shards)
    outcomes = regenerate(page, shards)
    text = page.read_text()
    assert [len(o.runs) for o in outcomes] == [2, 0]
    assert [o.line for o in outcomes] == [text.split("\n").index(line) + 1 for line in text.split("\n")
                                          if line.startswith("<!-- editscope:measured")]

    # outside the blocks, and inside the block whose runs are absent, nothing changed
    outside = re.sub(r"(<!-- editscope:measured runs/lifelong-\* baseline=memit -->\n).*?(<!-- editscope:end -->)",
                     r"\1\2", text, count=1, flags=re.S)
    assert outside == PAGE.replace("numbers typed by hand, to be replaced\n", "")
    generated = _block(text, 0)
    assert "typed by hand" not in generated

    runs = shards / "runs"
    rows = [r for d in ("memit", "alphaedit") for r in read_results(runs / f"lifelong-{d}" / "results.jsonl")]

    def values(metric: str, method: str, edits: int) -> dict[str, float]:
        return {r["case_id"]: r["metrics"]["counterfact"][metric] for r in rows
                if r["method"] == method and r["edits_applied"] == edits}

    # the table after each number of edits: one line per (method, edits), mean over the cases edited so far
    for method in ("memit", "alphaedit"):
        for edits in (BATCH, BATCH * ROUNDS):
            line = next(x for x in generated.split("\n") if x.startswith(f"| {method} | {edits} | "))
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert cells[2] == str(edits)
            for col, metric in enumerate(("ES_post", "PS_post", "NS_post"), 3):
                v = values(metric, method, edits)
                assert len(v) == edits
                assert cells[col].split()[0] == f"{100 * mean(v.values()):.1f}"

    # the pivot: final values per method, and alphaedit's paired differences against the baseline memit
    alpha_line = next(x for x in generated.split("\n") if x.startswith("| alphaedit | ") and "Δ" in x)
    cells = [c.strip() for c in alpha_line.strip("|").split("|")]
    last = BATCH * ROUNDS
    for col, metric in enumerate(("ES_post", "PS_post", "NS_post"), 1):
        a, m = values(metric, "alphaedit", last), values(metric, "memit", last)
        assert cells[col].lstrip("*").startswith(f"{100 * mean(a.values()):.1f}")
        diff = 100 * mean(a[c] - m[c] for c in m)
        assert f"(Δ {diff:+.1f}".replace("-", "−") in cells[col]
    assert "paired difference against memit" in generated

    # figures: written beside the page, linked relative to it
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", generated)
    assert links and all((page.parent / link).is_file() for link in links)
    assert any("retention" in link for link in links) and any("curve-" in link for link in links)

    # regenerating is idempotent
    regenerate(page, shards)
    assert page.read_text() == text


def test_a_run_without_rows_yet_is_left_out(shards):
    started = shards / "runs" / "lifelong-rect"
    started.mkdir()
    (started / "run.json").write_text("{}")
    (started / "results.jsonl").write_text("")
    try:
        page = _page(shards)
        outcomes = regenerate(page, shards)
        assert [p.name for p in outcomes[0].runs] == ["lifelong-alphaedit", "lifelong-memit"]
        assert "lifelong-rect" not in page.read_text()
    finally:
        for f in started.iterdir():
            f.unlink()
        started.rmdir()


def test_the_cli_regenerates_a_page(shards, capsys):
    page = _page(shards)
    assert main(["report", "--reproduction", str(page), "--runs-root", str(shards)]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 measured blocks regenerated; 1 kept" in out
    assert "kept (no run matches runs/never-run)" in out
    assert "| memit | 6 |" in page.read_text()
    assert main(["report", "--reproduction", str(page), str(shards / "runs" / "lifelong-memit")]) == 2
    assert main(["report"]) == 2


@pytest.mark.parametrize("text, message", [
    ("a\n<!-- editscope:measured runs/x -->\nb\n", "page.md:2: measured block has no"),
    ("<!-- editscope:measured runs/x -->\n<!-- editscope:measured runs/y -->\n", "page.md:2: a measured block starts"),
    ("<!-- editscope:end -->\n", "page.md:1: '<!-- editscope:end -->' without"),
    ("\n<!-- editscope:measured runs/x colour=red -->\n<!-- editscope:end -->\n", "page.md:2: option 'colour=red'"),
    ("<!-- editscope:measured runs/x figures=all -->\n<!-- editscope:end -->\n", "page.md:1: figures=all"),
    ("<!-- editscope:measured baseline=memit -->\n<!-- editscope:end -->\n", "page.md:1: a measured block names no"),
])
def test_malformed_blocks_name_the_page_and_line(text, message):
    with pytest.raises(EditscopeError, match=re.escape(message)):
        parse_blocks(text, "page.md")


def test_a_bad_baseline_names_the_block(shards):
    page = _page(shards, "x\n<!-- editscope:measured runs/lifelong-* baseline=rome -->\n<!-- editscope:end -->\n")
    with pytest.raises(EditscopeError, match=r"reproduction\.md:2: .*rome"):
        regenerate(page, shards)
    assert page.read_text().startswith("x\n")


def test_a_page_without_blocks_is_an_error(tmp_path):
    page = _page(tmp_path, "# nothing measured\n")
    with pytest.raises(EditscopeError, match="no measured blocks"):
        regenerate(page, tmp_path)


def test_a_block_regenerates_from_its_archive_once_the_runs_are_gone(shards, tmp_path):
    """Regenerating archives each run beside the block (rows without raw probes); with the run directories gone
    the block regenerates to the same text from the archive, and a new run joins the archived ones."""
    root = tmp_path / "root"
    shutil.copytree(shards / "runs", root / "runs")
    page = _page(root)
    regenerate(page, root)
    text = page.read_text()
    archive = page.parent / "reproduction" / "lifelong" / "runs"
    assert sorted(p.name for p in archive.iterdir()) == ["lifelong-alphaedit", "lifelong-memit"]
    for name in ("lifelong-alphaedit", "lifelong-memit"):
        full = read_results(root / "runs" / name / "results.jsonl")
        slim = run_rows(archive / name)
        assert [r["metrics"] for r in slim] == [r["metrics"] for r in full]
        assert all(r["pre"] == {} and r["post"] == {} for r in slim) and any(r["pre"] for r in full)

    shutil.rmtree(root / "runs" / "lifelong-alphaedit")
    outcomes = regenerate(page, root)  # memit live, alphaedit from the archive
    assert [p.name for p in outcomes[0].archived] == ["lifelong-alphaedit"]
    assert "the archive (lifelong-alphaedit)" in outcomes[0].describe(page)
    assert page.read_text() == text
    shutil.rmtree(root / "runs")
    outcomes = regenerate(page, root)  # both from the archive
    assert len(outcomes[0].archived) == 2 and page.read_text() == text

    # a run of a new name joins the archived ones (its rows are in the table after each number of edits)
    shutil.copytree(shards / "runs" / "lifelong-memit", root / "runs" / "lifelong-memit-again")
    page = _page(root, PAGE.replace(" baseline=memit", ""))  # two memit runs: no one baseline
    outcomes = regenerate(page, root)
    assert [p.name for p in outcomes[0].runs] == ["lifelong-alphaedit", "lifelong-memit", "lifelong-memit-again"]
    assert "| memit [lifelong-memit-again] | 6 |" in page.read_text()
