"""The NKL paper's simulation (paper 000, section 4.2) and the ``editscope simulate`` command."""

from __future__ import annotations

import json

import pytest

from editscope.cli import main
from editscope.simulate import METRICS, PAPER_TABLE2, plot_simulation, run_simulation


@pytest.fixture(scope="module")
def cli_json():
    """``editscope simulate --json`` with the default settings, run once for the module."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["simulate", "--json"]) == 0
    return buf.getvalue()


def test_cli_json_is_one_object_with_the_documented_keys(cli_json):
    lines = cli_json.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == {"criterion1", "criterion2", "by_answers"}
    assert set(result["by_answers"]) == {"2", "4", "8", "16"}
    for crit in ("criterion1", "criterion2"):
        assert set(result[crit]) == set(METRICS) == set(PAPER_TABLE2[crit])
        for per in result["by_answers"].values():
            assert set(per) == {"criterion1", "criterion2"}
            assert set(per[crit]) == set(METRICS)


def test_cli_correlations_are_valid_and_nkl_follows_both_criteria_best(cli_json):
    result = json.loads(cli_json)
    blocks = [result["criterion1"], result["criterion2"]]
    blocks += [per[c] for per in result["by_answers"].values() for c in ("criterion1", "criterion2")]
    for block in blocks:
        for value in block.values():
            assert value is not None and -1.0 <= value <= 1.0
    # The paper's headline (Table 2): NKL correlates best with coverage and with alignment.
    for crit in ("criterion1", "criterion2"):
        others = [v for k, v in result[crit].items() if k != "NKL"]
        assert result[crit]["NKL"] > max(others)
        assert result[crit]["NKL"] > 0.7


def test_headline_numbers_are_the_mean_over_answer_counts(cli_json):
    result = json.loads(cli_json)
    for crit in ("criterion1", "criterion2"):
        for m in METRICS:
            per_count = [per[crit][m] for per in result["by_answers"].values()]
            assert result[crit][m] == pytest.approx(sum(per_count) / len(per_count))


def test_fixed_seed_is_reproducible_and_counts_are_independent():
    a = run_simulation(answers=(2, 4), trials=15, seed=3)
    b = run_simulation(answers=(4,), trials=15, seed=3)
    assert a == run_simulation(answers=(2, 4), trials=15, seed=3)
    assert a["by_answers"]["4"] == b["by_answers"]["4"]
    assert run_simulation(answers=(4,), trials=15, seed=4) != b


def test_lower_is_better_metrics_are_reported_with_the_criterion_direction():
    # With a single answer, masking it removes all coverage: NKL and PPL rise, so their raw correlation
    # with coverage is negative and the reported (negated) one is positive.
    r = run_simulation(answers=(1,), trials=30, seed=0)["by_answers"]["1"]["criterion1"]
    assert r["NKL"] > 0.9 and r["PPL"] > 0.0


def test_table_output_has_table2_shape(capsys):
    assert main(["simulate", "--answers", "2", "4", "--trials", "20", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[1].split()
    assert header[:1] == ["metric"] and "paper" in header
    for label in ("NKL", "MaxAcc", "Precision@K", "Perplexity"):
        assert any(line.startswith(label) for line in out.splitlines())
    assert "0.735" in out and "0.762" in out  # the paper's NKL row beside ours


def test_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "fig3.png"
    assert main(["simulate", "--answers", "2", "4", "--trials", "10", "--json", "--plot", str(out)]) == 0
    json.loads(capsys.readouterr().out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(ValueError, match="^result"):
        plot_simulation({}, tmp_path / "x.png")


def test_bad_settings_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:  # a declared range: argparse's usage error, before any work
        main(["simulate", "--trials", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("editscope simulate: error: argument --trials: must be an integer in "
                                               "[1, 1000000], got '0'")
    with pytest.raises(ValueError, match="^answers"):
        run_simulation(answers=(100,), vocab=100)
    with pytest.raises(ValueError, match="^answers"):
        run_simulation(answers=())
