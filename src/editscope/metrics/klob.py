"""KLoB metrics for knowledge-locating methods: RSim and RSD (paper 001, section 3.4 and appendix A).

A *localization result* is a score per model parameter (or per neuron) for one sentence; any shape is
accepted and flattened. Locating methods then select the top k% of the N scores.

Choices where the paper is silent (documented so results are reproducible):

* Selection size: ``n_sel = max(1, round(N * k / 100))`` (Python's round-half-to-even); ``Sim`` divides
  the overlap by that same ``n_sel`` (the paper's ``N * k%``), so identical results have Sim = 1.
* Ties: scores are ranked by value, descending, with a stable sort -- equal scores are taken in index
  order. Scores are used as given (signed); take ``abs`` first if your method's sign is meaningless.
* Sim_all for a *group* of candidate results (e.g. the three sentences of a KLoB-c example) is the mean
  of Sim_all over the group's members.
* SD is the population standard deviation (``ddof=0``) of all scores of one result, no normalisation
  across sentences (the paper's reading; :func:`rsd`'s ``scale="l1"`` divides each result by its L1 norm first).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from editscope.metrics._validate import as_array, as_sequence, fail

__all__ = [
    "rsd",
    "rsd_from_sd",
    "rsim",
    "rsim_from_results",
    "sim",
    "sim_all",
    "sim_cand",
    "top_k_mask",
]


def _n_select(n: int, k_percent: float) -> int:
    return max(1, int(round(n * k_percent / 100.0)))


def _check_k(k_percent: float) -> float:
    k = float(as_array([k_percent], "k_percent", ndim=1)[0])
    if not 0 < k <= 100:
        raise fail("k_percent", f"must be in (0, 100], got {k_percent}")
    return k


def _result(x: ArrayLike, name: str) -> np.ndarray:
    return as_array(x, name).ravel()


def _top_index(scores: np.ndarray, k: float) -> np.ndarray:
    """Indices of the ``n_sel`` highest scores, ties taken in index order -- the same set as a stable
    descending sort, in O(N) (locating results can score every parameter of a model)."""
    n_sel = _n_select(scores.size, k)
    if n_sel >= scores.size:
        return np.arange(scores.size)
    threshold = np.partition(scores, scores.size - n_sel)[scores.size - n_sel]  # the n_sel-th largest
    above = np.flatnonzero(scores > threshold)
    tied = np.flatnonzero(scores == threshold)[: n_sel - above.size]
    return np.concatenate([above, tied])


def top_k_mask(scores: ArrayLike, k_percent: float) -> np.ndarray:
    """The top-k% selection of one localization result (paper 001, appendix A).

    Returns a flat boolean mask with ``max(1, round(N * k / 100))`` True entries at the highest scores
    (ties in index order).
    """
    s = _result(scores, "scores")
    k = _check_k(k_percent)
    mask = np.zeros(s.size, dtype=bool)
    mask[_top_index(s, k)] = True
    return mask


def _sim_masks(a: np.ndarray, b: np.ndarray, n_sel: int) -> float:
    return float(np.count_nonzero(a & b)) / n_sel


def sim(scores_a: ArrayLike, scores_b: ArrayLike, k_percent: float) -> float:
    """Similarity of two localization results (paper 001, appendix A): ``Sim = overlap_ij / (N * k%)``.

    ``overlap_ij`` is the number of parameters selected (top k%) in both results; both results must
    score the same N parameters.
    """
    a = _result(scores_a, "scores_a")
    b = _result(scores_b, "scores_b")
    if a.size != b.size:
        raise fail("scores_b", f"scores {b.size} parameters but scores_a scores {a.size}")
    k = _check_k(k_percent)
    return _sim_masks(top_k_mask(a, k), top_k_mask(b, k), _n_select(a.size, k))


def _results(results: Sequence[ArrayLike], name: str, min_len: int = 1) -> list[np.ndarray]:
    items = as_sequence(results, name, min_len=min_len)
    arrs = [_result(r, f"{name}[{i}]") for i, r in enumerate(items)]
    n = arrs[0].size
    for i, r in enumerate(arrs):
        if r.size != n:
            raise fail(f"{name}[{i}]", f"scores {r.size} parameters but {name}[0] scores {n}")
    return arrs


def sim_cand(candidates: Sequence[ArrayLike], k_percent: float) -> float:
    """Sim_cand (paper 001, appendix A): the mean pairwise Sim among the candidate results
    (e.g. the three sentences of one KLoB-c example). Needs at least two results."""
    arrs = _results(candidates, "candidates", min_len=2)
    k = _check_k(k_percent)
    n_sel = _n_select(arrs[0].size, k)
    masks = [top_k_mask(a, k) for a in arrs]
    return float(np.mean([_sim_masks(a, b, n_sel) for a, b in combinations(masks, 2)]))


def sim_all(
    candidates: Sequence[ArrayLike],
    pool: Sequence[ArrayLike],
    k_percent: float,
    *,
    method: Literal["approx", "exact"] = "approx",
) -> float:
    """Sim_all (paper 001, appendix A): similarity of the candidates to all results of the subtask.

    * ``method="exact"``: ``Sim_all = 1/M sum_{i=1}^M Sim(x_i, x_cand)`` over the M results of ``pool``
      (literally as defined, so a candidate that is itself in the pool contributes its Sim of 1 too);
    * ``method="approx"`` (the paper's shortcut, its default): ``Sim(x_all, x_cand)`` where ``x_all`` is
      the top-k% selection of the *mean* score over the pool.

    For several candidates the value is averaged over them.

    Args:
        candidates: the candidate localization results (one or more).
        pool: all localization results of the subtask (M >= 1), same parameter count.
        k_percent: the selected share k, in percent.
        method: ``"approx"`` or ``"exact"``.
    """
    cands = _results(candidates, "candidates")
    refs = _results(pool, "pool")
    if refs[0].size != cands[0].size:
        raise fail("pool", f"scores {refs[0].size} parameters but candidates score {cands[0].size}")
    k = _check_k(k_percent)
    n_sel = _n_select(cands[0].size, k)
    if method not in ("approx", "exact"):
        raise fail("method", f"must be 'approx' or 'exact', got {method!r}")
    cmasks = [top_k_mask(c, k) for c in cands]
    if method == "approx":
        total = np.zeros(refs[0].size)
        for r in refs:  # running sum: never stacks M x N scores
            total += r
        mean_mask = top_k_mask(total / len(refs), k)
        return float(np.mean([_sim_masks(mean_mask, c, n_sel) for c in cmasks]))
    sims = [_sim_masks(top_k_mask(r, k), c, n_sel) for r in refs for c in cmasks]
    return float(np.mean(sims))


def rsim(sim_cand_value: float, sim_all_value: float) -> float:
    """Relative Similarity (paper 001, section 3.4): ``RSim = max((Sim_cand - Sim_all) / (1 - Sim_all), 0)``.

    1 when the candidates are identical (Sim_cand = 1), 0 when Sim_cand <= Sim_all. Undefined when
    Sim_all = 1 (nothing can exceed the baseline): that raises.
    """
    vals = as_array([sim_cand_value, sim_all_value], "sim values", ndim=1)
    for name, v in zip(("sim_cand_value", "sim_all_value"), vals, strict=True):
        if v < 0 or v > 1:
            raise fail(name, f"must lie in [0, 1], got {v}")
    sc, sa = float(vals[0]), float(vals[1])
    if sa >= 1.0:
        raise fail("sim_all_value", "is 1: RSim = (Sim_cand - Sim_all) / (1 - Sim_all) is undefined")
    return max((sc - sa) / (1.0 - sa), 0.0)


def rsim_from_results(
    candidates: Sequence[ArrayLike],
    pool: Sequence[ArrayLike],
    k_percent: float,
    *,
    method: Literal["approx", "exact"] = "approx",
) -> float:
    """RSim of one candidate group straight from score vectors: :func:`sim_cand`, :func:`sim_all`,
    :func:`rsim` (paper 001, section 3.4 and appendix A)."""
    return rsim(sim_cand(candidates, k_percent), sim_all(candidates, pool, k_percent, method=method))


def rsd_from_sd(sd_factual: float, sd_nonfactual: float) -> float:
    """Relative Standard Deviation (paper 001, section 3.4): ``RSD = max(1 - SD_nonfactual / SD_factual, 0)``.

    1 when the non-factual scores are uniform (SD 0), 0 when they vary at least as much as the factual.
    """
    vals = as_array([sd_factual, sd_nonfactual], "sd values", ndim=1)
    if vals[1] < 0:
        raise fail("sd_nonfactual", f"must be >= 0, got {vals[1]}")
    if vals[0] <= 0:
        raise fail("sd_factual", f"must be > 0 (RSD divides by it), got {vals[0]}")
    return float(max(1.0 - vals[1] / vals[0], 0.0))


def _sd(result: np.ndarray, scale: str) -> float:
    if scale == "l1":
        total = float(np.abs(result).sum())
        return float(np.std(result / total)) if total > 0 else 0.0
    return float(np.std(result))


def rsd(factual: Sequence[ArrayLike], nonfactual: Sequence[ArrayLike], *,
        scale: Literal["raw", "l1"] = "raw") -> float:
    """RSD from localization results (paper 001, section 3.4).

    ``SD_factual`` is the mean, over the results of sentences with factual knowledge (KLoB-c and
    KLoB-r), of the standard deviation of each result's scores; ``SD_nonfactual`` the same over the
    KLoB-u results. Then :func:`rsd_from_sd`.

    ``scale``: ``"raw"`` (the paper) takes each result's scores as given; ``"l1"`` first divides each result by
    the sum of its absolute scores (an all-zero result keeps SD 0), so the SD measures how concentrated a result
    is, not how large its scores are. Scores in probability or gradient units shrink with the answer's
    probability, and a sentence whose answer is merely less likely then looks "uniform" on the raw scale.
    """
    if scale not in ("raw", "l1"):
        raise fail("scale", f"must be 'raw' or 'l1', got {scale!r}")
    fact = as_sequence(factual, "factual")
    non = as_sequence(nonfactual, "nonfactual")
    sd_f = float(np.mean([_sd(_result(r, f"factual[{i}]"), scale) for i, r in enumerate(fact)]))
    sd_n = float(np.mean([_sd(_result(r, f"nonfactual[{i}]"), scale) for i, r in enumerate(non)]))
    return rsd_from_sd(sd_f, sd_n)
