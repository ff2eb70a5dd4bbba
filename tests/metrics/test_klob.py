"""KLoB Sim / RSim / RSD (paper 001, section 3.4 and appendix A)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from editscope.metrics import rsd, rsd_from_sd, rsim, rsim_from_results, sim, sim_all, sim_cand, top_k_mask

A = [5, 4, 3, 2, 1, 0, 0, 0, 0, 0]  # top-30% (3 of 10) = {0, 1, 2}
B = [0, 4, 5, 0, 0, 0, 0, 0, 3, 0]  # top-3 = {2, 1, 8}
D = [0, 0, 0, 0, 0, 0, 0, 3, 4, 5]  # top-3 = {9, 8, 7}


def test_top_k_mask_size_and_ties():
    scores = [0.1, 0.9, 0.5, 0.9, 0.2]
    assert np.flatnonzero(top_k_mask(scores, 40)).tolist() == [1, 3]  # round(5 * 0.4) = 2
    assert np.flatnonzero(top_k_mask(scores, 60)).tolist() == [1, 2, 3]  # 3 selected
    assert np.flatnonzero(top_k_mask([1.0, 1.0, 1.0], 34)).tolist() == [0]  # tie -> index order
    assert top_k_mask(np.ones((2, 3)), 1).sum() == 1  # at least one; 2-D flattened


def test_sim_and_sim_cand_by_hand():
    assert sim(A, B, 30) == pytest.approx(2 / 3)  # overlap {1, 2} / 3
    # pairs (A, B) = 2/3, (A, A) = 1, (B, A) = 2/3 -> 7/9
    assert sim_cand([A, B, A], 30) == pytest.approx(7 / 9)


def test_sim_all_exact_and_approx_by_hand():
    # exact: (Sim(A, A) + Sim(A, B) + Sim(A, D)) / 3 = (1 + 2/3 + 0) / 3 = 5/9
    assert sim_all([A], [A, B, D], 30, method="exact") == pytest.approx(5 / 9)
    # approx: mean scores = [5/3, 8/3, 8/3, 2/3, 1/3, 0, 0, 1, 7/3, 5/3] -> top-3 {1, 2, 8}; Sim with A = 2/3
    assert sim_all([A], [A, B, D], 30) == pytest.approx(2 / 3)
    # two candidates: mean over them; exact: (5/9 + (2/3 + 1 + 1/3) / 3) / 2
    assert sim_all([A, B], [A, B, D], 30, method="exact") == pytest.approx((5 / 9 + 2 / 3) / 2)


def test_rsim_by_hand():
    assert rsim(0.8, 0.5) == pytest.approx(0.6)  # (0.8 - 0.5) / (1 - 0.5)
    assert rsim(0.4, 0.5) == 0.0
    # candidates A, A: Sim_cand = 1, Sim_all (approx, pool A, B, D) = 2/3 -> RSim = 1
    assert rsim_from_results([A, A], [A, B, D], 30) == pytest.approx(1.0)
    # candidates A, B: Sim_cand = 2/3; Sim_all exact = (5/9 + 2/3) / 2 = 11/18 -> (12/18 - 11/18) / (7/18) = 1/7
    assert rsim_from_results([A, B], [A, B, D], 30, method="exact") == pytest.approx(1 / 7)
    with pytest.raises(ValueError, match="^sim_all_value"):
        rsim(1.0, 1.0)


def test_rsd_by_hand():
    # SD_factual = mean(std([1, 3]), std([0, 4])) = mean(1, 2) = 1.5; SD_nonfactual = mean(0.25, 0.25)
    assert rsd([[1, 3], [0, 4]], [[2, 2.5], [1, 1.5]]) == pytest.approx(1 - 0.25 / 1.5)
    assert rsd_from_sd(1.0, 2.0) == 0.0
    with pytest.raises(ValueError, match="^sd_factual"):
        rsd([[1, 1]], [[1, 2]])


def test_rsd_l1_scale_by_hand():
    # each result over its L1 norm: [1,3]/4 -> SD 0.25, [0,4]/4 -> 0.5; [2,2.5]/4.5 -> SD 0.25/4.5, [1,1.5]/2.5 -> 0.1
    sd_n = (0.25 / 4.5 + 0.1) / 2
    assert rsd([[1, 3], [0, 4]], [[2, 2.5], [1, 1.5]], scale="l1") == pytest.approx(1 - sd_n / 0.375)
    # scale-free: nonfactual scores 100x larger change the paper's raw RSD (to 0) but not the l1 one
    big = [[200, 250], [100, 150]]
    assert rsd([[1, 3], [0, 4]], big) == 0.0
    assert rsd([[1, 3], [0, 4]], big, scale="l1") == pytest.approx(1 - sd_n / 0.375)
    assert rsd([[1, 3]], [[0, 0]], scale="l1") == 1.0  # an all-zero result is uniform
    with pytest.raises(ValueError, match="^scale"):
        rsd([[1, 3]], [[1, 2]], scale="max")


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: sim(A, B[:5], 30), "scores_b"),
        (lambda: sim(A, B, 0), "k_percent"),
        (lambda: sim(A, B, 150), "k_percent"),
        (lambda: sim([], [], 30), "scores_a"),
        (lambda: sim_cand([A], 30), "candidates"),
        (lambda: sim_cand([A, [np.nan] * 10], 30), r"candidates\[1\]"),
        (lambda: sim_all([A], [B[:3]], 30), "pool"),
        (lambda: sim_all([A], [B], 30, method="median"), "method"),
        (lambda: rsim(1.2, 0.5), "sim_cand_value"),
        (lambda: rsd([], [[1, 2]]), "factual"),
    ],
)
def test_bad_inputs_name_the_argument(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


scores = arrays(np.float64, st.integers(10, 40), elements=st.floats(-5, 5, allow_nan=False))


@settings(max_examples=40, deadline=None)
@given(scores, st.integers(0, 2**31 - 1), st.sampled_from([10.0, 25.0, 50.0]), st.sampled_from(["approx", "exact"]))
def test_rsim_is_one_for_identical_results(x, seed, k, method):
    rng = np.random.default_rng(seed)
    pool = [x] + [rng.standard_normal(x.size) for _ in range(4)]
    assume(sim_all([x, x], pool, k, method=method) < 1.0)
    assert rsim_from_results([x, x, x], pool, k, method=method) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 1), st.floats(0, 0.999))
def test_rsim_is_zero_when_sim_cand_not_above_sim_all(a, b):
    sa = b
    sc = a * b  # <= Sim_all
    assert rsim(sc, sa) == 0.0
    assert 0.0 <= rsim(a, b) <= 1.0


@settings(max_examples=40, deadline=None)
@given(st.lists(arrays(np.float64, 8, elements=st.floats(-3, 3)), min_size=1, max_size=4),
       st.lists(st.floats(-3, 3), min_size=1, max_size=4))
def test_rsd_is_one_when_nonfactual_scores_are_uniform(factual, constants):
    assume(np.mean([np.std(f) for f in factual]) > 1e-9)
    nonfactual = [np.full(8, c) for c in constants]
    assert rsd(factual, nonfactual) == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 30), elements=st.sampled_from([0.0, 1.0, 2.0, 3.5])), st.floats(0.5, 100))
def test_top_k_selection_equals_a_stable_descending_sort(x, k):
    n_sel = max(1, round(x.size * k / 100))
    expected = np.zeros(x.size, dtype=bool)
    expected[np.argsort(-x, kind="stable")[:n_sel]] = True
    assert np.array_equal(top_k_mask(x, k), expected)
