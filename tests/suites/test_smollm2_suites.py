"""Suites on the real SmolLM2-135M around a real ROME edit (slow: one edit, ~30-60 s on 2 idle cores)."""

from __future__ import annotations

import pytest

from editscope.data import load_cases
from editscope.lm.engine import ScoringEngine
from editscope.suites import get_suite

pytestmark = pytest.mark.slow


def test_rome_edit_counterfact_metrics(smollm2):
    import dataclasses

    from editscope.edit import edited, get_editor

    # the shipped SmolLM2 hparams with 2 instead of 5 context prefixes (halves the edit's cost on CPU)
    hp = dataclasses.replace(get_editor("rome").load_hparams(smollm2), context_templates=[[10, 2]])

    engine = ScoringEngine(smollm2)
    suite = get_suite("counterfact")
    cases = load_cases("counterfact", limit=4)
    pre = suite.probe_many(engine, cases)
    pre_rows = [suite.metrics(c, p, p) for c, p in zip(cases, pre, strict=True)]
    # unedited model: the true answer beats the counterfactual on the neighbourhood prompts
    # (e.g. "Michel Rocard is a native speaker of" French rather than English)
    assert all(row["NS_pre"] == 1.0 for row in pre_rows)
    # case 0: "The mother tongue of Danielle Darrieux is" French (true) beats English (new) before the edit
    case = cases[0]
    assert pre_rows[0]["ES_pre"] == 0.0

    with edited(smollm2, "rome", case.request, hp):
        post = suite.probe(engine, case)
    row = suite.metrics(case, pre[0], post)
    assert row["ES_post"] == 1.0
    assert row["EM_post"] > 0.5  # P(English) - P(French) on the rewrite prompt, mean-token probabilities
    assert row["EasyEdit_rewrite_acc_post"] == 1.0
    assert row["NS_post"] == 1.0  # the neighbour's language is untouched
    # the edit was reverted: scores are back to the pre-edit ones
    again = suite.probe(engine, case)
    for a, b in zip(again["prompts"], pre[0]["prompts"], strict=True):
        for x, y in zip(a["candidates"], b["candidates"], strict=True):
            assert x["logprob_sum"] == pytest.approx(y["logprob_sum"], abs=1e-4)
