"""The PEAK objective of ``editscope tune`` against hand computations: the harmonic mean of ES, 1−AFF_hard and
1−ANF_hard (complements per case, means over the cases that have a value), its bootstrap CI against a naive loop,
the efficacy guard against the editor-alone reference, and a choice that refuses a candidate losing too much ES."""

from __future__ import annotations

import math

import numpy as np
import pytest

from editscope.metrics.intervals import BOOTSTRAP_SEED, N_BOOTSTRAP
from editscope.suites.counterfact import METRICS as CF_METRICS
from editscope.suites.peak import METRICS as PEAK_METRICS
from editscope.tune.search import OBJECTIVES, Component, score_rows, select

PEAK = OBJECTIVES["peak"]
T_975_4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)
Z_975 = 1.959963984540054  # standard normal, 97.5% quantile (tables)


def peak_rows(es, aff, anf, es_pre=None):
    """PEAK metric rows as the suite writes them: ES_pre/ES_post, post-only AFF_hard/ANF_hard (absent: None)."""
    rows = []
    for i, (e, a, n) in enumerate(zip(es, aff, anf, strict=True)):
        row = {"ES_post": e, "ES_pre": 0.0 if es_pre is None else es_pre[i], "n_prompts_hard": 0.0 if a is None else 1}
        if a is not None:
            row["AFF_hard"] = a
        if n is not None:
            row["ANF_hard"] = n
        rows.append(row)
    return rows


def test_objective_declaration_and_description():
    assert [c.label for c in PEAK.components] == ["ES", "1−AFF_hard", "1−ANF_hard"]
    assert PEAK.components[1] == Component("AFF_hard", True) and PEAK.guard == "ES"
    assert PEAK.guard_reference == "editor_alone" and PEAK.metrics == ("ES", "AFF_hard", "ANF_hard")
    text = PEAK.describe()
    for part in ("peak", "harmonic mean", "ES, 1−AFF_hard, 1−ANF_hard", "lower 95% bootstrap CI bound",
                 "the same editor alone (base hparams, no plug-ins)", "95% CI half-width"):
        assert part in text
    assert "the unedited model (the rows' NS_pre values)" in OBJECTIVES["counterfact"].describe()
    d = PEAK.to_dict()
    assert d["complemented"] == ["AFF_hard", "ANF_hard"] and d["guard_reference"] == "editor_alone"
    assert d["components"] == ["ES", "1−AFF_hard", "1−ANF_hard"]


def test_harmonic_mean_of_complements_by_hand():
    # ES 1,1,0,1,1 -> .8; AFF_hard .2,.6,.4,0,(none) -> .3 -> 1-.3 = .7; ANF_hard .5,.5,.5,.1,(none) -> .4 -> .6
    # hmean(.8, .7, .6) = 3 / (5/4 + 10/7 + 5/3) = 3 * 84 / (105 + 120 + 140) = 252/365
    rows = peak_rows([1, 1, 0, 1, 1], [.2, .6, .4, 0, None], [.5, .5, .5, .1, None])
    reference = peak_rows([1, 1, 1, 1, 1], [0] * 5, [0] * 5)
    s = score_rows(rows, PEAK, PEAK_METRICS, reference=reference)
    assert s.n == 5 and math.isclose(s.score, 252 / 365)
    assert not math.isclose(s.score, 3 / (1 / .8 + 1 / .3 + 1 / .4))  # the uncomplemented mean would differ
    assert s.metrics["ES"][0] == pytest.approx(.8)
    assert s.metrics["AFF_hard"][0] == pytest.approx(.3) and s.metrics["ANF_hard"][0] == pytest.approx(.4)
    # a naive bootstrap: the same resampled case indices, per resample the means over present values by hand
    idx = np.random.default_rng(BOOTSTRAP_SEED).integers(0, 5, size=(N_BOOTSTRAP, 5))
    es, aff, anf = [1, 1, 0, 1, 1], [.2, .6, .4, 0, None], [.5, .5, .5, .1, None]
    stats = []
    for sample in idx:
        means = []
        for col, complement in ((es, False), (aff, True), (anf, True)):
            vals = [(1 - col[i]) if complement else col[i] for i in sample if col[i] is not None]
            means.append(sum(vals) / len(vals) if vals else float("nan"))
        if any(math.isnan(m) for m in means):
            continue
        stats.append(0.0 if min(means) == 0 else 3 / sum(1 / m for m in means))
    lo, hi = np.percentile(stats, [2.5, 97.5])
    assert (s.score_lo, s.score_hi) == pytest.approx((lo, hi))


def test_efficacy_guard_compares_with_the_editor_alone():
    rows = peak_rows([1, 1, 0, 1, 1], [.1] * 5, [.1] * 5, es_pre=[0, 0, 0, 0, 0])
    # the reference hits every case: mean 1, no spread, so t's interval has no width; the floor is the low end of
    # the Wilson interval of 5/5, n / (n + z^2) = 5 / (5 + 1.96^2) = .5655: the candidate's ES .8 passes, .4 does not
    s = score_rows(rows, PEAK, PEAK_METRICS, reference=peak_rows([1] * 5, [.9] * 5, [.9] * 5))
    assert s.guard == pytest.approx(.8) and s.guard_ref == 1.0 and s.local
    assert s.guard_floor == pytest.approx(5 / (5 + Z_975 ** 2))
    s = score_rows(peak_rows([1, 0, 0, 1, 0], [.1] * 5, [.1] * 5), PEAK, PEAK_METRICS,
                   reference=peak_rows([1] * 5, [.9] * 5, [.9] * 5))
    assert not s.local
    # reference ES 1,1,0,1,1: mean .8, sd sqrt(.2), half-width t(.975, 4) * sqrt(.2) / sqrt(5) = .2 * t
    s = score_rows(peak_rows([0, 1, 0, 1, 0], [.1] * 5, [.1] * 5), PEAK, PEAK_METRICS,
                   reference=peak_rows([1, 1, 0, 1, 1], [.9] * 5, [.9] * 5))
    assert s.guard_ref == pytest.approx(.8) and s.guard_floor == pytest.approx(.8 - .2 * T_975_4)
    assert s.local  # ES .4 >= .8 - .555
    s = score_rows(peak_rows([0, 1, 0, 0, 0], [.1] * 5, [.1] * 5), PEAK, PEAK_METRICS,
                   reference=peak_rows([1, 1, 0, 1, 1], [.9] * 5, [.9] * 5))
    assert not s.local  # ES .2 < .245
    # the guard reads the reference, never the candidate's own ES_pre
    s = score_rows(peak_rows([1] * 5, [.1] * 5, [.1] * 5, es_pre=[0] * 5), PEAK, PEAK_METRICS,
                   reference=peak_rows([1] * 5, [.9] * 5, [.9] * 5))
    assert s.guard_ref == 1.0 and s.local
    with pytest.raises(ValueError, match="no reference rows"):
        score_rows(rows, PEAK, PEAK_METRICS)
    with pytest.raises(ValueError, match="4 reference rows for 5"):
        score_rows(rows, PEAK, PEAK_METRICS, reference=peak_rows([1] * 4, [0] * 4, [0] * 4))


def test_selection_refuses_a_candidate_that_loses_too_much_efficacy():
    reference = peak_rows([1] * 30, [.9] * 30, [.8] * 30)  # the editor alone: every edit lands, AFF/ANF high
    # "strong": the deepest additivity cut (AFF = ANF = 0), but 4 edits of 30 fail: ES 26/30 = .867 is below the
    # floor, the low end of the Wilson interval of 30/30, 30 / (30 + z^2) = .886
    # "mild": every edit lands, AFF = ANF = .5 -> Score hmean(1, .5, .5) = .6 on every resample
    scores = {"strong": score_rows(peak_rows([1] * 26 + [0] * 4, [0] * 30, [0] * 30), PEAK, PEAK_METRICS, reference),
              "mild": score_rows(peak_rows([1] * 30, [.5] * 30, [.5] * 30), PEAK, PEAK_METRICS, reference)}
    assert scores["strong"].guard_floor == pytest.approx(30 / (30 + Z_975 ** 2))
    assert math.isclose(scores["strong"].score, 3 / (30 / 26 + 1 + 1))
    assert scores["mild"].score == pytest.approx(.6) and scores["mild"].score_lo == pytest.approx(.6)
    assert scores["strong"].score_lo > scores["mild"].score_lo  # it would win on the score alone
    assert not scores["strong"].local and scores["mild"].local
    assert select(scores) == "mild"
    assert select({"strong": scores["strong"]}) is None


def test_counterfact_objective_unchanged_by_the_generalisation():
    # the CounterFact Score through the generalised objective equals the suite's declared aggregate, by hand
    rows = [{"ES_post": a, "PS_post": b, "NS_post": c, "NS_pre": 1.0}
            for a, b, c in zip([1, 0, 1], [1, 1, .5], [0, 1, 1], strict=True)]
    s = score_rows(rows, OBJECTIVES["counterfact"], CF_METRICS)
    assert math.isclose(s.score, 3 / (3 / 2 + 6 / 5 + 3 / 2))  # means 2/3, 5/6, 2/3
    # NS_pre 1 on all 3 cases: the floor is Wilson's 3 / (3 + z^2) = .438, so NS 2/3 passes
    assert s.guard_ref == 1.0 and s.guard == pytest.approx(2 / 3) and s.local
    assert s.guard_floor == pytest.approx(3 / (3 + Z_975 ** 2))


def test_cli_help_names_each_objective(capsys):
    from editscope.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{counterfact,zsre,peak-cf,counterfact-evk}" in text
    assert "harmonic mean of ES, 1-AFF_hard and 1-ANF_hard" in text and "editor alone" in text
    assert "95%%" not in text  # the description is printed as written, not %-formatted
