"""The pivot table from hand-made rows (pure: no model): best per column in the declared direction, paired
differences equal to a naive per-case computation, pairing by case id (not position), † exactly where the interval
excludes no change, PPL as a ratio of geometric means, and a named baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from editscope.errors import EditscopeError
from editscope.metrics.registry import MetricSpec, hmean_of
from editscope.report.pivot import build_pivot
from editscope.run.summary import summarize
from editscope.run.summary_tables import UNEDITED, fmt_mean_ci

SPECS = (
    MetricSpec("ES", "002", "eq 24", True, paper_scale=100),
    MetricSpec("NS", "002", "eq 26", True, paper_scale=100),
    MetricSpec("Score", "002", "app C", True, paper_scale=100, aggregate=hmean_of(["ES", "NS"])),
    MetricSpec("PPL", "000", "2.2 (3)", False, (1.0, math.inf), "ppl"),
    MetricSpec("RFF", "003", "eq 5", False, pairing="post_only"),
)
KEY = ("d", "s")
N = 8
RNG = np.random.default_rng(0)
PRE = {"ES": RNG.integers(0, 2, N) * 1.0, "NS": np.ones(N), "PPL": RNG.uniform(10, 20, N)}
POST = {
    "a": {"ES": np.ones(N), "NS": np.array([1, 1, 1, 0, 1, 1, 0, 1.0]), "PPL": PRE["PPL"] * RNG.uniform(1.2, 1.5, N),
          "RFF": RNG.uniform(0, 0.2, N)},
    "b": {"ES": np.array([1, 0, 1, 1, 0, 1, 1, 1.0]), "NS": np.ones(N), "PPL": PRE["PPL"] * RNG.uniform(0.99, 1.01, N),
          "RFF": RNG.uniform(0.3, 0.5, N)},
}


def rows(order_b: list[int] | None = None) -> list[dict]:
    out = []
    for m in ("a", "b"):
        for i in (order_b if m == "b" and order_b else range(N)):
            metrics = {f"{k}_pre": float(PRE[k][i]) for k in PRE}
            metrics |= {(k if k == "RFF" else f"{k}_post"): float(v[i]) for k, v in POST[m].items()}
            out.append({"dataset": "d", "case_id": f"c{i}", "method": m, "metrics": {"s": metrics}})
    return out


def pivot(rs, **kw):
    summary = summarize(rs, specs={KEY: SPECS}, method_order=["a", "b"])
    return build_pivot(rs, summary, {KEY: SPECS}, ["a", "b"], **kw)


def t_interval(d):
    d = np.asarray(d, dtype=float)
    half = st.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean(), d.mean() - half, d.mean() + half


def test_columns_rows_and_best_in_declared_direction():
    p = pivot(rows())
    assert [c.spec.name for c in p.columns] == ["ES", "NS", "Score", "PPL", "RFF"]
    assert p.rows == [UNEDITED, "a", "b"]
    best = {p.columns[j].spec.name: m for m, j in p.best}
    # ES: a 100 > b 75; NS: b 100 > a 75; PPL ↓: b (×1.0) below a (×1.35); RFF ↓: a's 0–0.2 below b's 0.3–0.5
    assert best["ES"] == "a" and best["NS"] == "b" and best["PPL"] == "b" and best["RFF"] == "a"
    assert (UNEDITED, 0) not in p.best  # the unedited model does not compete
    assert p.cells[(UNEDITED, 0)].metric == "ES_pre"
    assert p.cell_text(UNEDITED, 0).startswith(f"{100 * PRE['ES'].mean():.1f} ")


def test_difference_against_unedited_is_the_paired_t_interval():
    p = pivot(rows())
    d = p.diffs[("b", 0)]  # ES of b minus ES before the edit, per case
    mean, lo, hi = t_interval(POST["b"]["ES"] - PRE["ES"])
    assert (d.value, d.n) == (pytest.approx(mean), N)
    assert (d.low, d.high) == pytest.approx((max(lo, -1.0), min(hi, 1.0)))
    assert d.significant == (lo > 0 or hi < 0)
    assert p.diff_text("b", 0).endswith("†") == d.significant
    # PPL: ratio of geometric means, exp of the paired mean log difference; a's 1.2–1.5× is significant
    r = p.diffs[("a", 3)]
    mean, lo, hi = t_interval(np.log(POST["a"]["PPL"]) - np.log(PRE["PPL"]))
    assert r.ratio and (r.value, r.low, r.high) == pytest.approx((math.exp(mean), math.exp(lo), math.exp(hi)))
    assert r.significant and p.diff_text("a", 3).startswith("×") and p.diff_text("a", 3).endswith("†")
    # a post-only metric has no value before the edit: no difference against the unedited model
    assert ("a", 4) not in p.diffs and p.diff_text("a", 4) == ""


def test_named_baseline_pairs_by_case_id_not_position():
    shuffled = [3, 0, 7, 1, 5, 2, 6, 4]
    p = pivot(rows(order_b=shuffled), baseline="b")
    assert p.baseline == "b" and "b" in p.baseline_note
    assert ("b", 0) not in p.diffs  # the baseline itself
    d = p.diffs[("a", 4)]  # RFF: post-only, comparable between methods
    mean, lo, hi = t_interval(POST["a"]["RFF"] - POST["b"]["RFF"])
    assert (d.value, d.low, d.high) == pytest.approx((mean, lo, hi))
    assert d.significant and hi < 0
    # Score: aggregate of a's means minus b's, bootstrap over shared resamples of the cases
    s = p.diffs[("a", 2)]
    hm = lambda x, y: 2 / (1 / x + 1 / y)  # noqa: E731
    want = hm(POST["a"]["ES"].mean(), POST["a"]["NS"].mean()) - hm(POST["b"]["ES"].mean(), POST["b"]["NS"].mean())
    assert s.value == pytest.approx(want) and s.low <= s.value <= s.high


def test_model_level_suite_has_no_interval_and_no_dagger():
    p = pivot(rows(), model_level={KEY})
    d = p.diffs[("a", 3)]
    assert not d.interval and not d.significant and "[" not in p.diff_text("a", 3)
    assert "one measurement of the whole model" in p.baseline_note


def test_unknown_baseline_names_the_methods():
    with pytest.raises(EditscopeError, match=r"--baseline: no method 'rome'.*methods: a, b"):
        pivot(rows(), baseline="rome")


def test_chunks_keep_tables_narrow():
    p = pivot(rows())
    assert p.chunks(width=3) == [[0, 1, 2], [3, 4]] and p.chunks(width=6) == [[0, 1, 2, 3, 4]]


def test_all_metrics_cell_is_cut_to_range():
    summary = summarize(rows(), specs={KEY: SPECS})
    es = next(r for r in summary if r.method == "a" and r.metric == "NS_post")
    _, lo, hi = t_interval(POST["a"]["NS"])
    assert hi > 1 and es.ci95_high == 1.0 and es.ci95_low == pytest.approx(lo)
    assert fmt_mean_ci(es) == f"0.750 [{lo:.3f}, 1.000]"  # cut: no longer mean ± half


def test_difference_text_never_prints_a_bound_that_excludes_zero_as_zero():
    from editscope.report.pivot import Column, Diff, Pivot

    p = Pivot(UNEDITED, [Column("d", "s", SPECS[0]), Column("d", "s", SPECS[3])], ["a"])
    p.diffs[("a", 0)] = Diff(0.03, 0.0003, 0.0597, 300)  # ES share: 3.0 points, low bound 0.03 points
    p.diffs[("a", 1)] = Diff(1.004, 1.0001, 1.0079, 300, ratio=True)
    assert p.diff_text("a", 0) == "+3.0 [0.03, 6.0]†"
    assert p.diff_text("a", 1) == "×1.004 [1.0001, 1.008]†"
    p.diffs[("a", 0)] = Diff(-0.02, -0.05, 0.01, 300)
    assert p.diff_text("a", 0) == "−2.0 [−5.0, 1.0]"



def test_one_baseline_per_editor_pairs_each_method_with_its_own():
    # five methods of three editors: a+x and b+x are each compared with their own editor's a / b; c's editor has
    # no baseline named
    post = {"a": POST["a"], "b": POST["b"],
            "a+x": {k: v * 0.5 if k == "RFF" else v for k, v in POST["a"].items()},
            "b+x": {k: v + 0.1 if k == "RFF" else v for k, v in POST["b"].items()},
            "c": POST["b"]}
    editor = {"a": "ed_a", "a+x": "ed_a", "b": "ed_b", "b+x": "ed_b", "c": "ed_c"}
    rs = []
    for m, values in post.items():
        for i in range(N):
            metrics = {f"{k}_pre": float(PRE[k][i]) for k in PRE}
            metrics |= {(k if k == "RFF" else f"{k}_post"): float(v[i]) for k, v in values.items()}
            rs.append({"dataset": "d", "case_id": f"c{i}", "method": m, "editor": editor[m], "metrics": {"s": metrics}})
    methods = list(post)
    summary = summarize(rs, specs={KEY: SPECS}, method_order=methods)
    p = build_pivot(rs, summary, {KEY: SPECS}, methods, baseline="a, b")
    assert p.baseline == "a, b" and "own editor" in p.baseline_note
    assert not any((m, 4) in p.diffs for m in ("a", "b", "c"))  # the baselines, and c without one
    # RFF of a+x is half of a's per case; b+x's is b's plus 0.1: the naive per-case differences
    assert p.diffs[("a+x", 4)].value == pytest.approx((-0.5 * POST["a"]["RFF"]).mean())
    assert p.diffs[("b+x", 4)].value == pytest.approx(0.1)
    # one baseline alone still pairs every other method with it, whatever the editor
    single = build_pivot(rs, summary, {KEY: SPECS}, methods, baseline="a")
    assert single.diffs[("b+x", 4)].value == pytest.approx((post["b+x"]["RFF"] - POST["a"]["RFF"]).mean())
    assert single.diffs[("c", 4)].value == pytest.approx((POST["b"]["RFF"] - POST["a"]["RFF"]).mean())
    # two baselines of one editor are ambiguous; an unknown one names the methods
    with pytest.raises(EditscopeError, match=r"'a' and 'a\+x' are both ed_a methods"):
        build_pivot(rs, summary, {KEY: SPECS}, methods, baseline="a,a+x")
    with pytest.raises(EditscopeError, match=r"no method 'zzz'"):
        build_pivot(rs, summary, {KEY: SPECS}, methods, baseline="a,zzz")
