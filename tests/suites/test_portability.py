"""Portability suite: KnowEdit portability / locality / Edit_Succ / Rephrase under EasyEdit's
token-accuracy protocol, against a naive loop over ``model(tokens(prompt + " " + answer))`` as EasyEdit's
``test_prediction_acc`` computes it. Two tiny LLaMA models with different weights stand in for pre/post edit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from editscope.data import load_cases
from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.suites import get_suite

FIXTURE = Path(__file__).parent.parent / "fixtures" / "knowedit_small.json"


def naive_argmax(bundle, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """(answer token ids, argmax id at each answer position): one unbatched forward of prompt + " " + answer."""
    tok = bundle.tokenizer
    full = tok(prompt + " " + answer)["input_ids"]
    n_ctx = len(tok(prompt)["input_ids"])
    assert full[:n_ctx] == tok(prompt)["input_ids"]
    with torch.no_grad():
        logits = bundle.model(input_ids=torch.tensor([full], device=bundle.device)).logits[0]
    return full[n_ctx:], [int(logits[j - 1].argmax()) for j in range(n_ctx, len(full))]


def naive_row(pre_bundle, post_bundle, case) -> dict[str, float]:
    def acc(bundle, prompt, answer):
        target, argmax = naive_argmax(bundle, prompt, answer)
        return float(np.mean([a == t for a, t in zip(argmax, target, strict=True)]))

    row = {}
    for tag, bundle in (("pre", pre_bundle), ("post", post_bundle)):
        row[f"Edit_Succ_{tag}"] = acc(bundle, case.request.text, case.request.target_new)
        if case.paraphrase_prompts:
            row[f"Rephrase_{tag}"] = float(np.mean([acc(bundle, p, case.request.target_new)
                                                    for p in case.paraphrase_prompts]))
        types = case.extra["portability"]
        for kind, items in types.items():
            row[f"Portability_{kind}_{tag}"] = float(np.mean([acc(bundle, p, a) for p, a in items]))
        if types:
            row[f"Portability_{tag}"] = float(np.mean([row[f"Portability_{k}_{tag}"] for k in types]))
    for kind, items in case.extra["locality"].items():
        shares = []
        for p, a in items:
            _, before = naive_argmax(pre_bundle, p, a)
            _, after = naive_argmax(post_bundle, p, a)
            shares.append(float(np.mean([x == y for x, y in zip(before, after, strict=True)])))
        row[f"Locality_{kind}"] = float(np.mean(shares))
    row["Locality"] = float(np.mean([row[f"Locality_{k}"] for k in case.extra["locality"]]))
    return row


def test_values_equal_a_naive_loop(tiny_pair):
    pre_bundle, post_bundle = tiny_pair
    cases = load_cases(FIXTURE)
    suite = get_suite("portability")
    pre = suite.probe_many(ScoringEngine(pre_bundle), cases)
    post = suite.probe_many(ScoringEngine(post_bundle), cases)
    changed = 0
    for case, a, b in zip(cases, pre, post, strict=True):
        got = suite.checked_metrics(case, a, b)
        want = naive_row(pre_bundle, post_bundle, case)
        assert set(got) == set(want), case.case_id
        for key, value in want.items():
            assert got[key] == pytest.approx(value, abs=1e-9), (case.case_id, key)
        changed += sum(got[k] < 1 for k in got if k.startswith("Locality"))
    assert changed  # the two models disagree somewhere: locality is not trivially 1


def test_same_model_has_full_locality_and_protocol_label(tiny_bundles):
    bundle = tiny_bundles["gpt2"]
    cases = load_cases(FIXTURE)
    suite = get_suite("portability")
    probes = suite.probe_many(ScoringEngine(bundle), cases)
    for case, probe in zip(cases, probes, strict=True):
        row = suite.metrics(case, probe, probe)
        assert all(row[k] == 1.0 for k in row if k.startswith("Locality"))
        assert row["Portability_pre"] == row["Portability_post"]
    assert suite.protocol["name"] == "easyedit token accuracy"


def test_cases_without_knowedit_fields_fail(tiny_pair):
    case = Case("cf-0", "counterfact", (EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),))
    with pytest.raises(EditscopeError, match="no KnowEdit portability/locality"):
        get_suite("portability").probe(ScoringEngine(tiny_pair[0]), case)
