"""Confidence intervals and bootstrap aggregation over cases: pure functions on sequences of numbers.

* :func:`mean_ci` -- the mean with a two-sided Student t interval, mean ± t₍₁₊c₎/₂,ₙ₋₁ · s/√n (s the sample
  standard deviation, ddof = 1); undefined (NaN) for n < 2;
* :func:`geometric_mean_ci` -- the same on natural logs, exponentiated (a geometric mean with a multiplicative
  interval), for quantities such as perplexities that span orders of magnitude;
* :func:`stratified_mean_ci` -- the mean of a population cut into strata, each known by a random sample of its
  members (a lifelong checkpoint beyond ``reprobe``: the batch just written in full, a sample of the earlier
  cases): each stratum weighed by its size, not by its sample;
* :func:`bootstrap_aggregate` -- an aggregate of per-component means (the CounterFact/zsRE Score: the harmonic
  mean of ES, PS, NS, paper 002 appendix C) with a seeded percentile bootstrap interval over cases
  (Efron & Tibshirani 1993, ch. 13: the (1−c)/2 and (1+c)/2 percentiles of the statistic over resamples of the
  cases with replacement);
* :func:`paired_mean_ci` / :func:`paired_bootstrap_aggregate` -- the difference between two methods (or a method
  and the unedited model) measured on the same cases: the t interval of the per-case differences, and the
  bootstrap interval of the difference of aggregates over one shared resample of the cases;
* :func:`wilson_interval` -- the Wilson score interval of a proportion (Wilson 1927), which keeps a width where
  a t interval has none (a share of 0 or 1 over few cases);
* :func:`clip_interval` -- an interval cut to the values a metric can take.

Values that are None, NaN or inf are left out (they mean "no value for this case")."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from scipy import stats as st

from editscope.metrics.registry import MetricSpec

N_BOOTSTRAP = 1000
"""Resamples of :func:`bootstrap_aggregate` unless told otherwise."""
BOOTSTRAP_SEED = 0
"""Seed of :func:`bootstrap_aggregate`'s resampling unless told otherwise (summaries are reproducible)."""


Strata = tuple[Sequence[Hashable], Mapping[Hashable, int]]
"""(the stratum of each value, the population size of each stratum): what :func:`stratified_mean_ci` and
:func:`bootstrap_aggregate` need to weigh a stratified sample."""


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, low, high, sample std) of the finite ``values``; NaN where undefined.

    The interval is Student t's: mean ± t₍₁₊c₎/₂,ₙ₋₁ · s/√n with s the sample standard deviation (ddof = 1),
    c = ``confidence``. No finite value: all NaN; one finite value: its mean, the rest NaN."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan, math.nan
    sd = float(x.std(ddof=1))
    half = float(st.t.ppf(0.5 + confidence / 2, x.size - 1)) * sd / math.sqrt(x.size)
    return mean, mean - half, mean + half, sd


def wilson_interval(share: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``share`` observed over ``n`` trials (Wilson 1927, JASA 22:209):
    (p̂ + z²/2n ∓ z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n), z the two-sided normal quantile of ``confidence``.
    For p̂ = 1 the low end is n / (n + z²). NaN for n < 1 or a share outside [0, 1]."""
    if n < 1 or not 0.0 <= share <= 1.0:
        return math.nan, math.nan
    z = float(st.norm.ppf(0.5 + confidence / 2))
    centre = share + z * z / (2 * n)
    spread = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def geometric_mean_ci(values: Sequence[float], confidence: float = 0.95, *,
                      strata: Strata | None = None) -> tuple[float, float, float, float]:
    """(geometric mean, low, high, std of log) of the positive finite ``values``: :func:`mean_ci` of their
    natural logs (:func:`stratified_mean_ci` with ``strata``), exponentiated (an ``inf`` PPL, an overflow, is left
    out like a NaN)."""
    labels = strata[0] if strata is not None else [None] * len(values)
    kept = [(math.log(v), h) for v, h in zip(values, labels, strict=True)
            if v is not None and math.isfinite(v) and v > 0]
    logs = [x for x, _ in kept]
    if strata is None:
        mean, lo, hi, sd = mean_ci(logs, confidence)
    else:
        mean, lo, hi, sd = stratified_mean_ci(logs, ([h for _, h in kept], strata[1]), confidence)
    g, g_lo, g_hi = (math.exp(x) if math.isfinite(x) else math.nan for x in (mean, lo, hi))
    return g, g_lo, g_hi, sd


def stratified_mean_ci(values: Sequence[float], strata: Strata,
                       confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, low, high, std) of a population cut into strata h of N_h members, known by a simple random sample of
    n_h members each: ``strata`` = (the stratum of each of ``values``, N_h per stratum). Non-finite values are left
    out with their stratum's sample.

    The stratified mean Σ_h W_h·x̄_h, W_h = N_h / Σ N_h (over the strata with a value), with the Student t
    interval of its standard error √(Σ_h W_h²·s_h²/n_h) on Σ_h (n_h − 1) degrees of freedom (Cochran 1977,
    *Sampling Techniques*, §5.3 and §5.4; without the finite-population correction: as in :func:`mean_ci` the
    cases stand for the population of cases they were drawn from). A stratum with one value adds no variance.
    std: √(Σ_h W_h·s_h² + Σ_h W_h·(x̄_h − mean)²), the population's standard deviation so estimated."""
    labels, sizes = strata
    groups: dict[Hashable, list[float]] = {}
    for v, h in zip(values, labels, strict=True):
        if v is not None and math.isfinite(v):
            groups.setdefault(h, []).append(float(v))
    if not groups:
        return math.nan, math.nan, math.nan, math.nan
    total = sum(sizes[h] for h in groups)
    w = {h: sizes[h] / total for h in groups}
    m = {h: float(np.mean(x)) for h, x in groups.items()}
    var = {h: float(np.var(x, ddof=1)) if len(x) > 1 else 0.0 for h, x in groups.items()}
    mean = sum(w[h] * m[h] for h in groups)
    df = sum(len(x) - 1 for x in groups.values())
    sd = math.sqrt(sum(w[h] * var[h] + w[h] * (m[h] - mean) ** 2 for h in groups))
    if df < 1:
        return mean, math.nan, math.nan, sd
    se = math.sqrt(sum(w[h] ** 2 * var[h] / len(groups[h]) for h in groups))
    half = float(st.t.ppf(0.5 + confidence / 2, df)) * se
    return mean, mean - half, mean + half, sd


def _stratum_positions(n: int, strata: Strata | None) -> list[tuple[np.ndarray, float]]:
    """(positions, population size) of each stratum; without strata one stratum of all ``n`` cases."""
    if strata is None:
        return [(np.arange(n), float(n))]
    labels, sizes = strata
    members: dict[Hashable, list[int]] = {}
    for i, h in enumerate(labels):
        members.setdefault(h, []).append(i)
    return [(np.asarray(pos), float(sizes[h])) for h, pos in members.items()]


def _stratified_means(sample: np.ndarray, strata: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """Per-component means of ``sample`` ([..., cases, components]): each stratum's mean over its finite values,
    the strata weighed by population size over those with a value (NaN where none has one)."""
    total = np.zeros(sample.shape[:-2] + sample.shape[-1:])
    weight = np.zeros_like(total)
    for pos, size in strata:
        part = sample[..., pos, :]
        finite = np.isfinite(part)
        counts = finite.sum(axis=-2)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(finite, part, 0.0).sum(axis=-2) / counts
        if len(strata) == 1:  # the plain mean, to the last bit
            return means
        total += np.where(counts > 0, size * means, 0.0)
        weight += np.where(counts > 0, size, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / weight


def bootstrap_aggregate(columns: np.ndarray, spec: MetricSpec, *, strata: Strata | None = None,
                        n_boot: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED,
                        confidence: float = 0.95) -> tuple[float, float, float]:
    """(value, low, high) of an aggregate metric from ``columns`` ([cases, components], NaN = no value).

    The value is the aggregate of the per-component means over cases (each over its finite values: ROME's
    summaries average every metric over the cases that have it, then take the harmonic mean, paper 002
    appendix C); the CI is the percentile interval of the same statistic over ``n_boot`` resamples of the
    cases with replacement (seeded; NaN for fewer than 2 cases). With ``strata`` (a stratified sample, see
    :func:`stratified_mean_ci`) a component's mean is the stratified one and each resample draws within the
    strata."""
    assert spec.aggregate is not None
    n = columns.shape[0]
    groups = _stratum_positions(n, strata)
    value = spec.aggregate.compute([float(x) for x in _stratified_means(columns, groups)])
    if n < 2:
        return value, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = np.empty((n_boot, n), dtype=np.int64)
    for pos, _ in groups:  # one stratum (no strata): the plain resample of all cases
        idx[:, pos] = pos[rng.integers(0, pos.size, size=(n_boot, pos.size))]
    boot_means = _stratified_means(columns[idx], groups)
    stats = np.array([spec.aggregate.compute(m) for m in boot_means])
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return value, math.nan, math.nan
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return value, float(lo), float(hi)


def paired_mean_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
                   ) -> tuple[float, float, float, int]:
    """(mean difference, low, high, n pairs) of ``a[i] - b[i]`` over the pairs where both values are finite:
    :func:`mean_ci` of the per-case differences (the paired t interval; pairing removes the between-case
    variance both share, so it is narrower than comparing two independent intervals)."""
    if len(a) != len(b):
        raise ValueError(f"paired_mean_ci: {len(a)} values against {len(b)}")
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)
         if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]
    mean, lo, hi, _ = mean_ci(d, confidence)
    return mean, lo, hi, len(d)


def paired_bootstrap_aggregate(a: np.ndarray, b: np.ndarray, spec: MetricSpec, *, n_boot: int = N_BOOTSTRAP,
                               seed: int = BOOTSTRAP_SEED, confidence: float = 0.95) -> tuple[float, float, float]:
    """(difference, low, high) of an aggregate metric between two measurements of the same cases: ``a`` and ``b``
    are [cases, components] (row i of both is case i; NaN = no value). The difference is
    aggregate(means of ``a``) − aggregate(means of ``b``); its interval the percentile interval of the same
    difference over ``n_boot`` resamples of the cases, each resample applied to both (seeded)."""
    assert spec.aggregate is not None
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap_aggregate: shapes {a.shape} and {b.shape} differ")

    def stat(x: np.ndarray) -> np.ndarray:  # [..., cases, components] -> aggregate per leading index
        finite = np.isfinite(x)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(finite, x, 0.0).sum(axis=-2) / finite.sum(axis=-2)
        return np.array([spec.aggregate.compute(m) for m in means.reshape(-1, x.shape[-1])])

    value = float(stat(a[None])[0] - stat(b[None])[0])
    n = a.shape[0]
    if n < 2:
        return value, math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    diffs = stat(a[idx]) - stat(b[idx])
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size == 0:
        return value, math.nan, math.nan
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return value, float(lo), float(hi)


def clip_interval(low: float, high: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    """(low, high) cut to ``bounds`` (a metric's declared range; None: unbounded). NaN stays NaN: a t interval
    of a share near 0 or 1 leaves [0, 1], and a reader should not see a share of 1.03."""
    if bounds is None:
        return low, high
    lo_b, hi_b = bounds
    return (max(low, lo_b) if math.isfinite(low) else low, min(high, hi_b) if math.isfinite(high) else high)
