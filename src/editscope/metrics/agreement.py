"""Agreement of a binary judge with hand labels: accuracy, Cohen's κ, false-positive and false-negative rates, each
with an interval. Pure functions on sequences of 0/1; no model, no I/O.

* :func:`cohen_kappa` -- Cohen (1960), "A coefficient of agreement for nominal scales", Educational and
  Psychological Measurement 20:37, eq. 1: κ = (p_o − p_e) / (1 − p_e), with p_o the observed agreement and
  p_e = Σ_c p_c(labels) · p_c(judge) the agreement expected by chance from the two raters' marginal shares;
  its large-sample standard error is Cohen's eq. 9, σ_κ = √(p_o (1 − p_o) / (n (1 − p_e)²));
* :func:`agreement` -- the four figures together, proportions with Wilson intervals
  (:func:`editscope.metrics.intervals.wilson_interval`), κ with the normal interval κ ± z·σ_κ cut to [−1, 1].

A false positive is an answer the judge accepts that the hand label rejects; the false-positive rate is their share
among the answers labelled wrong (the false-negative rate: answers rejected among those labelled right).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as st

from editscope.metrics._validate import fail
from editscope.metrics.intervals import wilson_interval

__all__ = ["Agreement", "agreement", "cohen_kappa"]


def _binary(values: Sequence[float], name: str) -> list[int]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or v not in (0, 1):
            raise fail(f"{name}[{i}]", f"expected 0 or 1, got {v!r}")
        out.append(int(v))
    return out


def _pair(labels: Sequence[float], judged: Sequence[float]) -> tuple[list[int], list[int]]:
    a, b = _binary(labels, "labels"), _binary(judged, "judged")
    if len(a) != len(b):
        raise fail("judged", f"has {len(b)} values, labels {len(a)}")
    if not a:
        raise fail("labels", "is empty")
    return a, b


def cohen_kappa(labels: Sequence[float], judged: Sequence[float]) -> tuple[float, float]:
    """(κ, σ_κ) of two binary raters over the same items (Cohen 1960, eqs. 1 and 9; module docstring).

    When both raters give one same class to every item, p_e = 1 and κ is undefined: NaN, NaN."""
    a, b = _pair(labels, judged)
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    p_e = pa * pb + (1 - pa) * (1 - pb)
    if p_e >= 1.0:
        return math.nan, math.nan
    kappa = (p_o - p_e) / (1 - p_e)
    return kappa, math.sqrt(p_o * (1 - p_o) / (n * (1 - p_e) ** 2))


@dataclass(frozen=True)
class Agreement:
    """A judge against hand labels over ``n`` items: each figure a (value, low, high) triple (NaN where undefined:
    no item labelled wrong has no false-positive rate)."""

    n: int
    positives: int
    accuracy: tuple[float, float, float]
    kappa: tuple[float, float, float]
    false_positive_rate: tuple[float, float, float]
    false_negative_rate: tuple[float, float, float]


def _share(hits: int, n: int, confidence: float) -> tuple[float, float, float]:
    if n == 0:
        return math.nan, math.nan, math.nan
    return (hits / n, *wilson_interval(hits / n, n, confidence))


def agreement(labels: Sequence[float], judged: Sequence[float], confidence: float = 0.95) -> Agreement:
    """Accuracy, Cohen's κ, false-positive and false-negative rate of ``judged`` against the hand ``labels``
    (module docstring), with ``confidence`` intervals."""
    a, b = _pair(labels, judged)
    n, positives = len(a), sum(a)
    kappa, se = cohen_kappa(a, b)
    z = float(st.norm.ppf(0.5 + confidence / 2))
    kappa_ci = (kappa, max(-1.0, kappa - z * se), min(1.0, kappa + z * se)) if math.isfinite(kappa) else (
        math.nan, math.nan, math.nan)
    fp = sum(1 for x, y in zip(a, b, strict=True) if x == 0 and y == 1)
    fn = sum(1 for x, y in zip(a, b, strict=True) if x == 1 and y == 0)
    return Agreement(n, positives, _share(n - fp - fn, n, confidence), kappa_ci,
                     _share(fp, n - positives, confidence), _share(fn, positives, confidence))
