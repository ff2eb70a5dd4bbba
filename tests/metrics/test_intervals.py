"""metrics.intervals: Student t intervals, geometric means, seeded percentile-bootstrap aggregates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from editscope.metrics.intervals import bootstrap_aggregate, geometric_mean_ci, mean_ci
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
