"""Every results row names the protocol its metrics follow and the editor's convention; summary.md and the report
print them under each table."""

from __future__ import annotations

import json

import pytest

from editscope.report import build_report
from editscope.run import Runner, parse_config
from editscope.run.summary import summarize
from editscope.run.summary_tables import protocol_notes, to_markdown

CONFIG = {
    "model": "tiny-llama",
    "methods": [{"name": "rome", "overrides": {"v_steps": 1}}],
    "datasets": [
        {"dataset": "zsre", "slice": {"limit": 1}, "suites": ["zsre"]},
        {"dataset": "peak-cf", "slice": {"limit": 1},
         "suites": [{"name": "peak", "options": {"protocol": "reference"}}]},
    ],
}


def _row(method, protocol, convention=None):
    row = {"dataset": "d", "method": method, "metrics": {"s": {"X_post": 1.0}}, "protocol": {"s": protocol}}
    if convention is not None:
        row["hparams"] = {"layers": [1], "convention": convention}
    return row


def test_protocol_notes_by_hand():
    paper = {"name": "paper", "note": "eq 1"}
    ref = {"name": "reference", "note": "their code"}
    rows = [_row("rome", paper, "paper"), _row("rome", paper, "paper"), _row("memit", paper, "reference"),
            _row("ft", paper)]
    assert protocol_notes(rows) == {("d", "s"): [
        "Protocol: paper — eq 1",
        "Editor conventions (paper = the paper's equations, reference = the reference code's): rome: paper; "
        "memit: reference"]}
    mixed = [_row("a", paper), _row("b", ref), {"dataset": "d", "method": "c", "metrics": {"s": {"X_post": 0.0}}}]
    assert protocol_notes(mixed)[("d", "s")] == [
        "Protocol (a): paper — eq 1", "Protocol (b): reference — their code",
        "Protocol (c): not recorded (row written before protocol labels)"]
    md = to_markdown(summarize(rows), notes=protocol_notes(rows))
    table_end = md.index("| rome |")
    assert md.index("*Protocol: paper — eq 1*") > table_end


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from editscope.lm import load

    out = tmp_path_factory.mktemp("run")
    Runner(parse_config(CONFIG), out_dir=out, bundle=load("tiny-llama"), progress=False, log=lambda _m: None).run()
    return out


def test_rows_name_protocol_and_edit_target(run_dir):
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    by = {r["dataset"]: r for r in rows}
    assert by["zsre"]["protocol"]["zsre"]["name"] == "paper"
    assert 'loc + "?"' in by["zsre"]["protocol"]["zsre"]["note"]
    assert by["zsre"]["requests"][0]["target_new"] == "uniform"  # MEND answers[0], what the runner edited
    assert by["zsre"]["post"]["zsre"]["prompts"][-1]["prompt"].endswith("lebowski?")
    assert by["peak-cf"]["protocol"]["peak"]["name"] == "reference"
    assert by["zsre"]["hparams"]["layers"] and by["zsre"]["hparams"]["v_steps"] == 1


def test_summary_and_report_print_protocols_under_tables(run_dir, tmp_path):
    summary_md = (run_dir / "summary.md").read_text()
    _, md_path = build_report([run_dir], tmp_path / "rep")
    report_md = md_path.read_text()
    html = (tmp_path / "rep" / "report.html").read_text()
    for text in (summary_md, report_md):
        zsre = text.index("## zsre on zsre")
        peak = text.index("## peak on peak-cf")
        zsre_note = text.index("*Protocol: paper — paper 002 eqs 21-23", zsre)
        assert zsre < text.index("| rome |", zsre) < zsre_note < peak
        assert text.index("*Protocol: reference — PEAK reference code (summarize.py)", peak) > peak
    assert "<p class='protocol'>Protocol: reference — PEAK reference code" in html
