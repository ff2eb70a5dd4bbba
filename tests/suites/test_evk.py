"""EVK instances and the evk suite (paper 004, §3.1, eqs 4-9): spans, drift, seeding, ES/TS values."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from editscope.data.evk import DRIFTS, drift_embeddings, evk_instances, prompt_spans
from editscope.data.records import Case, EditRequest
from editscope.edit.registry import edited
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.suites import get_suite
from editscope.suites.evk import EvkSuite

# (template, subject, the subject's words, the relation's words) — subject at start, middle, end.
PROMPTS = [
    ("{} is a citizen of", "Danielle Darrieux", "is a citizen of"),
    ("The mother tongue of {} is", "Thomas Joannes Stieltjes", "The mother tongue of is"),
    ("The capital city of France is {}", "Paris", "The capital city of France is"),
    ("{}'s headquarters are in", "Xyzzyplugh Qwertzuiop", "'s headquarters are in"),
]


@pytest.fixture(scope="module")
def gpt2_engine(tiny_bundles):
    return ScoringEngine(tiny_bundles["gpt2"])


@pytest.fixture(scope="module")
def llama_engine(tiny_bundles):
    return ScoringEngine(tiny_bundles["llama"])


def _words(engine, ids, idx) -> str:
    return " ".join("".join(engine.tokenizer.decode([ids[i]]) for i in idx).split())


def _check_spans(engine, template, subject, relation_words):
    spans = prompt_spans(engine, template, subject)
    text = template.replace("{}", subject)
    assert list(spans.ids) == engine.encode(text)
    assert len(spans.subject) >= 2 or subject == "Paris"  # multi-token subjects are covered
    assert list(spans.subject) == list(range(spans.subject[0], spans.subject[-1] + 1))  # contiguous
    assert _words(engine, spans.ids, spans.subject) == subject
    # relation = every other token, in order; together they are the whole prompt
    assert sorted(spans.subject + spans.relation) == list(spans.all)
    assert _words(engine, spans.ids, spans.relation).replace(" '", "'") == relation_words
    return spans


@pytest.mark.parametrize("template,subject,relation", PROMPTS)
def test_spans_gpt2_bpe(gpt2_engine, template, subject, relation):
    spans = _check_spans(gpt2_engine, template, subject, relation)
    assert spans.all == tuple(range(len(spans.ids)))  # GPT-2 adds no BOS


def test_spans_position_and_last_subject_token(gpt2_engine):
    from editscope.edit.context import subject_last_token_index

    for template, subject, _ in PROMPTS:
        spans = prompt_spans(gpt2_engine, template, subject)
        assert spans.subject[-1] == subject_last_token_index(gpt2_engine, template, subject)
    assert prompt_spans(gpt2_engine, *PROMPTS[0][:2]).subject[0] == 0  # at the start
    end = prompt_spans(gpt2_engine, *PROMPTS[2][:2])
    assert end.subject[-1] == len(end.ids) - 1  # at the end


@pytest.mark.slow
@pytest.mark.parametrize("template,subject,relation", PROMPTS)
def test_spans_smollm2(smollm2, template, subject, relation):
    _check_spans(ScoringEngine(smollm2), template, subject, relation)


def test_spans_errors(gpt2_engine):
    with pytest.raises(EditscopeError, match="exactly one"):
        prompt_spans(gpt2_engine, "no slot", "x")
    with pytest.raises(EditscopeError, match="drift type"):
        prompt_spans(gpt2_engine, "{} is", "Paris").span("object")


def test_drift_touches_only_the_span_with_sigma():
    base = torch.randn(12, 4096, generator=torch.Generator().manual_seed(1))
    span = [2, 3, 7]
    out = drift_embeddings(base, span, 0.3, torch.Generator().manual_seed(0))
    diff = out - base
    others = [i for i in range(12) if i not in span]
    assert torch.equal(out[others], base[others])
    assert bool((diff[span] != 0).all())
    assert float(diff[span].std()) == pytest.approx(0.3, rel=0.02)  # 12,288 samples: sd of the std ≈ 0.6%
    assert float(diff[span].mean()) == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize("drift", DRIFTS)
def test_instances_perturb_their_span(llama_engine, drift):
    template, subject, _ = PROMPTS[1]
    spans = prompt_spans(llama_engine, template, subject)
    clean = llama_engine.embed(template.replace("{}", subject))
    (inst,) = evk_instances(llama_engine, template, subject, sigma=0.5, n=1, drifts=[drift], key="c")
    changed = [i for i in range(len(spans.ids)) if not torch.equal(inst.embeds[i], clean[i])]
    assert changed == list(spans.span(drift))


def test_sigma_zero_is_the_clean_prompt(llama_engine):
    template, subject, _ = PROMPTS[0]
    text = template.replace("{}", subject)
    clean = llama_engine.embed(text)
    insts = evk_instances(llama_engine, template, subject, sigma=0.0, n=2, key="c")
    assert len(insts) == 2 * len(DRIFTS)
    for inst in insts:
        assert torch.equal(inst.embeds, clean)
    h_clean = llama_engine.hidden_states([text], [3])
    h_inst = llama_engine.hidden_states([text], [3], context_embeds=[insts[0].embeds])
    torch.testing.assert_close(h_inst, h_clean, rtol=0, atol=1e-6)


def test_instances_seeded_per_case(llama_engine):
    template, subject, _ = PROMPTS[0]
    a = evk_instances(llama_engine, template, subject, sigma=0.3, n=2, key="case-1")
    b = evk_instances(llama_engine, template, subject, sigma=0.3, n=2, key="case-1")
    c = evk_instances(llama_engine, template, subject, sigma=0.3, n=2, key="case-2")
    assert all(torch.equal(x.embeds, y.embeds) for x, y in zip(a, b, strict=True))
    assert not any(torch.equal(x.embeds, y.embeds) for x, y in zip(a, c, strict=True))
    assert not torch.equal(a[0].embeds, a[1].embeds)  # instances of one type differ


def _case() -> Case:
    return Case("7", "test", (EditRequest("The mother tongue of {} is", "Danielle Darrieux", "English", "French"),),
                neighborhood=[("Michel Rocard is a native speaker of", "French"),
                              ("Jacques Chirac speaks", "French")])


@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_unedited_stability_is_exactly_one(llama_engine, sigma):
    suite = get_suite("evk", sigma=sigma, instances_per_type=2, sigmas=[0.05, 1.0])
    case = _case()
    pre, post = suite.probe(llama_engine, case), suite.probe(llama_engine, case)
    json.dumps(pre)  # JSON-serialisable
    row = suite.checked_metrics(case, pre, post)
    assert set(row) == set(suite.declarations.per_case_columns)
    assert all(v == 1.0 for v in row.values()), row
    assert len(pre["evk"]) == 3 * len(DRIFTS) * 2 and len(pre["text"]) == 2


def _hf_states(bundle, engine, contexts, embeds, state: str) -> np.ndarray:
    """Final-token states one row at a time from a plain HF forward: ``output_hidden_states[-1]`` (final norm) or
    the last block's output captured by a hook (``resid``)."""
    from editscope.lm.hooks import capture

    last = f"blocks.{bundle.n_layers - 1}.resid_post"
    out = []
    for text, e in zip(contexts, embeds, strict=True):
        e = engine.embed(text) if e is None else e
        with torch.no_grad(), capture(bundle.model, bundle.arch, [last]) as store:
            hs = bundle.model(inputs_embeds=e[None], output_hidden_states=True).hidden_states
        out.append((hs[-1] if state == "final_norm" else store[last])[0, -1].double().cpu().numpy())
    return np.stack(out)


@pytest.mark.parametrize("state", ["final_norm", "resid"])
def test_stability_after_an_edit_matches_a_direct_cosine(tiny_bundles, state):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    suite = EvkSuite(sigma=0.3, state=state)
    case = _case()
    pre = suite.probe(engine, case)
    assert pre["state"] == ("final" if state == "final_norm" else "blocks.3.resid_post")
    insts = suite.instances(engine, case)
    texts = [p for p, _ in case.neighborhood]
    contexts = [i["prompt"] for i in insts] + texts
    embeds = [i["embeds"] for i in insts] + [None] * len(texts)
    h_pre = _hf_states(bundle, engine, contexts, embeds, state)
    np.testing.assert_allclose(np.asarray([i["h"] for i in pre["evk"]]), h_pre[:3], rtol=1e-5, atol=1e-5)
    with edited(bundle, "rome", case.request):
        post = suite.probe(engine, case)
        h_post = _hf_states(bundle, engine, contexts, embeds, state)
    row = suite.metrics(case, pre, post)
    cos = (h_pre * h_post).sum(1) / np.linalg.norm(h_pre, axis=1) / np.linalg.norm(h_post, axis=1)
    for j, drift in enumerate(DRIFTS):
        assert row[f"EVK_ES_{drift}"] == pytest.approx(cos[j], abs=1e-5)
    assert row["EVK_ES"] == pytest.approx(cos[:3].mean(), abs=1e-5)
    assert row["EVK_TS"] == pytest.approx(cos[3:].mean(), abs=1e-5)
    assert row["EVK_ES"] < 1.0 and row["EVK_TS"] < 1.0  # the edit moved the states


def test_state_option_is_named_in_the_protocol():
    assert EvkSuite().state == "final_norm"
    assert "final norm" in EvkSuite().protocol["note"] and EvkSuite().protocol["name"] == "paper"
    assert EvkSuite(state="resid").protocol["name"] == "resid"
    assert "before the final norm" in EvkSuite(state="resid").protocol["note"]
    with pytest.raises(EditscopeError, match="state must be one of final_norm, resid"):
        EvkSuite(state="last")


def _row(method: str, values: dict[str, float]) -> dict:
    return {"method": method, "metrics": {"evk": values}}


def test_stability_by_sigma_and_figure():
    suite = EvkSuite(sigma=0.3, sigmas=[1.0, 0.1], drifts=["subject", "all"])
    rows = [_row("rome", {"EVK_ES": 0.9, "EVK_ES@0.1": 0.99, "EVK_ES@1": 0.5, "EVK_ES_subject": 0.8,
                          "EVK_ES_subject@0.1": 0.95, "EVK_ES_all": 1.0}),
            _row("rome", {"EVK_ES": 0.7, "EVK_ES@0.1": 0.97, "EVK_ES@1": 0.3, "EVK_ES_subject": 0.6}),
            _row("memit", {"EVK_ES": 0.95})]
    curves = suite.stability_by_sigma(rows, ["rome", "memit", "ft"])
    assert list(curves) == ["rome", "memit"]  # no rows, no curve
    rome = curves["rome"]["all instances"]
    assert [p[0] for p in rome] == [0.1, 0.3, 1.0]
    assert [p[1] for p in rome] == pytest.approx([0.98, 0.8, 0.4])
    # Student t 95% CI of two values: mean ± t(0.975, 1) · sd / sqrt(2) = mean ± 12.706 · |a - b| / 2
    assert rome[1][2:] == pytest.approx((0.8 - 12.7062 * 0.1, 0.8 + 12.7062 * 0.1), rel=1e-4)
    assert [(p[0], p[1]) for p in curves["rome"]["subject drift"]] == [(0.1, 0.95), (0.3, pytest.approx(0.7))]
    assert curves["rome"]["all drift"] == [(0.3, 1.0, pytest.approx(np.nan, nan_ok=True),
                                           pytest.approx(np.nan, nan_ok=True))]
    assert curves["memit"]["all instances"][0][:2] == (0.3, 0.95)
    (fig,) = suite.figures("counterfact", rows, ["rome", "memit"])
    assert fig.slug == "evk-sigma-counterfact" and fig.png[:8] == b"\x89PNG\r\n\x1a\n"
    assert EvkSuite(sigma=0.3).figures("counterfact", rows, ["rome"]) == []  # no sweep, no figure


def test_neighbourhood_source_and_text_option(llama_engine):
    case = _case()
    suite = EvkSuite(source="both", text="attribute")
    probe = suite.probe(llama_engine, case)
    sources = [(i["source"], i["drift"]) for i in probe["evk"]]
    assert sources == [("edit", d) for d in DRIFTS] + [("neighborhood", "all")] * 2
    assert probe["text"] == []  # no attribute prompts in this case
    assert "EVK_TS" not in suite.metrics(case, probe, probe)
    with pytest.raises(EditscopeError, match="source"):
        EvkSuite(source="paraphrase")


def test_table2_config_varies_one_hparam_at_a_time_around_the_paper_baseline():
    """Paper 004 Table 2: σ ∈ {0.1, 0.5}, λ ∈ {0.5, 1.0}, N ∈ {5, 10}, second-stage k ∈ {20, 50} around
    σ = 0.3, λ = 0.1, N = 1, k = 10 (both stages)."""
    from editscope.run import load_config

    methods = load_config("experiments/evk-table2").methods
    evk = {m.label: m.overrides for m in methods if m.name == "evk_edit"}
    base = evk.pop("evk-base")
    assert base == {"evk_sigma": 0.3, "evk_lam": 0.1, "evk_n": 1, "evk_k1": 10, "evk_k2": 10}
    varied = sorted((k, v) for o in evk.values() for k, v in o.items() if base[k] != v)
    assert len(varied) == len(evk)  # exactly one change per entry
    assert varied == [("evk_k2", 20), ("evk_k2", 50), ("evk_lam", 0.5), ("evk_lam", 1.0), ("evk_n", 5),
                      ("evk_n", 10), ("evk_sigma", 0.1), ("evk_sigma", 0.5)]
    table1 = load_config("experiments/evk-table1")
    (evk_suite,) = [s for b in table1.blocks for s in b.suites if s.name == "evk"]
    assert EvkSuite(**evk_suite.options).sweep and EvkSuite(**evk_suite.options).sigma == 0.3


# ---------------------------------------------------------------------------------------------- embedding map


def test_embedding_map_pca_equals_an_svd_and_draws(tiny_pair):
    """Paper 004 Fig. 5: the map's PCA coordinates of real (tiny-llama) states equal an SVD of the centred state
    matrix up to the sign of each axis, and so do the explained-variance shares; the figure names PCA."""
    from editscope.data import load_cases

    cases = load_cases("counterfact", limit=3)
    suite = EvkSuite(sigma=0.3, sigmas=[1.0])
    pre = suite.probe_many(ScoringEngine(tiny_pair[0]), cases)
    post = suite.probe_many(ScoringEngine(tiny_pair[1]), cases)  # another model's weights stand in for an edit
    rows = [{"method": m, "case_id": c.case_id, "pre": {"evk": a}, "post": {"evk": b},
             "metrics": {"evk": suite.metrics(c, a, b)}}
            for m, posts in (("rome", post), ("memit", pre)) for c, a, b in zip(cases, pre, posts, strict=True)]
    rows.append({**rows[0], "method": "rome", "checkpoint": True})  # lifelong checkpoint rows are not drawn
    points = suite.embedding_points(rows, ["rome", "memit"])
    per_case = len(DRIFTS) + len(cases[0].neighborhood)  # σ = 0.3 instances (not the σ = 1 sweep) + text prompts
    assert len(points["h"]) == 3 * 3 * per_case  # pre once per case, post per method
    assert points["when"].count("pre") == 3 * per_case and set(points["method"]) == {None, "rome", "memit"}
    # the same matrix rebuilt from the probes by each point's key, then PCA by SVD
    probe = {("pre", None): pre, ("post", "rome"): post, ("post", "memit"): pre}
    x = np.array([probe[(w, m)][[c.case_id for c in cases].index(case)][part][j]["h"]
                  for w, m, (case, part, j) in zip(points["when"], points["method"], points["key"], strict=True)])
    assert points["kind"][:3] == list(DRIFTS) and points["key"][0] == (cases[0].case_id, "evk", 0)
    xc = x - x.mean(axis=0)
    u, s, _ = np.linalg.svd(xc, full_matrices=False)
    coords, explained = suite.map_coordinates(points["h"])
    ref = u[:, :2] * s[:2]
    for axis in range(2):
        sign = np.sign(coords[:, axis] @ ref[:, axis])
        np.testing.assert_allclose(coords[:, axis], sign * ref[:, axis], atol=1e-6 * s[0])
    np.testing.assert_allclose(explained, s[:2] ** 2 / (s ** 2).sum(), rtol=1e-9)
    figs = {f.slug: f for f in suite.figures("counterfact", rows, ["rome", "memit"])}
    fig = figs["evk-map-counterfact"]
    assert "PCA" in fig.title and fig.png[:8] == b"\x89PNG\r\n\x1a\n" and "evk-sigma-counterfact" in figs
    assert EvkSuite(embedding_map="none").figures("counterfact", rows, ["rome"]) == []


def test_pca_2d_closed_form():
    """Points on a line along (3, 4)/5 with variance split 100 : 1 by a small orthogonal wiggle."""
    t = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    w = np.array([0.2, -0.2, 0.0, -0.2, 0.2])
    x = np.outer(t, [0.6, 0.8]) + np.outer(w, [-0.8, 0.6]) + 5.0
    coords, (a, b) = __import__("editscope.suites.evk", fromlist=["pca_2d"]).pca_2d(x)
    np.testing.assert_allclose(coords[:, 0], t, atol=1e-12)  # sign: largest |coordinate| positive (t = 2)
    np.testing.assert_allclose(np.abs(coords[:, 1]), np.abs(w - w.mean()), atol=1e-12)
    var_t, var_w = (t ** 2).sum(), ((w - w.mean()) ** 2).sum()
    assert (a, b) == pytest.approx((var_t / (var_t + var_w), var_w / (var_t + var_w)))


def test_umap_option_needs_the_package():
    import importlib.util

    if importlib.util.find_spec("umap") is not None:
        pytest.skip("umap is installed")
    with pytest.raises(EditscopeError, match="embedding_map umap needs the umap package"):
        EvkSuite(embedding_map="umap")
    with pytest.raises(EditscopeError, match="embedding_map must be one of pca, umap, none"):
        EvkSuite(embedding_map="tsne")
