"""The paper-style compact table from hand-made rows: paper units, the unedited row from NAME_pre, intervals only
for n >= 5 and clipped to the declared range, PPL as a geometric mean (pure: no model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from editscope.metrics.registry import MetricSpec
from editscope.run.summary import summarize
from editscope.run.summary_tables import compact_table

SPECS = (
    MetricSpec("ES", "002", "eq 24", True, paper_scale=100),
    MetricSpec("EM", "002", "magnitude", True, (-1.0, 1.0), "prob-diff", 100, headline=False),
    MetricSpec("PPL", "000", "2.2 (3)", False, (1.0, math.inf), "ppl"),
    MetricSpec("n_prompts", "003", "filter", None, (0.0, math.inf), "count", pairing="post_only"),
)


def rows(n: int, es_post, ppl_post) -> list[dict]:
    return [{"dataset": "d", "case_id": str(i), "method": "rome",
             "metrics": {"s": {"ES_pre": 0.0, "ES_post": es_post[i], "EM_pre": 0.0, "EM_post": 0.1,
                               "PPL_pre": 10.0, "PPL_post": ppl_post[i], "n_prompts": 3}}} for i in range(n)]


def table(rs):
    summary = summarize(rs, specs={("d", "s"): SPECS})
    return compact_table(summary, ["rome"], SPECS)


def test_columns_units_and_unedited_row():
    t = table(rows(3, [1.0, 1.0, 0.0], [1e2, 1e4, 1e6]))
    headers, body, notes = t.headers, t.rows, t.notes
    assert headers == ["method", "n", "ES ↑ (%)", "PPL ↓ (ppl)"]  # headline metrics with a direction only
    assert body[0] == ["unedited", "3", "0.0", "10.00"]
    # 2/3 as a percentage; geometric mean of 1e2, 1e4, 1e6 = 1e4 (the arithmetic mean would be 336,700)
    assert body[1] == ["rome", "3", "66.7", "10000.0"]
    assert any("Anecdotal" in n for n in notes) and any("geometric mean" in n for n in notes)


def test_interval_clipped_to_range_from_five_cases():
    es = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    t = table(rows(6, es, [5.0] * 6))
    body, notes = t.rows, t.notes
    half = st.t.ppf(0.975, 5) * np.std(es, ddof=1) / math.sqrt(6)
    mean = np.mean(es)
    assert mean + half > 1  # the t interval leaves [0, 1]: clipped at 100
    assert body[1][2] == f"{100 * mean:.1f} [{100 * (mean - half):.1f}, 100.0]"
    assert not any("Anecdotal" in n for n in notes)


def test_symmetric_interval_when_inside_range():
    es = [0.0, 1.0] * 5
    body = table(rows(10, es, [5.0] * 10)).rows
    half = st.t.ppf(0.975, 9) * np.std(es, ddof=1) / math.sqrt(10)
    assert body[1][2] == f"50.0 ± {100 * half:.1f}"
    assert body[1][3].startswith("5.00 [")  # log-scale interval: asymmetric, printed as [lo, hi]


def test_ppl_geometric_mean_in_summary():
    summary = summarize(rows(3, [1.0] * 3, [1e2, 1e4, 1e6]), specs={("d", "s"): SPECS})
    ppl = next(r for r in summary if r.metric == "PPL_post")
    assert ppl.mean == pytest.approx(1e4) and ppl.ci == "t-log"
