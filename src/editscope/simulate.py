"""The simulation experiment of paper 000 ("Beyond 1-to-1", section 4.2, Table 2, Figures 3 and 6).

Does a metric follow the two criteria of 1-to-N knowledge evaluation?

* Criterion 1 (coverage): the model should retrieve all valid answers. *Answer masking* removes the
  valid answers from the model's distribution one at a time, the most probable first, from full
  coverage (none removed) to none (all removed).
* Criterion 2 (alignment): the model's distribution over the valid answers should match the gold one.
  *Linear interpolation* ``P_lambda = lambda Q + (1 - lambda) P_M`` moves from the gold distribution
  (lambda = 1) to the model's own prediction (lambda = 0).

Each metric (NKL, MaxAcc, Precision@K, PPL -- computed with :mod:`editscope.metrics.one_to_n`) is scored on
every degraded distribution, and its Pearson correlation with the criterion level is reported.

Choices where the paper is silent (all are parameters of :func:`run_simulation`):

* One simulated query: ``vocab`` = 100 candidate answers with scores drawn i.i.d. from a standard
  Gaussian; the model's distribution is the softmax of all scores. ``n`` valid answers are a uniformly
  random subset of the candidates; the gold distribution *retains the scores of the valid answers* and
  is their softmax over the valid set (paper: "retains the scores assigned to correct answers,
  normalised"). All answers are single-token.
* Masking sets a removed answer's probability to 0 and renormalises the rest. Log-probabilities are
  floored at ``log(mask_floor)`` (1e-10) wherever they are needed (NKL, PPL), since log 0 is undefined.
  Criterion-1 level: the share of valid answers still present, ``(n - removed) / n``.
* Interpolation uses ``lambdas`` = 11 evenly spaced values from 1 to 0; criterion-2 level: lambda.
* Precision@K uses K = ``k`` = 3 (the K of the paper's Figure 1).
* Correlation: for each answer count, Pearson's r over all pooled (level, metric value) points of all
  trials -- per-query metric values, so a metric that is noisy across queries correlates less, as the
  paper's E_(q,A) definitions imply. The headline number per criterion (Table 2) is the mean of the
  per-answer-count correlations (Figure 3's curves). A metric with no variation at all gives NaN.
* Direction: every r is reported so that *higher = the metric follows the criterion*. Criterion levels
  grow with quality (more coverage, more alignment). MaxAcc and Precision@K are higher-is-better and
  are correlated as they are; NKL and PPL are lower-is-better, so the correlation of their *negated*
  value is reported (equivalently, the sign of their raw correlation is flipped).
* Seeds: the trials of answer count ``n`` draw from ``numpy.random.default_rng([seed, n])``, so each
  count's result is fixed by (seed, n) alone, whichever other counts are run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from editscope.atomic import atomic_write
from editscope.errors import EditscopeError
from editscope.metrics._validate import fail, positive_int
from editscope.metrics.one_to_n import max_acc, nkl, perplexity, precision_at_k

__all__ = ["METRICS", "PAPER_TABLE2", "plot_simulation", "run_simulation"]

METRICS = ("NKL", "MaxAcc", "PrecisionK", "PPL")
# Metrics for which lower values are better: their correlation is reported negated.
_LOWER_IS_BETTER = {"NKL", "PPL"}

# Paper 000, Table 2 (Pearson correlations; criterion 1 / criterion 2).
PAPER_TABLE2: dict[str, dict[str, float]] = {
    "criterion1": {"NKL": 0.7352, "MaxAcc": 0.4030, "PrecisionK": 0.4537, "PPL": 0.3780},
    "criterion2": {"NKL": 0.7624, "MaxAcc": 0.1776, "PrecisionK": 0.2084, "PPL": 0.4285},
}


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean()
    y = y - y.mean()
    denom = math.sqrt(float(np.dot(x, x)) * float(np.dot(y, y)))
    if denom == 0.0:
        return float("nan")
    return float(np.clip(np.dot(x, y) / denom, -1.0, 1.0))


def _score(probs: np.ndarray, valid: np.ndarray, gold: np.ndarray, k: int, floor: float) -> tuple[float, ...]:
    """NKL, MaxAcc, Precision@K, PPL of one simulated distribution over the candidates."""
    logp = np.log(np.maximum(probs, floor))
    answers = [logp[i : i + 1] for i in np.flatnonzero(valid)]
    return (
        nkl(answers, gold),
        max_acc(logp, valid),
        precision_at_k(logp, valid, k),
        perplexity(answers),
    )


def _one_count(
    n: int, trials: int, seed: int, vocab: int, k: int, lambdas: np.ndarray, floor: float
) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng([seed, n])
    levels: dict[str, list[float]] = {"criterion1": [], "criterion2": []}
    values: dict[str, list[tuple[float, ...]]] = {"criterion1": [], "criterion2": []}
    for _ in range(trials):
        scores = rng.standard_normal(vocab)
        p_model = np.exp(scores - scores.max())
        p_model /= p_model.sum()
        answer_idx = rng.choice(vocab, size=n, replace=False)
        valid = np.zeros(vocab, dtype=bool)
        valid[answer_idx] = True
        idx = np.flatnonzero(valid)  # sorted: the order of the answers in every metric call
        gold = np.exp(scores[idx] - scores[idx].max())
        gold /= gold.sum()

        # Criterion 1: answer masking, most probable valid answer first.
        by_prob = idx[np.argsort(-p_model[idx], kind="stable")]
        for removed in range(n + 1):
            p = p_model.copy()
            p[by_prob[:removed]] = 0.0
            p /= p.sum()
            levels["criterion1"].append((n - removed) / n)
            values["criterion1"].append(_score(p, valid, gold, k, floor))

        # Criterion 2: linear interpolation from the gold distribution to the model's.
        gold_full = np.zeros(vocab)
        gold_full[idx] = gold
        for lam in lambdas:
            p = lam * gold_full + (1.0 - lam) * p_model
            levels["criterion2"].append(float(lam))
            values["criterion2"].append(_score(p, valid, gold, k, floor))

    out: dict[str, dict[str, float]] = {}
    for crit in ("criterion1", "criterion2"):
        lv = np.asarray(levels[crit])
        vals = np.asarray(values[crit])
        out[crit] = {}
        for j, name in enumerate(METRICS):
            sign = -1.0 if name in _LOWER_IS_BETTER else 1.0
            out[crit][name] = _pearson(lv, sign * vals[:, j])
    return out


def run_simulation(
    answers: Sequence[int] = (2, 4, 8, 16),
    trials: int = 200,
    seed: int = 0,
    *,
    vocab: int = 100,
    k: int = 3,
    lambdas: int = 11,
    mask_floor: float = 1e-10,
) -> dict[str, Any]:
    """Run the simulation of paper 000, section 4.2 (see the module docstring for every choice).

    Args:
        answers: numbers of valid answers per query (each >= 1 and < ``vocab``).
        trials: simulated queries per answer count.
        seed: base seed; answer count ``n`` uses ``default_rng([seed, n])``.
        vocab: number of candidate answers per query.
        k: the K of Precision@K.
        lambdas: number of interpolation weights, evenly spaced from 1 to 0 (>= 2).
        mask_floor: probability floor applied before taking logs (masked answers have probability 0).

    Returns:
        ``{"criterion1": {"NKL": r, "MaxAcc": r, "PrecisionK": r, "PPL": r}, "criterion2": {...},
        "by_answers": {"2": {"criterion1": {...}, "criterion2": {...}}, ...}}``. Each r is a Pearson
        correlation signed so that higher = the metric follows the criterion (lower-is-better metrics,
        NKL and PPL, are negated). The per-criterion numbers are the means over answer counts.
    """
    counts = [positive_int(a, "answers") for a in answers]
    if not counts:
        raise fail("answers", "is empty")
    if len(set(counts)) != len(counts):
        raise fail("answers", f"contains duplicates: {counts}")
    trials = positive_int(trials, "trials")
    vocab = positive_int(vocab, "vocab")
    k = positive_int(k, "k")
    n_lambdas = positive_int(lambdas, "lambdas")
    if n_lambdas < 2:
        raise fail("lambdas", "needs at least 2 interpolation weights")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise fail("seed", f"must be a non-negative integer, got {seed!r}")
    if not (isinstance(mask_floor, float | int) and 0 < mask_floor < 1):
        raise fail("mask_floor", f"must be in (0, 1), got {mask_floor!r}")
    for n in counts:
        if n >= vocab:
            raise fail("answers", f"{n} valid answers need a vocabulary larger than {vocab}")

    grid = np.linspace(1.0, 0.0, n_lambdas)
    by_answers = {
        str(n): _one_count(n, trials, int(seed), vocab, k, grid, float(mask_floor)) for n in counts
    }
    result: dict[str, Any] = {}
    for crit in ("criterion1", "criterion2"):
        result[crit] = {
            name: float(np.mean([by_answers[str(n)][crit][name] for n in counts])) for name in METRICS
        }
    result["by_answers"] = by_answers
    return result


def plot_simulation(result: dict[str, Any], path: str | Path, *, dpi: int = 150) -> Path:
    """Draw Figure 3 of paper 000: Pearson r of each metric against the number of valid answers, panel
    (a) for criterion 1 and (b) for criterion 2, to a PNG (matplotlib's Agg canvas, no display needed).

    Args:
        result: the dict returned by :func:`run_simulation`.
        path: output file; its extension names the format (``.png``, ``.pdf``, ``.svg``...), none is PNG. Written
            atomically at exactly this path (:func:`editscope.atomic.atomic_write`: a device or folder there is
            refused, not replaced).

    Returns:
        The path written (``path``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    try:
        by_answers = result["by_answers"]
        counts = sorted(by_answers, key=int)
    except (KeyError, TypeError, ValueError):
        raise fail("result", "expected the dict returned by run_simulation()") from None
    xs = [int(c) for c in counts]
    fig = Figure(figsize=(9.0, 3.6))
    FigureCanvasAgg(fig)
    titles = {"criterion1": "(a) Criterion 1: coverage", "criterion2": "(b) Criterion 2: alignment"}
    markers = {"NKL": "o", "MaxAcc": "s", "PrecisionK": "^", "PPL": "D"}
    labels = {"NKL": "NKL", "MaxAcc": "MaxAcc", "PrecisionK": "Precision@K", "PPL": "Perplexity"}
    axes = fig.subplots(1, 2, sharey=True)
    for ax, crit in zip(axes, ("criterion1", "criterion2"), strict=True):
        for name in METRICS:
            ys = [by_answers[c][crit][name] for c in counts]
            ax.plot(xs, ys, marker=markers[name], label=labels[name])
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("number of valid answers")
        ax.set_title(titles[crit])
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("Pearson correlation")
    axes[1].legend(loc="best", fontsize="small")
    fig.tight_layout()
    out = Path(path)
    kind = out.suffix[1:].lower() or "png"  # no extension: PNG at exactly the path given
    if kind not in fig.canvas.get_supported_filetypes():
        raise EditscopeError(f"{out}: cannot write a plot as {kind!r}; use .png, .pdf or .svg")
    return atomic_write(out, lambda tmp: fig.savefig(tmp, format=kind, dpi=dpi))
