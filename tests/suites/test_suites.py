"""Suites on a tiny model against metrics computed from naive per-pair forwards; JSON round trips; registry.

"pre" and "post" are two tiny LLaMA models with different random weights, so every metric compares two
genuinely different score sets. Reference log-probs come from ``naive_logprobs`` (one plain transformers
forward per pair, tests/lm/test_engine.py), the metric values from ``editscope.metrics`` directly.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from editscope import metrics as M
from editscope.data import load_cases
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.suites import SUITES, Suite, get_suite
from tests.lm.test_engine import naive_logprobs as _naive_logprobs

pytestmark = pytest.mark.usefixtures("private_home")

_NAIVE: dict = {}


def naive_logprobs(bundle, context: str, continuation: str) -> list[float]:
    """The engine tests' naive reference, memoised within this test module (pairs repeat across tests)."""
    key = ("lp", id(bundle), context, continuation)
    if key not in _NAIVE:
        _NAIVE[key] = _naive_logprobs(bundle, context, continuation)
    return _NAIVE[key]


def trimmed(case, n: int = 4):
    """A real case with its answer lists and neighbourhood cut to ``n`` entries (keeps naive checks fast)."""
    return dataclasses.replace(case, valid_answers=case.valid_answers[:n], hard_false=case.hard_false[:n],
                               random_false=case.random_false[:n], neighborhood=case.neighborhood[:n])


def cases_of(dataset: str, limit: int = 2, offset: int = 0):
    return [trimmed(c) for c in load_cases(dataset, limit=limit, offset=offset)]


def naive_argmax(bundle, context: str, continuation: str) -> list[bool]:
    """Per continuation token: is it the argmax of a plain full forward (boundary rule applied by hand)."""
    key = ("argmax", id(bundle), context, continuation)
    if key not in _NAIVE:
        _NAIVE[key] = _naive_argmax(bundle, context, continuation)
    return _NAIVE[key]


def _naive_argmax(bundle, context: str, continuation: str) -> list[bool]:
    tok = bundle.tokenizer
    if context.endswith(" "):
        context, continuation = context[:-1], " " + continuation
    elif not continuation.startswith(" "):
        continuation = " " + continuation
    ctx = tok(context)["input_ids"]
    whole = tok(context + continuation)["input_ids"]
    with torch.no_grad():
        logits = bundle.model(torch.tensor([whole], device=bundle.device)).logits[0]
    return [int(logits[len(ctx) - 1 + j].argmax()) == whole[len(ctx) + j] for j in range(len(whole) - len(ctx))]


def naive_nll(bundle, prompt: str, answer: str) -> float:
    lps = naive_logprobs(bundle, prompt, answer)
    return -float(np.mean(lps))


_PROBES: dict = {}


def run(suite, pair, cases):
    """Pre/post probes of ``cases`` (memoised per suite configuration and case ids within this module)."""
    key = (suite.name, getattr(suite, "generation", None), tuple(c.case_id for c in cases), cases[0].source,
           id(pair[0]))
    if key not in _PROBES:
        _PROBES[key] = _run(suite, pair, cases)
    return _PROBES[key]


def _run(suite, pair, cases):
    pre_bundle, post_bundle = pair
    pre = suite.probe_many(ScoringEngine(pre_bundle), cases)
    post = suite.probe_many(ScoringEngine(post_bundle), cases)
    return pre, post


def roundtrip(obj):
    return json.loads(json.dumps(obj))


def assert_rows_close(row, expected, atol=1e-6):
    for key, value in expected.items():
        assert key in row, key
        assert row[key] == pytest.approx(value, abs=atol), key


# ----------------------------------------------------------------------------------------- CounterFact


def counterfact_expected(bundle, case) -> dict[str, float]:
    req = case.request
    new, true = req.target_new, req.target_true
    rw = [req.text]
    para = case.paraphrase_prompts
    neigh = case.neighborhood

    def nlls(prompts, a_new, answers):
        return (np.array([naive_nll(bundle, p, a_new) for p in prompts]),
                np.array([naive_nll(bundle, p, a) for p, a in zip(prompts, answers, strict=True)]))

    e_new, e_true = nlls(rw, new, [true])
    p_new, p_true = nlls(para, new, [true] * len(para))
    n_new, n_true = nlls([p for p, _ in neigh], new, [a for _, a in neigh])
    es = M.efficacy_success(e_new, e_true)
    ps = M.paraphrase_success(p_new, p_true)
    ns = M.neighborhood_success(n_new, n_true)
    return {
        "ES": es, "PS": ps, "NS": ns,
        "EM": M.efficacy_magnitude(e_new, e_true), "PM": M.paraphrase_magnitude(p_new, p_true),
        "NM": M.neighborhood_magnitude(n_new, n_true),
        "EasyEdit_rewrite_acc": M.easyedit_token_accuracy([naive_argmax(bundle, p, new) for p in rw]),
        "EasyEdit_rephrase_acc": M.easyedit_token_accuracy([naive_argmax(bundle, p, new) for p in para]),
    }


@pytest.mark.parametrize("dataset", ["counterfact", "zsre"])
def test_counterfact_equals_naive(tiny_pair, dataset):
    cases = cases_of(dataset)
    suite = get_suite("counterfact")
    pre, post = run(suite, tiny_pair, cases)
    for case, a, b in zip(cases, pre, post, strict=True):
        row = suite.metrics(case, a, b)
        assert_rows_close(row, {f"{k}_post": v for k, v in counterfact_expected(tiny_pair[1], case).items()})
        assert_rows_close(row, {f"{k}_pre": v for k, v in counterfact_expected(tiny_pair[0], case).items()})
        assert not any(k.startswith("Score") for k in row)  # the Score is computed by the summary
        # the raw numbers themselves equal the naive forward
        for prompt in b["prompts"]:
            for cand in prompt["candidates"]:
                ref = naive_logprobs(tiny_pair[1], prompt["prompt"], cand["text"])
                np.testing.assert_allclose(cand["token_logprobs"], ref, atol=1e-4)
                assert cand["logprob_sum"] == pytest.approx(sum(ref), abs=1e-4)


def test_counterfact_probe_layout(tiny_pair):
    case = load_cases("counterfact", limit=1)[0]
    probe = get_suite("counterfact").probe(ScoringEngine(tiny_pair[0]), case)
    roles = [p["role"] for p in probe["prompts"]]
    assert roles == ["rewrite"] + ["paraphrase"] * len(case.paraphrase_prompts) + \
        ["neighborhood"] * len(case.neighborhood)
    assert [(c["text"], c["kind"]) for c in probe["prompts"][0]["candidates"]] == [
        (case.request.target_new, "new"), (case.request.target_true, "true")]
    cand = probe["prompts"][0]["candidates"][0]
    assert set(cand) == {"text", "kind", "logprob_sum", "n_tokens", "token_logprobs", "token_is_argmax"}
    assert cand["n_tokens"] == len(cand["token_logprobs"]) == len(cand["token_is_argmax"])


def test_counterfact_generation_ge_rs(tiny_pair):
    case = load_cases("counterfact", limit=1)[0]
    suite = get_suite("counterfact", generation=True, max_new_tokens=8)
    pre, post = run(suite, tiny_pair, [case])
    gen = post[0]["generation"]
    assert gen["prompts"] == [case.request.text, *case.paraphrase_prompts]
    assert len(gen["texts"]) == len(gen["prompts"])
    assert gen["reference"] and case.request.target_new in gen["reference"]  # "English" is in wikitext
    row = suite.metrics(case, pre[0], post[0])
    assert row["GE_post"] == pytest.approx(M.generation_entropy(gen["texts"]))
    assert row["RS_post"] == pytest.approx(M.reference_score(gen["texts"], gen["reference"], suite.vectorizer()))
    # a fresh suite reads the TF-IDF cache from disk and gives the same RS
    again = get_suite("counterfact", generation=True)
    assert again.metrics(case, roundtrip(pre[0]), roundtrip(post[0])) == row
    # the same seed gives the same texts through probe() and probe_many()
    assert suite.probe(ScoringEngine(tiny_pair[1]), case)["generation"]["texts"] == gen["texts"]


# ---------------------------------------------------------------------------------------------- zsRE


def test_zsre_equals_naive(tiny_pair):
    cases = cases_of("zsre")
    suite = get_suite("zsre")
    pre, post = run(suite, tiny_pair, cases)
    for case, a, b in zip(cases, pre, post, strict=True):
        row = suite.metrics(case, a, b)
        for bundle, suffix in ((tiny_pair[1], "_post"), (tiny_pair[0], "_pre")):
            new = case.extra["answers"][0]  # MEMIT's edit target (the default, option target: answers0)
            eff = M.zsre_efficacy([naive_argmax(bundle, case.request.text, new)])
            par = M.zsre_paraphrase([naive_argmax(bundle, p, new) for p in case.paraphrase_prompts])
            spe = M.zsre_specificity([naive_argmax(bundle, p + "?", ans) for p, ans in case.neighborhood])
            assert_rows_close(row, {f"Efficacy{suffix}": eff, f"Paraphrase{suffix}": par,
                                    f"Specificity{suffix}": spe})
        assert row["Specificity_delta"] == pytest.approx(row["Specificity_post"] - row["Specificity_pre"])


def test_zsre_top1_is_per_token_mean():
    """A hand-made probe: 2 of 3 tokens right on the edit prompt -> Efficacy 2/3; paraphrases averaged."""
    def cand(flags, kind):
        return {"text": "x", "kind": kind, "logprob_sum": -1.0, "n_tokens": len(flags),
                "token_logprobs": [-1.0 / len(flags)] * len(flags), "token_is_argmax": flags}
    probe = {"prompts": [
        {"prompt": "q", "role": "rewrite", "candidates": [cand([True, False, True], "new")]},
        {"prompt": "p1", "role": "paraphrase", "candidates": [cand([True], "new")]},
        {"prompt": "p2", "role": "paraphrase", "candidates": [cand([False, False], "new")]},
        {"prompt": "n", "role": "neighborhood", "candidates": [cand([True, True], "true")]},
    ]}
    case = load_cases("zsre", limit=1)[0]
    row = get_suite("zsre").metrics(case, probe, probe)
    assert row["Efficacy_post"] == row["Efficacy_pre"] == pytest.approx(2 / 3)
    assert row["Paraphrase_post"] == pytest.approx(0.5)
    assert row["Specificity_post"] == 1.0 and row["Specificity_delta"] == 0.0
    assert "Score_post" not in row  # an aggregate: computed by the summary from the dataset-level means


# ---------------------------------------------------------------------------------------------- PEAK


def peak_lists(case):
    new = case.request.target_new
    correct = [a for i, a in enumerate(case.valid_answers) if a != new and a not in case.valid_answers[:i]]
    hard = [a for i, a in enumerate(case.hard_false)
            if a not in correct and a != new and a not in case.hard_false[:i]]
    rnd = [a for i, a in enumerate(case.random_false)
           if a not in correct and a != new and a not in case.random_false[:i]]
    return correct, hard, rnd


def peak_expected(pre_b, post_b, case) -> dict[str, float]:
    correct, hard, rnd = peak_lists(case)
    new = case.request.target_new

    def p(bundle, prompt, answers):
        return np.array([np.exp(-naive_nll(bundle, prompt, a)) for a in answers])

    prompts = [case.request.text, *case.paraphrase_prompts]
    out: dict[str, float] = {}
    post_new = [p(post_b, q, [new])[0] for q in prompts]
    post_cor = [p(post_b, q, correct) for q in prompts]
    out["ES_unfiltered_post"] = M.appending_efficacy(post_new[:1], post_cor[:1])
    out["GS_unfiltered_post"] = M.appending_generalization(post_new[1:], post_cor[1:])
    kept = [M.peak_answer_filter(p(pre_b, q, correct), p(pre_b, q, hard), p(pre_b, q, rnd))[0] for q in prompts]
    if kept[0].size:
        out["ES_post"] = M.appending_efficacy(post_new[:1], [post_cor[0][kept[0]]])
    para = [i for i in range(1, len(prompts)) if kept[i].size]
    if para:
        out["GS_post"] = M.appending_generalization([post_new[i] for i in para],
                                                    [post_cor[i][kept[i]] for i in para])
    out["LS_post"] = M.appending_locality([p(post_b, q, [a])[0] for q, a in case.neighborhood],
                                     [p(post_b, q, [new])[0] for q, _ in case.neighborhood])
    per = {"hard": [], "random": []}
    for q in prompts:
        pc, ph, pr = p(pre_b, q, correct), p(pre_b, q, hard), p(pre_b, q, rnd)
        qc, qh, qr = p(post_b, q, correct), p(post_b, q, hard), p(post_b, q, rnd)
        kc, kh, kr = M.peak_answer_filter(pc, ph, pr)
        if kc.size == 0:
            continue
        if kh.size:
            per["hard"].append(M.additivity(pc[kc], qc[kc], ph[kh], qh[kh]))
        if kr.size:
            per["random"].append(M.additivity(pc[kc], qc[kc], pr[kr], qr[kr]))
    for setting, vals in per.items():
        out[f"n_prompts_{setting}"] = len(vals)
        for key in ("RFF", "RNF", "CPC", "FPC", "AFF", "ANF"):
            if vals:
                out[f"{key}_{setting}"] = float(np.mean([v[key] for v in vals]))
    return out


@pytest.mark.parametrize("dataset", ["peak-cf", "peak-t"])
def test_peak_equals_naive(tiny_pair, dataset):
    cases = cases_of(dataset)
    case = cases[0]
    suite = get_suite("peak")
    pre, post = run(suite, tiny_pair, cases)
    row = suite.metrics(case, pre[0], post[0])
    expected = peak_expected(*tiny_pair, case)
    assert_rows_close(row, expected)
    for setting in ("hard", "random"):
        if expected[f"n_prompts_{setting}"] == 0:
            assert f"AFF_{setting}" not in row


def test_peak_overlapping_answers_are_dropped(tiny_pair):
    """PEAK-CF record 220 shares answers between the positive and the hard negative list."""
    case = load_cases("peak-cf", offset=220, limit=1)[0]
    overlap = set(case.valid_answers) & set(case.hard_false)
    assert overlap
    probe = get_suite("peak").probe(ScoringEngine(tiny_pair[0]), case)
    rewrite = probe["prompts"][0]
    hard = [c["text"] for c in rewrite["candidates"] if c["kind"] == "hard_false"]
    correct = [c["text"] for c in rewrite["candidates"] if c["kind"] == "correct"]
    assert not overlap & set(hard)
    assert overlap <= set(correct)
    assert (correct, hard) == peak_lists(case)[:2]


def test_peak_filter_and_prob_options():
    """Hand-made probabilities: the filter drops what PEAK drops; prob='sum' vs 'mean' differ on long answers."""
    def cand(text, kind, lp, n=1):
        return {"text": text, "kind": kind, "logprob_sum": lp, "n_tokens": n,
                "token_logprobs": [lp / n] * n, "token_is_argmax": [False] * n}
    ln = np.log
    pre = {"prompts": [{"prompt": "q", "role": "rewrite", "candidates": [
        cand("a", "correct", ln(0.5)), cand("b", "correct", ln(0.01)),  # b is below both hard answers
        cand("h1", "hard_false", ln(0.05)), cand("h2", "hard_false", ln(0.02)),
        cand("r1", "random_false", ln(0.001)), cand("r2", "random_false", ln(0.6)),  # r2 above min kept
        cand("o*", "new", ln(0.001))]}]}
    post = {"prompts": [{"prompt": "q", "role": "rewrite", "candidates": [
        cand("a", "correct", ln(0.2)), cand("b", "correct", ln(0.3)),
        cand("h1", "hard_false", ln(0.3)), cand("h2", "hard_false", ln(0.01)),
        cand("r1", "random_false", ln(0.002)), cand("r2", "random_false", ln(0.1)),
        cand("o*", "new", ln(0.4))]}]}
    case = load_cases("peak-cf", limit=1)[0]
    row = get_suite("peak").metrics(case, pre, post)
    # kept: correct {a}; hard {h1, h2} (< 0.5); random {r1}
    exp_h = M.additivity([0.5], [0.2], [0.05, 0.02], [0.3, 0.01])
    exp_r = M.additivity([0.5], [0.2], [0.001], [0.002])
    assert_rows_close(row, {f"{k}_hard": v for k, v in exp_h.items()})
    assert_rows_close(row, {f"{k}_random": v for k, v in exp_r.items()})
    assert row["ES_post"] == 1.0 and row["ES_pre"] == 0.0  # over kept O = {a}: 0.4 > 0.2; 0.001 < 0.5
    assert row["ES_unfiltered_post"] == 1.0 and row["ES_unfiltered_pre"] == 0.0  # 0.4 > min(0.2, 0.3); 0.001 < 0.01
    # o* above the dropped answer b but below the kept a: fails on the filtered O only
    changed = json.loads(json.dumps(post))
    changed["prompts"][0]["candidates"][1] = cand("b", "correct", ln(0.05))
    changed["prompts"][0]["candidates"][6] = cand("o*", "new", ln(0.1))
    row2 = get_suite("peak").metrics(case, pre, changed)
    assert row2["ES_post"] == 0.0 and row2["ES_unfiltered_post"] == 1.0
    unfiltered = get_suite("peak", filter_answers=False).metrics(case, pre, post)
    exp_u = M.additivity([0.5, 0.01], [0.2, 0.3], [0.05, 0.02], [0.3, 0.01])
    assert_rows_close(unfiltered, {f"{k}_hard": v for k, v in exp_u.items()})
    # a 2-token answer: mean gives exp(lp/2), sum gives exp(lp)
    c = [cand("x", "correct", 2 * ln(0.5), n=2)]
    assert get_suite("peak").probs(c)[0] == pytest.approx(0.5)
    assert get_suite("peak", prob="sum").probs(c)[0] == pytest.approx(0.25)


# ----------------------------------------------------------------------------------------------- 1-to-N


def test_one_to_n_equals_naive(tiny_pair):
    cases = cases_of("peak-cf")
    suite = get_suite("one_to_n", k=3)
    pre, post = run(suite, tiny_pair, cases)
    for case, a, b in zip(cases, pre, post, strict=True):
        row = suite.metrics(case, a, b)
        valid = list(dict.fromkeys(case.valid_answers))
        false = [x for x in dict.fromkeys(case.hard_false + case.random_false) if x not in valid]
        gold = b["gold"]
        assert gold["answers"] == valid
        np.testing.assert_allclose(gold["weights"], M.gold_distribution(gold["counts"], on_zero="uniform"))
        assert gold["source"] == ("counts" if sum(gold["counts"]) else "uniform")
        for bundle, tag in ((tiny_pair[0], "pre"), (tiny_pair[1], "post")):
            q = case.request.text
            valid_lps = [naive_logprobs(bundle, q, x) for x in valid]
            cand_lps = [sum(x) for x in valid_lps] + [sum(naive_logprobs(bundle, q, x)) for x in false]
            mask = [True] * len(valid) + [False] * len(false)
            assert_rows_close(row, {
                f"NKL_{tag}": M.nkl(valid_lps, gold["weights"]),
                f"MaxAcc_{tag}": M.max_acc(cand_lps, mask),
                f"Precision@3_{tag}": M.precision_at_k(cand_lps, mask, 3),
            }, atol=1e-5)
            assert row[f"PPL_{tag}"] == pytest.approx(M.perplexity(valid_lps), rel=1e-4)


def test_one_to_n_edit_requests():
    case = load_cases("peak-cf", limit=1)[0]
    reqs = get_suite("one_to_n").edit_requests(case)
    assert [r.target_new for r in reqs] == list(dict.fromkeys(case.valid_answers))
    assert all(r.subject == case.request.subject and r.prompt == case.request.prompt for r in reqs)
    assert get_suite("one_to_n", edits="append").edit_requests(case) == [case.request]


# ------------------------------------------------------------------------------------ shared properties


@pytest.mark.parametrize("name,dataset", [("counterfact", "counterfact"), ("zsre", "zsre"), ("peak", "peak-t"),
                                          ("one_to_n", "peak-cf")])
def test_metrics_identical_after_json_roundtrip(tiny_pair, name, dataset):
    cases = cases_of(dataset)
    suite = get_suite(name)
    pre, post = run(suite, tiny_pair, cases)
    for case, a, b in zip(cases, pre, post, strict=True):
        direct = suite.metrics(case, a, b)
        again = suite.metrics(case, roundtrip(a), roundtrip(b))
        assert direct == again
        assert all(isinstance(v, float) for v in direct.values())
        assert suite.declarations.undeclared(list(direct)) == []  # only declared names
        assert suite.checked_metrics(case, a, b) == direct
    # probe_many over several cases equals one probe per case
    engine = ScoringEngine(tiny_pair[0])
    single = suite.probe(engine, cases[1])
    for p_one, p_many in zip(single["prompts"], pre[1]["prompts"], strict=True):
        for c1, c2 in zip(p_one["candidates"], p_many["candidates"], strict=True):
            assert c1["text"] == c2["text"] and c1["kind"] == c2["kind"]
            assert c1["logprob_sum"] == pytest.approx(c2["logprob_sum"], abs=1e-4)


def test_probe_sends_one_score_call(tiny_pair, monkeypatch):
    engine = ScoringEngine(tiny_pair[0])
    calls = []
    original = engine.score
    monkeypatch.setattr(engine, "score", lambda reqs: calls.append(len(reqs)) or original(reqs))
    for name, dataset in (("counterfact", "counterfact"), ("zsre", "zsre"), ("peak", "peak-t"),
                          ("one_to_n", "peak-t")):
        calls.clear()
        get_suite(name).probe_many(engine, [trimmed(c, 2) for c in load_cases(dataset, limit=2)])
        assert len(calls) == 1, name


def test_registry():
    assert set(SUITES) == {"counterfact", "zsre", "peak", "one_to_n", "evk", "portability", "general", "collateral",
                           "wild", "weights"}
    for name in SUITES:
        suite = get_suite(name)
        assert suite.name == name and isinstance(suite, Suite)
        specs = suite.declarations.specs
        assert specs and all(s.paper and s.equation for s in specs)
        for spec in specs:  # one naming scheme: NAME_pre/NAME_post, or plain NAME for post-only metrics
            assert spec.columns == ((f"{spec.name}_pre", f"{spec.name}_post") if spec.pairing == "pre_post"
                                    else (spec.name,))
    with pytest.raises(EditscopeError, match="registered: counterfact"):
        get_suite("nope")
    with pytest.raises(EditscopeError, match="bad options"):
        get_suite("zsre", bogus=1)


def test_suites_reject_unsuitable_cases(tiny_pair):
    engine = ScoringEngine(tiny_pair[0])
    cf = load_cases("counterfact", limit=1)
    with pytest.raises(EditscopeError, match="valid answers"):
        get_suite("one_to_n").probe(engine, cf[0])
    with pytest.raises(EditscopeError, match="valid answers"):
        get_suite("peak").probe(engine, cf[0])
