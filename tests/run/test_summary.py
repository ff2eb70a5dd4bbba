"""The summary is driven by metric declarations: aggregate Score from dataset-level means (paper 002, appendix
C) with a bootstrap CI, declaration order, direction/unit headers; declarations survive run.json."""

from __future__ import annotations

import math

import numpy as np
import pytest

from editscope.metrics.registry import MetricSpec, harmonic_mean, hmean_of, specs_from_json, specs_to_json
from editscope.run.suites import declarations_to_json, declared_metrics
from editscope.run.summary import summarize
from editscope.run.summary_tables import to_markdown
from editscope.suites import CounterFactSuite, ZsreSuite

ES = (1.0, 0.0, 1.0, 1.0)
PS = (1.0, 1.0, 0.0, 0.5)
NS = (1.0, 0.5, 1.0, 1.0)


def rows_of(suite: str, names: tuple[str, str, str], tag: str = "post") -> list[dict]:
    return [{"dataset": "d", "case_id": str(i), "method": "m",
             "metrics": {suite: {f"{names[0]}_{tag}": e, f"{names[1]}_{tag}": p, f"{names[2]}_{tag}": n}}}
            for i, (e, p, n) in enumerate(zip(ES, PS, NS, strict=True))]


@pytest.mark.parametrize("suite_cls,names", [(CounterFactSuite, ("ES", "PS", "NS")),
                                             (ZsreSuite, ("Efficacy", "Paraphrase", "Specificity"))])
def test_score_is_harmonic_mean_of_dataset_means(suite_cls, names):
    suite = suite_cls()
    specs = {("d", suite.name): suite.metrics_declared}
    summary = summarize(rows_of(suite.name, names), specs=specs)
    by_metric = {r.metric: r for r in summary}
    expected = 3 / (1 / 0.75 + 1 / 0.625 + 1 / 0.875)  # hmean(.75, .625, .875)
    assert expected == pytest.approx(0.736, abs=5e-4)  # the value computed by hand
    score = by_metric["Score_post"]
    assert score.mean == pytest.approx(expected, abs=1e-12)
    assert score.n == 4 and score.ci == "bootstrap"
    # not the mean of per-case harmonic means (0 for cases 2 and 3, 1 for case 1, 0.8 for case 4)
    assert score.mean != pytest.approx(np.mean([1.0, 0.0, 0.0, 3 / (1 + 2 + 1)]))
    assert score.ci95_low <= score.mean <= score.ci95_high
    # the CI is a seeded percentile bootstrap over cases: recomputed independently here
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 4, size=(1000, 4))
    data = np.array([ES, PS, NS]).T
    stats = [3 / np.sum(1 / m) if np.all(m > 0) else 0.0 for m in data[idx].mean(axis=1)]
    assert (score.ci95_low, score.ci95_high) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])))
    # deterministic; the components keep their Student t rows; no pre rows without pre values
    assert summarize(rows_of(suite.name, names), specs=specs) == summary
    assert [r.metric for r in summary] == [f"{n}_post" for n in names] + ["Score_post"]
    assert by_metric[f"{names[0]}_post"].ci == "t"


def test_score_pre_from_pre_values_and_missing_components():
    suite = CounterFactSuite()
    rows = rows_of("counterfact", ("ES", "PS", "NS"), "pre")
    for r in rows:  # a case without PS: each component is averaged over the cases that have it
        r["metrics"]["counterfact"].pop("PS_pre") if r["case_id"] == "1" else None
    summary = {r.metric: r for r in summarize(rows, specs={("d", "counterfact"): suite.metrics_declared})}
    want = harmonic_mean([np.mean(ES), np.mean([PS[0], PS[2], PS[3]]), np.mean(NS)])
    assert summary["Score_pre"].mean == pytest.approx(want) and summary["Score_pre"].n == 3
    assert "Score_post" not in summary


def test_markdown_headers_carry_direction_unit_and_paper_scale():
    suite = CounterFactSuite()
    specs = {("d", "counterfact"): suite.metrics_declared}
    md = to_markdown(summarize(rows_of("counterfact", ("ES", "PS", "NS")), specs=specs), specs=specs)
    header = next(line for line in md.split("All metrics:")[1].splitlines() if line.startswith("| method"))
    assert "ES_post ↑ (share, paper ×100)" in header and "Score_post ↑ (share, paper ×100)" in header


def test_spec_json_roundtrip_and_run_json_declarations():
    specs = (MetricSpec("NKL", "000", "eq 10", False, (0.0, math.inf), "nats"),
             MetricSpec("S", "002", "hmean", True, aggregate=hmean_of(["NKL"])),
             MetricSpec("flag", "x", "y", None, None, "flag", pairing="post_only"))
    assert specs_from_json(specs_to_json(specs)) == specs
    meta = {"metrics": declarations_to_json({("d", "s"): specs})}
    import json

    assert declared_metrics(json.loads(json.dumps(meta))) == {("d", "s"): specs}
    # a run.json without stored declarations: rebuilt from its config through the registry
    meta = {"config": {"blocks": [{"label": "cf", "suites": [{"name": "zsre", "options": {}}]}]}}
    assert declared_metrics(meta) == {("cf", "zsre"): ZsreSuite().metrics_declared}


def test_bad_declarations_fail():
    with pytest.raises(ValueError, match="pairing"):
        MetricSpec("x", "p", "e", True, pairing="both")
    with pytest.raises(ValueError, match="unit"):
        MetricSpec("x", "p", "e", True, unit="furlongs")
    from editscope.metrics.registry import Declarations

    with pytest.raises(ValueError, match="component 'B'"):
        Declarations((MetricSpec("A", "p", "e", True), MetricSpec("S", "p", "e", True, aggregate=hmean_of(["A", "B"]))))


def test_whole_model_suite_interval_only_where_cases_differ():
    """A lifelong checkpoint's general-suite value is one measurement carried by every case: no interval. In single
    mode each case has its own edit: the Student t interval, as computed by hand."""
    def rows(values):
        return [{"dataset": "d", "case_id": str(i), "method": "m", "metrics": {"general": {"NTA_post": v}}}
                for i, v in enumerate(values)]

    same = summarize(rows([0.35] * 4))[0]
    assert (same.mean, same.ci, same.n) == (pytest.approx(0.35), "model", 4)
    assert math.isnan(same.ci95_low) and math.isnan(same.ci95_high)
    values = [0.30, 0.34, 0.36, 0.40]
    spread = summarize(rows(values))[0]
    half = 3.182446305284263 * np.std(values, ddof=1) / 2  # t(0.975, 3) · s / √4
    assert spread.ci == "t" and spread.mean == pytest.approx(0.35)
    assert (spread.ci95_low, spread.ci95_high) == (pytest.approx(0.35 - half), pytest.approx(0.35 + half))
