"""Suite protocols: zsRE as MEMIT's code measures it (edit target answers[0] or alt;
neighbourhood question ``loc + "?"``), PEAK's ``protocol: reference`` against a straight-line port of PEAK's
``experiments/summarize.py``, and the protocol labels every suite declares."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from editscope.data import load_cases
from editscope.data.records import EditRequest
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.run.blocks import edit_requests
from editscope.suites import SUITES, get_suite
from editscope.suites.one_to_n import OneToNSuite
from editscope.suites.peak import PeakSuite
from editscope.suites.zsre import ZsreSuite
from tests.lm.test_engine import naive_logprobs

pytestmark = pytest.mark.usefixtures("private_home")


# ---------------------------------------------------------------------------------------------- zsRE


def test_published_loc_has_no_question_mark():
    """The shared MEND sample: no ``loc`` ends in "?" (so MEMIT's ``loc + "?"`` changes every prompt)."""
    cases = load_cases("zsre")
    assert len(cases) > 900
    assert not any(p.endswith("?") for c in cases for p, _ in c.neighborhood)
    assert all(p.startswith("nq question: ") for c in cases for p, _ in c.neighborhood)


def test_zsre_targets_and_neighbourhood_question():
    case = load_cases("zsre", limit=1)[0]  # UniFirst: src "...made by UniFirst?", answers ["uniform"], alt ...
    loc, loc_ans = case.neighborhood[0]
    memit = get_suite("zsre")
    assert memit.edit_requests(case) == [EditRequest("What is the product made by {}?", "UniFirst", "uniform")]
    assert case.request.target_new == "unmanned aircraft"
    assert get_suite("zsre", target="alt").edit_requests(case) == [case.request]
    plan = memit.plan(case)
    assert [(p["prompt"], p["role"]) for p in plan.prompts] == [
        ("What is the product made by UniFirst?", "rewrite"), ("What will be the product of UniFirst?", "paraphrase"),
        ("nq question: john goodman's character in the big lebowski?", "neighborhood")]
    assert plan.pairs == [("What is the product made by UniFirst?", "uniform"),
                          ("What will be the product of UniFirst?", "uniform"), (loc + "?", loc_ans)]
    easy = get_suite("zsre", target="alt", loc_question_mark=False).plan(case)
    assert easy.pairs == [(case.request.text, "unmanned aircraft"), (case.paraphrase_prompts[0], "unmanned aircraft"),
                          (loc, loc_ans)]
    # a loc that already ends in "?" gets no second one
    from editscope.suites.zsre import neighborhood_question
    assert neighborhood_question("who is it?") == "who is it?"
    assert neighborhood_question("who is it") == "who is it?"
    assert neighborhood_question("who is it", question_mark=False) == "who is it"


def test_zsre_bad_options_fail():
    with pytest.raises(EditscopeError, match="option target must be one of answers0, alt"):
        get_suite("zsre", target="answers")
    with pytest.raises(EditscopeError, match="loc_question_mark"):
        get_suite("zsre", loc_question_mark="yes")
    cf = load_cases("counterfact", limit=1)[0]
    with pytest.raises(EditscopeError, match="answers0 needs extra"):
        get_suite("zsre").edit_requests(cf)


def test_zsre_neighbourhood_scored_after_question_mark(tiny_pair):
    """The probe's neighbourhood log-probs equal a naive forward of ``loc + "?"`` + answer, and differ from the
    published ``loc`` (so the option is not a no-op)."""
    bundle = tiny_pair[0]
    case = load_cases("zsre", limit=1)[0]
    loc, ans = case.neighborhood[0]
    engine = ScoringEngine(bundle)
    for mark, prompt in ((True, loc + "?"), (False, loc)):
        probe = get_suite("zsre", loc_question_mark=mark).probe(engine, case)
        neigh = [p for p in probe["prompts"] if p["role"] == "neighborhood"][0]
        assert neigh["prompt"] == prompt
        got = neigh["candidates"][0]["token_logprobs"]
        np.testing.assert_allclose(got, naive_logprobs(bundle, prompt, ans), atol=1e-4)
    assert not np.allclose(naive_logprobs(bundle, loc + "?", ans), naive_logprobs(bundle, loc, ans), atol=1e-3)
    # Efficacy scores the edit target: answers[0] by default
    probe = get_suite("zsre").probe(engine, case)
    assert probe["prompts"][0]["candidates"][0]["text"] == "uniform"
    np.testing.assert_allclose(probe["prompts"][0]["candidates"][0]["token_logprobs"],
                               naive_logprobs(bundle, case.request.text, "uniform"), atol=1e-4)


def test_runner_edits_what_the_zsre_suite_declares():
    case = load_cases("zsre", limit=1)[0]
    assert edit_requests("zsre", {"zsre": get_suite("zsre")}, case)[0].target_new == "uniform"
    assert edit_requests("zsre", {"zsre": get_suite("zsre", target="alt")}, case) == (case.request,)
    with pytest.raises(EditscopeError, match="edit different things"):
        edit_requests("zsre", {"zsre": get_suite("zsre"), "counterfact": get_suite("counterfact")}, case)


# ---------------------------------------------------------------------------------------------- PEAK
# A straight-line port of mjy1111/PEAK experiments/summarize.py (select_pos_neg, rank_compute_affect_post, the
# rp_prompts_probs / rewrite / paraphrase / neighborhood loops). Inputs are mean per-token NLLs, as there.


def _sig(x):
    return 1 / (1 + math.exp(-x))


def ref_select_pos_neg(pos, neg, rnd):
    ep, en, er = [np.exp(-x) for x in pos], [np.exp(-x) for x in neg], [np.exp(-x) for x in rnd]
    en_c, ep_c, er_c = list(en), list(ep), list(er)
    for i in ep:
        if sum(1 for j in en_c if i < j) / len(en) >= 0.2:
            ep_c.remove(i)
    if not en_c or not ep_c or not er_c:
        return [], [], []
    for i in list(en_c):
        if i >= min(ep_c):
            en_c.remove(i)
    for i in list(er_c):
        if i >= min(ep_c):
            er_c.remove(i)
    return [ep.index(i) for i in ep_c], [en.index(i) for i in en_c], [er.index(i) for i in er_c]


def ref_affect_post(pos, neg, pos_pre, neg_pre):
    sn, sp = [_sig(np.exp(-x)) for x in neg], [_sig(np.exp(-x)) for x in pos]
    mean_neg_pre, mean_pos_pre = np.mean([np.exp(-x) for x in neg_pre]), np.mean([np.exp(-x) for x in pos_pre])
    mean_neg_post, mean_pos_post = np.mean([np.exp(-x) for x in neg]), np.mean([np.exp(-x) for x in pos])
    max_neg, min_pos = max(sn), min(sp)
    neg2pos = sum(i for i in sn if i > min_pos) / sum(sn)
    pos2neg = sum(i for i in sp if i < max_neg) / sum(sp)
    if mean_pos_post / mean_pos_pre < 1:
        pos2neg = 1 - (1 - pos2neg) * mean_pos_post / mean_pos_pre
    if mean_neg_post / mean_neg_pre > 1:
        neg2pos = 1 - (1 - neg2pos) * mean_neg_pre / mean_neg_post
    return neg2pos, pos2neg


def ref_summarize(pre, post):
    """PEAK's per-case numbers for the post-edit model: {key: value}; keys absent where summarize.py skips."""
    out = {}
    rp_pre, rp_post = pre["rewrite"] + pre["paraphrase"], post["rewrite"] + post["paraphrase"]
    hard, rand = [], []
    temp = None
    for x, pre_x in zip(rp_post, rp_pre, strict=True):
        pid, nid, rid = ref_select_pos_neg(pre_x["pos"], pre_x["neg"], pre_x["rnd"])
        temp = ([x["pos"][i] for i in pid], [x["neg"][i] for i in nid], [x["rnd"][i] for i in rid])
        if not temp[0] or not temp[1] or not temp[2]:
            continue
        hard.append(ref_affect_post(temp[0], temp[1], [pre_x["pos"][i] for i in pid], [pre_x["neg"][i] for i in nid]))
        rand.append(ref_affect_post(temp[0], temp[2], [pre_x["pos"][i] for i in pid], [pre_x["rnd"][i] for i in rid]))
    if temp[0] and temp[1] and temp[2]:  # summarize.py re-tests the *last* prompt's lists here
        out["ANF_hard"], out["AFF_hard"] = np.mean([h[0] for h in hard]), np.mean([h[1] for h in hard])
        out["ANF_random"], out["AFF_random"] = np.mean([r[0] for r in rand]), np.mean([r[1] for r in rand])
    for key, name in (("rewrite", "ES"), ("paraphrase", "GS")):
        mm = []
        for y, pre_x in zip(post[key], pre[key], strict=True):
            pid, nid, rid = ref_select_pos_neg(pre_x["pos"], pre_x["neg"], pre_x["rnd"])
            if pid == [] or nid == [] or rid == []:
                continue
            mm.append((y["new"], [y["pos"][i] for i in pid]))
        if mm:
            out[name] = np.mean([max(pos) > new for new, pos in mm])
    local = [i for i, x in enumerate(pre["neigh"]) if x["true"] < x["new"]]
    if local:
        out["LS"] = np.mean([post["neigh"][i]["true"] < post["neigh"][i]["new"] for i in local])
    return out


def _cand(text, kind, nll, n):
    lp = -nll * n
    return {"text": text, "kind": kind, "logprob_sum": lp, "n_tokens": n, "token_logprobs": [lp / n] * n,
            "token_is_argmax": [False] * n}


def random_case(rng, n_para=2, n_neigh=4, n_pos=5, n_hard=6, n_rand=4):
    """Pre/post probes in the suite's format and the same numbers as PEAK's NLL dicts."""
    def prompt_nlls():
        return {"pos": list(rng.uniform(0.5, 4.0, n_pos)), "neg": list(rng.uniform(1.0, 6.0, n_hard)),
                "rnd": list(rng.uniform(0.1, 5.0, n_rand)), "new": float(rng.uniform(0.5, 6.0))}
    ref = {"rewrite": [prompt_nlls()], "paraphrase": [prompt_nlls() for _ in range(n_para)],
           "neigh": [{"true": float(rng.uniform(0.5, 5)), "new": float(rng.uniform(0.5, 5))} for _ in range(n_neigh)]}
    lengths = rng.integers(1, 4, size=n_pos + n_hard + n_rand + 1)
    prompts = []
    for role, items in (("rewrite", ref["rewrite"]), ("paraphrase", ref["paraphrase"])):
        for k, x in enumerate(items):
            cands = ([_cand(f"c{i}", "correct", v, lengths[i]) for i, v in enumerate(x["pos"])]
                     + [_cand(f"h{i}", "hard_false", v, lengths[n_pos + i]) for i, v in enumerate(x["neg"])]
                     + [_cand(f"r{i}", "random_false", v, lengths[n_pos + n_hard + i]) for i, v in enumerate(x["rnd"])]
                     + [_cand("o*", "new", x["new"], lengths[-1])])
            prompts.append({"prompt": f"{role}{k}", "role": role, "candidates": cands})
    for k, x in enumerate(ref["neigh"]):
        prompts.append({"prompt": f"loc{k}", "role": "neighborhood",
                        "candidates": [_cand("ol", "correct", x["true"], 2), _cand("o*", "new", x["new"], 1)]})
    return {"prompts": prompts}, ref


def test_peak_reference_protocol_equals_peak_summarize():
    """Random pre/post probes: ``protocol: reference`` gives what PEAK's summarize.py gives (ES, GS, LS, AFF/ANF of
    both settings), except where summarize.py drops a case's additivity because its *last* prompt was skipped
    (documented: the suite keeps the mean over the surviving prompts)."""
    rng = np.random.default_rng(0)
    suite = get_suite("peak", protocol="reference")
    case = load_cases("peak-cf", limit=1)[0]
    compared = {"ES": 0, "GS": 0, "LS": 0, "AFF_hard": 0, "ES_skipped": 0, "last_prompt_quirk": 0}
    for _ in range(60):
        pre, ref_pre = random_case(rng)
        post, ref_post = random_case(rng)
        row = suite.metrics(case, pre, post)
        expected = ref_summarize(ref_pre, ref_post)
        for key in ("ES", "GS", "LS"):
            assert (f"{key}_post" in row) == (key in expected), key
            if key in expected:
                assert row[f"{key}_post"] == pytest.approx(expected[key], abs=1e-12), key
                compared[key] += 1
            elif key == "ES":
                compared["ES_skipped"] += 1
        if "AFF_hard" in expected:
            for key in ("AFF_hard", "ANF_hard", "AFF_random", "ANF_random"):
                assert row[key] == pytest.approx(expected[key], abs=1e-9), key
            compared["AFF_hard"] += 1
            assert row["n_prompts_hard"] == row["n_prompts_random"]  # one rule skips a prompt for both settings
        elif "AFF_hard" in row:
            compared["last_prompt_quirk"] += 1
        assert row.get("LS_pre", 1.0) == 1.0  # pre-edit LS over the prompts the unedited model gets right
    assert min(compared.values()) >= 2, compared  # every branch was exercised


def _peak_hand_probes():
    """One rewrite + one paraphrase prompt + three locality prompts, probabilities by hand (1-token answers)."""
    ln = np.log

    def c(text, kind, p):
        return _cand(text, kind, -ln(p), 1)

    def rp(role, pc, ph, pr, pn):
        return {"prompt": role, "role": role, "candidates": (
            [c(f"c{i}", "correct", p) for i, p in enumerate(pc)]
            + [c(f"h{i}", "hard_false", p) for i, p in enumerate(ph)]
            + [c(f"r{i}", "random_false", p) for i, p in enumerate(pr)] + [c("o*", "new", pn)])}

    def loc(k, p_true, p_new):
        return {"prompt": f"l{k}", "role": "neighborhood",
                "candidates": [c("ol", "correct", p_true), c("o*", "new", p_new)]}

    # paraphrase: correct {0.3, 0.2}; hard {0.1, 0.02} kept; random {0.5, 0.25} both >= 0.2 -> random list empty
    pre = {"prompts": [rp("rewrite", [0.4, 0.3], [0.1, 0.05], [0.01, 0.02], 0.01),
                       rp("paraphrase", [0.3, 0.2], [0.1, 0.02], [0.5, 0.25], 0.01),
                       loc(0, 0.5, 0.1), loc(1, 0.1, 0.5), loc(2, 0.4, 0.2)]}
    post = {"prompts": [rp("rewrite", [0.3, 0.3], [0.2, 0.05], [0.01, 0.04], 0.5),
                        rp("paraphrase", [0.2, 0.2], [0.1, 0.3], [0.4, 0.3], 0.6),
                        loc(0, 0.05, 0.4), loc(1, 0.6, 0.2), loc(2, 0.5, 0.1)]}
    return pre, post


def test_peak_protocols_by_hand():
    from editscope import metrics as M

    pre, post = _peak_hand_probes()
    case = load_cases("peak-cf", limit=1)[0]
    paper = get_suite("peak").metrics(case, pre, post)
    ref = get_suite("peak", protocol="reference").metrics(case, pre, post)
    # LS: paper over all three locality prompts (post: 0.05<0.4 no, 0.6>0.2 yes, 0.5>0.1 yes) = 2/3;
    # reference over those the unedited model gets right (0 and 2): 0/1 + 1/1 -> 1/2; pre is 1 by construction
    assert paper["LS_post"] == pytest.approx(2 / 3) and paper["LS_pre"] == pytest.approx(2 / 3)
    assert ref["LS_post"] == pytest.approx(1 / 2) and ref["LS_pre"] == 1.0
    # the paraphrase's kept random list is empty: paper skips it for the random setting only, reference for both
    # settings and for GS
    assert paper["n_prompts_hard"] == 2 and paper["n_prompts_random"] == 1
    assert ref["n_prompts_hard"] == 1 and ref["n_prompts_random"] == 1
    assert paper["GS_post"] == 1.0 and "GS_post" not in ref  # 0.6 > min(0.2, 0.2)
    rw = M.additivity([0.4, 0.3], [0.3, 0.3], [0.1, 0.05], [0.2, 0.05])
    para = M.additivity([0.3, 0.2], [0.2, 0.2], [0.1, 0.02], [0.1, 0.3])
    assert ref["AFF_hard"] == pytest.approx(rw["AFF"]) and ref["ANF_hard"] == pytest.approx(rw["ANF"])
    assert paper["AFF_hard"] == pytest.approx((rw["AFF"] + para["AFF"]) / 2)
    assert ref["ES_post"] == paper["ES_post"] == 1.0  # 0.5 > 0.3
    # a reference LS with no locality prompt the unedited model gets right is absent
    for p in pre["prompts"][2:]:
        p["candidates"][1]["logprob_sum"] = 0.0  # P(o*) = 1 before the edit
    assert "LS_post" not in get_suite("peak", protocol="reference").metrics(case, pre, post)


def test_peak_bad_protocol_fails():
    with pytest.raises(EditscopeError, match="option protocol must be one of paper, reference"):
        get_suite("peak", protocol="ref")


# ---------------------------------------------------------------------------------------------- labels


def test_every_suite_names_its_protocol():
    for name in SUITES:
        proto = get_suite(name).protocol
        # the judges (and the default answer judge's version), as values for the summary
        extra = {"judge", "locality_judge", "judge_version"} if name == "wild" else set()
        assert set(proto) == {"name", "note"} | extra and proto["name"] and proto["note"], name
    assert get_suite("peak").protocol["name"] == "paper"
    assert get_suite("peak", protocol="reference").protocol["name"] == "reference"
    assert "summarize.py" in get_suite("peak", protocol="reference").protocol["note"]
    assert get_suite("zsre").protocol["name"] == "paper"
    assert get_suite("zsre", target="alt", loc_question_mark=False).protocol["name"] == "easyedit"
    assert get_suite("zsre", target="alt").protocol["name"] == "custom"
    assert "EasyEdit" in get_suite("counterfact").protocol["note"]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ZsreSuite(loc_question_mark=1), "zsre suite: option loc_question_mark must be one of true, false, not 1"),
    (lambda: ZsreSuite(target="answers"), "zsre suite: option target must be one of answers0, alt, not 'answers'"),
    (lambda: PeakSuite(prob="max"), "peak suite: option prob must be one of mean, sum, not 'max'"),
    (lambda: PeakSuite(filter_answers="yes"), "peak suite: option filter_answers must be one of true, false"),
    (lambda: OneToNSuite(edits="some"), "one_to_n suite: option edits must be one of all_valid, append"),
])
def test_bad_suite_options_name_suite_option_and_choices(make, message):
    with pytest.raises(EditscopeError, match=re.escape(message)):
        make()
