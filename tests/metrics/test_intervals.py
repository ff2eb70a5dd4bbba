"""metrics.intervals: Student t intervals, geometric means, seeded percentile-bootstrap aggregates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from editscope.metrics.intervals import bootstrap_aggregate, geometric_mean_ci, mean_ci, stratified_mean_ci
from editscope.metrics.registry import MetricSpec, hmean_of


def test_mean_ci_is_students_t_interval_over_finite_values():
    xs = [0.2, 0.4, 0.9, 0.5]
    mean, lo, hi, sd = mean_ci([*xs, None, math.nan, math.inf])
    ref_lo, ref_hi = st.t.interval(0.95, len(xs) - 1, loc=np.mean(xs), scale=st.sem(xs))
    assert mean == pytest.approx(np.mean(xs))
    assert (lo, hi) == pytest.approx((ref_lo, ref_hi))
    assert sd == pytest.approx(np.std(xs, ddof=1))


def test_mean_ci_undefined_below_two_values():
    assert all(math.isnan(v) for v in mean_ci([]))
    mean, lo, hi, sd = mean_ci([3.0])
    assert mean == 3.0 and math.isnan(lo) and math.isnan(hi) and math.isnan(sd)


def test_geometric_mean_ci_is_mean_ci_on_logs():
    xs = [10.0, 1e3, 1e5, math.inf, -1.0]
    g, lo, hi, sd = geometric_mean_ci(xs)
    m, mlo, mhi, msd = mean_ci([math.log(x) for x in xs[:3]])
    assert (g, lo, hi, sd) == pytest.approx((math.exp(m), math.exp(mlo), math.exp(mhi), msd))
    assert g == pytest.approx(1e3)


def test_bootstrap_aggregate_is_seeded_and_brackets_the_value():
    spec = MetricSpec("S", "002", "C", True, aggregate=hmean_of(["ES", "PS"]), pairing="post_only")
    rng = np.random.default_rng(1)
    cols = rng.uniform(0.3, 1.0, size=(40, 2))
    cols[3, 1] = math.nan
    value, lo, hi = bootstrap_aggregate(cols, spec)
    means = [np.nanmean(cols[:, 0]), np.nanmean(cols[:, 1])]
    assert value == pytest.approx(2 / (1 / means[0] + 1 / means[1]))
    assert lo < value < hi
    assert bootstrap_aggregate(cols, spec) == (value, lo, hi)
    one = bootstrap_aggregate(cols[:1], spec)
    assert math.isnan(one[1]) and math.isnan(one[2])


def test_bootstrap_aggregate_equals_a_naive_loop_over_resamples():
    spec = MetricSpec("S", "002", "C", True, aggregate=hmean_of(["ES", "PS"]), pairing="post_only")
    cols = np.random.default_rng(2).uniform(0.2, 1.0, size=(15, 2))
    cols[4, 0] = math.nan
    value, lo, hi = bootstrap_aggregate(cols, spec, n_boot=200, seed=5)
    idx = np.random.default_rng(5).integers(0, 15, size=(200, 15))
    stats = []
    for draw in idx:
        m = [np.nanmean(cols[draw, 0]), np.nanmean(cols[draw, 1])]
        stats.append(2 / (1 / m[0] + 1 / m[1]))
    assert (lo, hi) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])), rel=1e-12)


def test_stratified_mean_ci_by_hand():
    # stratum a: 3 of its 3 members; b: 2 sampled of 8 members (Cochran 1977, eqs 5.1 and 5.6 without the fpc)
    values = [1.0, 2.0, 3.0, 10.0, 14.0, math.nan]
    labels = ["a", "a", "a", "b", "b", "b"]
    mean, lo, hi, sd = stratified_mean_ci(values, (labels, {"a": 3, "b": 8}))
    assert mean == pytest.approx((3 * 2.0 + 8 * 12.0) / 11)
    se = math.sqrt((3 / 11) ** 2 * 1.0 / 3 + (8 / 11) ** 2 * 8.0 / 2)
    half = st.t.ppf(0.975, 3) * se  # df: (3 − 1) + (2 − 1)
    assert (lo, hi) == pytest.approx((mean - half, mean + half))
    # sd: within-strata variance plus between-strata, each stratum weighed by its size
    assert sd == pytest.approx(math.sqrt(3 / 11 * 1 + 8 / 11 * 8 + 3 / 11 * (2 - mean) ** 2
                                         + 8 / 11 * (12 - mean) ** 2))
    # one stratum sampled in full is the plain mean
    xs = [0.3, 0.9, 0.4, 0.7]
    assert stratified_mean_ci(xs, (["s"] * 4, {"s": 4}))[:3] == pytest.approx(mean_ci(xs)[:3])


def test_stratified_geometric_mean_and_bootstrap_weigh_strata_by_size():
    g, _, _, _ = geometric_mean_ci([10.0, 1000.0, -1.0], strata=(["a", "b", "b"], {"a": 1, "b": 3}))
    assert g == pytest.approx(math.exp((math.log(10) + 3 * math.log(1000)) / 4))
    spec = MetricSpec("S", "002", "C", True, aggregate=hmean_of(["ES", "PS"]), pairing="post_only")
    cols = np.array([[1.0, 0.5], [0.5, 0.5], [0.2, 0.9], [0.4, math.nan]])
    strata = (["new", "new", "old", "old"], {"new": 2, "old": 10})
    value, lo, hi = bootstrap_aggregate(cols, spec, strata=strata)
    es = (2 / 12) * 0.75 + (10 / 12) * 0.3
    ps = (2 / 12 * 0.5 + 10 / 12 * 0.9)  # the old stratum's PS from its one finite value
    assert value == pytest.approx(2 / (1 / es + 1 / ps))
    assert lo <= value <= hi
    # a resample draws within strata: the new stratum's two ES values never leave it
    unweighted = bootstrap_aggregate(cols, spec)
    assert unweighted[0] != pytest.approx(value)


def test_paired_mean_ci_is_t_interval_of_differences_over_complete_pairs():
    from editscope.metrics.intervals import paired_mean_ci

    a = [0.9, 0.8, math.nan, 1.0, 0.7, 0.95]
    b = [0.5, 0.6, 0.2, None, 0.4, 0.5]
    d = np.array([0.4, 0.2, 0.3, 0.45])  # by hand: pairs 0, 1, 4, 5 (pair 2 lacks a, pair 3 lacks b)
    half = st.t.ppf(0.975, 3) * d.std(ddof=1) / math.sqrt(4)
    mean, lo, hi, n = paired_mean_ci(a, b)
    assert n == 4 and mean == pytest.approx(d.mean())
    assert (lo, hi) == pytest.approx((d.mean() - half, d.mean() + half))
    with pytest.raises(ValueError, match="3 values against 2"):
        paired_mean_ci([1, 2, 3], [1, 2])


def test_paired_bootstrap_aggregate_equals_a_naive_loop_over_shared_resamples():
    from editscope.metrics.intervals import paired_bootstrap_aggregate
    from editscope.metrics.registry import harmonic_mean

    spec = MetricSpec("Score", "002", "app C", True, aggregate=hmean_of(["ES", "PS"]))
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2, size=(12, 2)).astype(float)
    b = rng.integers(0, 2, size=(12, 2)).astype(float)
    a[4, 1] = np.nan  # no PS for case 4 after the edit: left out of that component's mean only
    value, lo, hi = paired_bootstrap_aggregate(a, b, spec, n_boot=200, seed=7)

    def score(x):
        return harmonic_mean([np.nanmean(x[:, k]) for k in range(x.shape[1])])

    assert value == pytest.approx(score(a) - score(b))
    idx = np.random.default_rng(7).integers(0, 12, size=(200, 12))
    diffs = np.array([score(a[i]) - score(b[i]) for i in idx])  # one resample of the cases for both
    diffs = diffs[np.isfinite(diffs)]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(diffs, [2.5, 97.5])))


def test_clip_interval_cuts_to_range_and_keeps_nan():
    from editscope.metrics.intervals import clip_interval

    assert clip_interval(-0.1, 1.2, (0.0, 1.0)) == (0.0, 1.0)
    assert clip_interval(0.2, 0.3, (0.0, 1.0)) == (0.2, 0.3)
    assert clip_interval(3.0, 50.0, (1.0, math.inf)) == (3.0, 50.0)
    lo, hi = clip_interval(math.nan, math.nan, (0.0, 1.0))
    assert math.isnan(lo) and math.isnan(hi)
    assert clip_interval(-5.0, 5.0, None) == (-5.0, 5.0)
