"""Agreement of a judge with hand labels: Cohen's κ and its standard error against a hand computation, the error
rates against counting by hand, and the undefined and malformed cases."""

from __future__ import annotations

import math

import pytest

from editscope.metrics import MetricInputError
from editscope.metrics.agreement import agreement, cohen_kappa
from editscope.metrics.intervals import wilson_interval

LABELS = [1, 1, 1, 0, 0, 0, 1, 0, 1, 1]
JUDGED = [1, 0, 1, 0, 1, 0, 1, 0, 1, 1]


def test_kappa_by_hand():
    # p_o = 8/10; both raters say 1 six times in ten: p_e = 0.6·0.6 + 0.4·0.4 = 0.52
    # κ = (0.8 − 0.52) / 0.48 = 0.58333…; σ = √(0.8·0.2 / (10 · 0.48²)) = √(0.16 / 2.304)
    kappa, se = cohen_kappa(LABELS, JUDGED)
    assert kappa == pytest.approx(0.28 / 0.48, abs=1e-12)
    assert se == pytest.approx(math.sqrt(0.16 / 2.304), abs=1e-12)


def test_kappa_of_perfect_chance_and_opposite_raters():
    assert cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0])[0] == 1.0
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1])[0] == -1.0
    # a judge that accepts everything agrees with 3 of 4 labels, but no better than chance: p_e = 0.75 = p_o
    assert cohen_kappa([1, 1, 1, 0], [1, 1, 1, 1])[0] == 0.0
    assert all(math.isnan(x) for x in cohen_kappa([1, 1], [1, 1]))  # one class for both: undefined


def test_agreement_rates_by_hand():
    a = agreement(LABELS, JUDGED)
    assert a.n == 10 and a.positives == 6
    # one false negative (item 2: labelled 1, judged 0) among 6 positives; one false positive (item 5) among 4
    assert a.accuracy[0] == 0.8 and a.accuracy[1:] == pytest.approx(wilson_interval(0.8, 10))
    assert a.false_negative_rate[0] == pytest.approx(1 / 6)
    assert a.false_negative_rate[1:] == pytest.approx(wilson_interval(1 / 6, 6))
    assert a.false_positive_rate[0] == pytest.approx(1 / 4)
    assert a.false_positive_rate[1:] == pytest.approx(wilson_interval(1 / 4, 4))
    kappa, se = cohen_kappa(LABELS, JUDGED)
    z = 1.959963984540054
    assert a.kappa == pytest.approx((kappa, kappa - z * se, 1.0))  # κ + z·σ = 1.10, cut to κ's range
    only_right = agreement([1, 1], [1, 0])
    assert math.isnan(only_right.false_positive_rate[0])  # no answer labelled wrong: no false-positive rate
    assert only_right.kappa[0] == 0.0  # p_o = p_e = 0.5


def test_malformed_input_is_one_line():
    with pytest.raises(MetricInputError, match=r"labels\[1\]: expected 0 or 1, got 2"):
        agreement([1, 2], [1, 1])
    with pytest.raises(MetricInputError, match="judged: has 1 values, labels 2"):
        agreement([1, 0], [1])
    with pytest.raises(MetricInputError, match="labels: is empty"):
        cohen_kappa([], [])
    with pytest.raises(MetricInputError, match=r"judged\[0\]: expected 0 or 1, got True"):
        agreement([1], [True])
