"""The report's curves against the number of edits carry the weights suite's drift metrics (a suite without headline
metrics shows its per-case ones), from a real lifelong run on tiny-llama; long streams get a log x-axis."""

from __future__ import annotations

import json
import math

import pytest

from editscope.report import figures
from editscope.report.build import analyse
from editscope.run import Runner, parse_config, read_results
from editscope.run.summary import edit_info_curves
from editscope.run.summary_tables import curve_columns, curve_table
from editscope.suites import get_suite
from editscope.suites.weights import SOLVE_COND


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from editscope.lm import load

    out = tmp_path_factory.mktemp("weights-run")
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "methods": ["ultraedit"],
        "mode": {"sequential_batches": {"batch": 3, "rounds": 3, "checkpoints": 1}},
        "dataset": "counterfact-sample", "slice": {"limit": 9}, "suites": ["counterfact", "weights"]}, where="test")
    Runner(config, out_dir=out, bundle=load("tiny-llama"), progress=False, log=lambda _m: None).run()
    return out


def test_curve_columns_fall_back_to_a_diagnostic_suites_metrics():
    assert [s.name for s in curve_columns(get_suite("weights").metrics_declared)] == [
        "DeltaNorm", "DeltaNormMax", "NormGrowth", "DeltaSigma"]
    assert [s.name for s in curve_columns(get_suite("counterfact").metrics_declared)] == ["ES", "PS", "NS", "Score"]


def test_the_reports_weights_curve_and_table_hold_each_checkpoints_values(run_dir):
    rows = read_results(run_dir / "results.jsonl")
    analysis = analyse([run_dir])
    points = analysis.curves[("counterfact-sample", "weights")]
    assert sorted(points) == [3, 6, 9]
    table = curve_table(points, ["ultraedit"], analysis.specs[("counterfact-sample", "weights")])
    assert table is not None and table.headers[3:7] == ["DeltaNorm ↓ (ratio)", "DeltaNormMax ↓ (ratio)",
                                                       "NormGrowth (ratio)", "DeltaSigma ↓ (ratio)"]
    for edits, line in zip((3, 6, 9), table.rows, strict=True):
        row = next(r for r in rows if r["edits_applied"] == edits)
        assert line[1] == edits
        mean = {r.metric: r.mean for r in points[edits]}
        for metric in ("DeltaNorm", "DeltaNormMax", "NormGrowth", "DeltaSigma"):
            assert mean[metric] == pytest.approx(row["metrics"]["weights"][metric], rel=1e-12)
    assert mean["DeltaNorm"] > 0 and mean["NormGrowth"] != 1.0
    slugs = {f.slug for f in analysis.figures}
    assert "curve-counterfact-sample-weights" in slugs
    assert "retention-counterfact-sample-weights" not in slugs  # the model as a whole: nothing to retain per batch


def test_a_stream_of_checkpoints_spanning_more_than_a_decade_is_drawn_on_a_log_x_axis(run_dir, monkeypatch):
    assert not figures.log_edits_axis([100 * k for k in range(1, 11)])  # paper 004's 100..1,000: linear
    assert figures.log_edits_axis([1000 * k for k in range(1, 18)] + [17732])
    analysis = analyse([run_dir])
    points = analysis.curves[("counterfact-sample", "weights")]
    drawn = []
    monkeypatch.setattr(figures, "png", lambda fig: drawn.append(fig) or b"")
    specs = analysis.specs[("counterfact-sample", "weights")]
    figures.edit_curves(points, ["ultraedit"], "t", specs)
    figures.edit_curves({e * 1000: rs for e, rs in points.items()} | {9 * 10**4: points[9]}, ["ultraedit"], "t", specs)
    linear, log = drawn
    visible = [ax for ax in linear.axes if ax.get_visible() and ax.get_title()]
    assert [ax.get_title() for ax in visible] == ["DeltaNorm ↓", "DeltaNormMax ↓", "NormGrowth", "DeltaSigma ↓",
                                                  "SolveCond ↓"]
    assert {ax.get_xscale() for ax in visible} == {"linear"}
    assert [ax.get_yscale() for ax in visible] == ["linear"] * 4 + [
        "log" if figures.spans_decades([r.mean for rs in points.values() for r in rs if r.metric == "SolveCond"])
        else "linear"]
    assert {ax.get_xscale() for ax in log.axes if ax.get_visible() and ax.get_title()} == {"log"}
    # the plotted line is the checkpoints' means
    line = visible[0].get_lines()[0]
    assert list(line.get_xdata()) == [3, 6, 9]
    assert list(line.get_ydata()) == pytest.approx([{r.metric: r.mean for r in points[e]}["DeltaNorm"]
                                                    for e in (3, 6, 9)])


def test_a_panel_whose_values_span_more_than_two_decades_is_drawn_on_a_log_y_axis():
    assert figures.spans_decades([1.0e6, 1.4e6, 1.2e10])
    assert not figures.spans_decades([1.0e6, 9.9e7])  # just under two decades
    assert not figures.spans_decades([0.0, 1.0e6])  # zero: no log axis
    assert not figures.spans_decades([])


@pytest.mark.parametrize(("values", "ylim", "labelled"), [
    ([44.0, 1230.0], (40, 1300), ["50", "200", "500"]),  # a perplexity over ~1.5 decades: 2x and 5x only
    ([44.0, 89.0], (40, 95), ["40", "50", "60", "70", "80", "90"]),  # under a decade: every minor tick
])
def test_log_perplexity_axis_labels_few_minor_ticks_over_a_decade(values, ylim, labelled):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        figures._plain_log_ticks(ax, values)
        ax.set_ylim(*ylim)
        fig.canvas.draw()
        shown = [(loc, t.get_text()) for loc, t in zip(ax.yaxis.get_minorticklocs(), ax.yaxis.get_minorticklabels(),
                                                         strict=True)]
        assert [text for loc, text in shown if ylim[0] <= loc <= ylim[1] and text] == labelled
    finally:
        plt.close(fig)


def _row(case: int, edits: int, cond: float | None, method: str = "ultraedit") -> dict:
    return {"dataset": "d", "method": method, "group": 0, "case_id": str(case), "edits_applied": edits,
            "edit_info": {} if cond is None else {"solve_cond_max": cond}}


def test_edit_info_curve_takes_the_worst_round_written_since_the_previous_checkpoint():
    # checkpoint at 4 edits: cases 0-3 (rounds of 2: conds 2 and 5); at 8: cases 4-7 (conds 7, 3) and a re-probe
    # of case 0 (first probed at 4: its old round does not count at 8); a method without the key is left out
    rows = [_row(0, 4, 2.0), _row(1, 4, 2.0), _row(2, 4, 5.0), _row(3, 4, 5.0),
            _row(0, 8, 2.0), _row(4, 8, 7.0), _row(5, 8, 7.0), _row(6, 8, 3.0), _row(7, 8, 3.0),
            _row(0, 4, None, "memit"), _row(1, 8, None, "memit")]
    curves = edit_info_curves(rows, "weights", {"solve_cond_max": SOLVE_COND}, ["memit", "ultraedit"])
    assert list(curves) == ["d"] and sorted(curves["d"]) == [4, 8]
    (row,) = curves["d"][4]
    assert (row.dataset, row.suite, row.method, row.metric, row.n, row.mean, row.ci) == (
        "d", "weights", "ultraedit", "SolveCond", 4, 5.0, "model")
    assert math.isnan(row.ci95_low) and math.isnan(row.ci95_high)  # one value per round: no interval
    assert [(r.n, r.mean) for r in curves["d"][8]] == [(4, 7.0)]
    assert edit_info_curves(rows[:4], "weights", {"solve_cond_max": SOLVE_COND}) == {}  # one point: no curve


def test_the_weights_curve_carries_the_solves_condition_number(run_dir):
    rows = read_results(run_dir / "results.jsonl")
    analysis = analyse([run_dir])
    specs = analysis.specs[("counterfact-sample", "weights")]
    assert specs[-1] == SOLVE_COND  # as recorded in run.json
    points = analysis.curves[("counterfact-sample", "weights")]
    table = curve_table(points, ["ultraedit"], specs)
    assert table.headers[-1] == "SolveCond ↓ (ratio)"
    for edits in (3, 6, 9):  # a checkpoint every round: the batch just written is the only one first probed there
        written = [r["edit_info"]["solve_cond_max"] for r in rows if r["edits_applied"] == edits
                   and not any(o["case_id"] == r["case_id"] and o["edits_applied"] < edits for o in rows)]
        assert len(written) == 3 and len(set(written)) == 1
        cond = next(r for r in points[edits] if r.metric == "SolveCond")
        assert cond.mean == written[0] and cond.mean > 1.0
    assert len({next(r.mean for r in points[e] if r.metric == "SolveCond") for e in (3, 6, 9)}) == 3


def test_a_run_still_in_progress_reports_its_checkpoints_curves(run_dir, tmp_path):
    """Only checkpoint rows (the final rows not written yet): every suite still gets its section, with the curves
    of the checkpoints so far and a note saying the run goes on; no bars (they need final rows)."""
    from editscope.report.build import build_report
    from editscope.report.document import IN_PROGRESS_NOTE

    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "run.json").write_text((run_dir / "run.json").read_text())
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["checkpoint"]]  # each line as written, its digest with it
    assert kept and len(kept) < len(lines)
    (partial / "results.jsonl").write_text("\n".join(kept) + "\n")
    _html, md = build_report([partial], tmp_path / "report")
    text = md.read_text()
    for suite in ("counterfact", "weights"):
        section = text.split(f"## {suite} on counterfact-sample")[1].split("\n## ")[0]
        assert IN_PROGRESS_NOTE in section and "After each number of edits" in section
        assert f"curve-counterfact-sample-{suite}.png" in section and "bars-" not in section
    weights = text.split("## weights on counterfact-sample")[1]
    assert "| ultraedit | 3 |" in weights and "| ultraedit | 6 |" in weights and "| ultraedit | 9 |" not in weights
