"""APP (paper 003 eqs 7-10 / 14-17): each term against a hand computation, the whole term against an independent
one-row-at-a-time forward with a plain torch hook, the pre-edit filter against the peak suite's rule, and on
tiny-llama: α=β=γ=0 leaves ΔW bit-identical, a large α reaches the margin M after the edit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from editscope.cli import main
from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.context import subject_last_token_index
from editscope.edit.objective import FORWARDS, VContext, VStep, build_context, setup_terms
from editscope.edit.plugins import PLUGINS
from editscope.edit.plugins.app import (
    AppHParams,
    AppTerm,
    margin_loss,
    preservation_loss,
    prevention_loss,
)
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.full_forward import FullForward
from editscope.lm.partial_forward import SharedContextForward, SuffixForward
from editscope.metrics import peak_answer_filter
from editscope.run import parse_config
from tests.run.helpers import SUITES

LAYER = 1
REQUEST = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France",
                      correct_answers=("France", "Greece", "Syria", "Japan"), hard_false=("Iraq", "Greece", "Lebanon"))


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# -- the three terms by hand ----------------------------------------------------------------------------
def test_margin_loss_by_hand_with_hinge_at_exactly_m_and_at_zero():
    correct, false = t([-1.0, -3.0]), t([-3.0, -5.0])
    # pairs: (-1,-3): 2+1-3 = 0 (margin exactly M); (-1,-5): -2 -> 0; (-3,-3): 2; (-3,-5): 0 (exactly M)
    assert float(margin_loss(correct, false, 2.0)) == pytest.approx(2.0 / 4)
    assert float(margin_loss(t([0.0]), t([-2.0]), 2.0)) == 0.0  # exactly M apart
    assert float(margin_loss(t([0.0]), t([-1.5]), 2.0)) == pytest.approx(0.5)
    assert float(margin_loss(t([-4.0]), t([-1.0]), 2.0)) == pytest.approx(5.0)
    assert float(margin_loss(t([]), t([-1.0]), 2.0)) == 0.0 and float(margin_loss(t([-1.0]), t([]), 2.0)) == 0.0


def test_preservation_and_prevention_by_hand():
    pre, post = t([-1.0, -2.0, -3.0]), t([-1.5, -1.0, -3.0])
    assert float(preservation_loss(pre, post)) == pytest.approx(0.5 / 3)  # only the first dropped (by 0.5)
    pre_f, post_f = t([-4.0, -5.0]), t([-3.0, -6.0])
    assert float(prevention_loss(pre_f, post_f)) == pytest.approx(1.0 / 2)  # only the first rose (by 1)
    assert float(preservation_loss(t([]), t([]))) == 0.0 and float(prevention_loss(t([]), t([]))) == 0.0


def test_gradient_of_l2_is_zero_when_no_correct_answer_dropped():
    pre = t([-1.0, -2.0, -3.0])
    post = t([-0.5, -2.0, -1.0]).requires_grad_(True)  # rose, equal, rose
    preservation_loss(pre, post).backward()
    assert torch.equal(post.grad, torch.zeros(3, dtype=torch.float64))
    post = t([-0.5, -2.5, -1.0]).requires_grad_(True)  # the second dropped: d/dpost = -1/N there only
    preservation_loss(pre, post).backward()
    assert torch.allclose(post.grad, t([0.0, -1 / 3, 0.0]))


def test_hparams_are_validated():
    with pytest.raises(EditscopeError, match="key 'alpha': must be a finite number >= 0"):
        PLUGINS["app"].attach({"alpha": -1.0})
    with pytest.raises(EditscopeError, match="key 'logprob': must be one of sum, mean"):
        PLUGINS["app"].attach({"logprob": "max"})
    with pytest.raises(EditscopeError, match="key 'k_false': expected"):
        PLUGINS["app"].attach({"k_false": 1.5})
    assert PLUGINS["app"].attach({"k": 3, "k_false": 1}).hparams.limits() == (3, 1)
    hp = AppHParams()
    assert (hp.alpha, hp.beta, hp.gamma, hp.margin, hp.logprob) == (0.2, 0.2, 0.1, 2.0, "sum")  # Table 8, ROME


# -- the term on a model ----------------------------------------------------------------------------------
def naive_logprob(bundle, text: str, answer: str, pos: int, delta: torch.Tensor, mode: str) -> float:
    """log P(answer | text) from one unpadded row of the raw HF model with δ added to the MLP output of LAYER at
    ``pos`` by a plain torch hook."""
    tok, model = bundle.tokenizer, bundle.model
    n_ctx = len(tok(text)["input_ids"])
    ids = tok(text + " " + answer)["input_ids"]

    def add(_m, _a, out):
        bump = torch.zeros_like(out)
        bump[0, pos] = delta
        return out + bump

    handle = model.model.layers[LAYER].mlp.register_forward_hook(add)
    try:
        with torch.no_grad():
            lp = model(input_ids=torch.tensor([ids], device=bundle.device)).logits[0].double().log_softmax(-1)
    finally:
        handle.remove()
    tokens = [float(lp[i - 1, ids[i]]) for i in range(n_ctx, len(ids))]
    return sum(tokens) / (len(tokens) if mode == "mean" else 1)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_term_equals_an_independent_computation(tiny_bundles, mode):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    hp = AppHParams(alpha=0.7, beta=1.3, gamma=0.4, margin=2.0, logprob=mode, filter_answers=False)
    term = AppTerm(hp)
    ctx = build_context(engine, REQUEST, ["{}"], f"blocks.{LAYER}.mlp_out")
    setup_terms(ctx, [term])
    state = ctx.store["app"]
    # o* and repeats leave O; O_h loses what is in O (the peak suite's rule)
    assert state.correct == ["France", "Greece", "Syria"] and state.hard_false == ["Iraq", "Lebanon"]
    delta = torch.randn(bundle.model.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(bundle.device)
    delta = delta * 3.0
    value = term(VStep(ctx, delta, ctx.run(ctx.batch, ctx.subject_positions, delta)))
    pos = len(bundle.tokenizer(REQUEST.subject)["input_ids"]) - 1
    zero = torch.zeros_like(delta)
    pre = {a: naive_logprob(bundle, REQUEST.text, a, pos, zero, mode) for a in state.correct + state.hard_false}
    post = {a: naive_logprob(bundle, REQUEST.text, a, pos, delta, mode) for a in pre}
    l1 = np.mean([max(0.0, 2.0 - post[c] + post[f]) for c in state.correct for f in state.hard_false])
    l2 = np.mean([max(0.0, pre[c] - post[c]) for c in state.correct])
    l3 = np.mean([max(0.0, post[f] - pre[f]) for f in state.hard_false])
    assert l1 > 0 and l2 > 0 and l3 > 0  # every term is active, so each weight is checked
    assert float(value) == pytest.approx(0.7 * l1 + 1.3 * l2 + 0.4 * l3, rel=1e-4, abs=1e-4)
    assert state.history[-1] == pytest.approx({"L1": l1, "L2": l2, "L3": l3}, rel=1e-4, abs=1e-4)


CAPITAL = EditRequest("{} is the capital of", "Paris", "Japan", correct_answers=("France", "the French Republic"),
                      hard_false=("Germany", "Spain", "the United Kingdom"))  # one-token subject: δ at position 0
SINGLE = EditRequest(REQUEST.prompt, REQUEST.subject, "Japan", correct_answers=("France", "Greece"),
                     hard_false=("Iraq", "Spain"))  # one-token answers: nothing after the prompt to run


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gptj", "gemma3"])
@pytest.mark.parametrize(("point", "request_"), [(f"blocks.{LAYER}.mlp_out", REQUEST),
                                                 (f"blocks.{LAYER}.resid_post", REQUEST),
                                                 (f"blocks.{LAYER}.mlp_out", CAPITAL),
                                                 (f"blocks.{LAYER}.mlp_out", SINGLE)])
def test_side_batch_on_the_fast_path_equals_the_full_forward(tiny_bundles, arch, point, request_):
    """APP's answers share the prompt: each step runs it once, from the edited block and the subject on, then the
    answers (``ctx.run(..., fixed=True)``); the term and its δ-gradient equal the full forward's at every step."""
    engine = ScoringEngine(tiny_bundles[arch])
    hp = AppHParams(alpha=0.7, beta=1.3, gamma=0.4, filter_answers=False)
    results = {}
    for path in ("full", "fast"):
        term = AppTerm(hp)
        ctx = build_context(engine, request_, ["{}", "A short prefix. {}"], point, forward=FORWARDS[path])
        setup_terms(ctx, [term])
        gen = torch.Generator().manual_seed(1)
        out = []
        for _ in range(2):
            delta = torch.randn(engine.model.config.hidden_size, generator=gen).to(engine.bundle.device)
            delta = (delta * 3.0).requires_grad_(True)
            value = term(VStep(ctx, delta, ctx.run(ctx.batch, ctx.subject_positions, delta)))
            value.backward()
            out.append((float(value.detach()), delta.grad.clone()))
        taken = [type(held[1]) for held in ctx._side.values()]
        assert taken == ([SharedContextForward] if path == "fast" else [FullForward])
        results[path] = out
    for (v_full, g_full), (v_fast, g_fast) in zip(results["full"], results["fast"], strict=True):
        assert v_full > 0 and float(g_full.norm()) > 0
        assert v_fast == pytest.approx(v_full, rel=1e-5, abs=1e-6)
        assert torch.allclose(g_fast, g_full, rtol=1e-4, atol=1e-6)


def test_side_batch_with_different_contexts_takes_the_suffix_forward(tiny_bundles):
    """Rows that do not share their context fall back to the per-row suffix forward: equal to the full forward
    at every position up to each row's last continuation token's predecessor."""
    engine = ScoringEngine(tiny_bundles["llama"])
    ctx = build_context(engine, REQUEST, ["{}"], f"blocks.{LAYER}.mlp_out")
    prefixed = "A short prefix. " + REQUEST.prompt
    batch = engine.prepare([(REQUEST.text, "France"), (prefixed.format(REQUEST.subject), "Greece and Syria")])
    positions = [subject_last_token_index(engine, REQUEST.prompt, REQUEST.subject),
                 subject_last_token_index(engine, prefixed, REQUEST.subject)]
    assert positions[0] != positions[1]
    delta = torch.randn(engine.model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    delta = delta.to(engine.bundle.device) * 3.0
    fast = ctx.run(batch, positions, delta, fixed=True)
    assert [type(held[1]) for held in ctx._side.values()] == [SuffixForward]
    full = FullForward(engine, batch, positions, ctx.hook_point).hidden(delta)
    for r, (c, n) in enumerate(zip(batch.context_lengths, batch.continuation_lengths, strict=True)):
        assert torch.allclose(fast[r, : c + n - 1], full[r, : c + n - 1], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(full, ctx.run(batch, positions, None), atol=1e-3)  # δ acts


@pytest.mark.parametrize("path", ["full", "fast"])
def test_l2_and_l3_are_exactly_zero_before_the_first_step(tiny_bundles, path):
    """P is read by the forward that reads P' (with δ = 0), so at δ = 0 the hinges of L2/L3 sit exactly at 0 and
    give no gradient: rounding differences between two forwards cannot switch them on (the fast path is the case
    that needs it; on the full path both reads are one forward anyway)."""
    engine = ScoringEngine(tiny_bundles["llama"])
    term = AppTerm(AppHParams(filter_answers=False))
    ctx = build_context(engine, REQUEST, ["{}", "A short prefix. {}"], f"blocks.{LAYER}.mlp_out",
                        forward=FORWARDS[path])
    setup_terms(ctx, [term])
    delta = torch.zeros(engine.model.config.hidden_size, requires_grad=True, device=engine.bundle.device)
    term(VStep(ctx, delta, ctx.run(ctx.batch, ctx.subject_positions, delta)))
    parts = ctx.store["app"].history[-1]
    assert parts["L2"] == 0.0 and parts["L3"] == 0.0 and parts["L1"] > 0


def test_ft_side_batch_on_the_shared_context_path_equals_the_full_forward(tiny_bundles):
    """FT trains weights (no δ): APP's answers run the prompt once per step, then the answers; the term and its
    gradient in the trained weight equal the full forward's (with the weight moved, so L1, L2, L3 all act)."""
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    weight = bundle.model.model.layers[LAYER].mlp.down_proj.weight
    saved = weight.detach().clone()
    hp = AppHParams(alpha=0.7, beta=1.3, gamma=0.4, filter_answers=False)
    results = {}
    try:
        for path in ("full", "fast"):
            term = AppTerm(hp)
            ctx = VContext(engine, bundle, REQUEST, None, engine.prepare([(REQUEST.text, REQUEST.target_new)]), [], 1,
                           forward=FORWARDS[path])
            setup_terms(ctx, [term])
            with torch.no_grad():
                noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(2)) * 0.5
                weight.add_(noise.to(weight.device))
            weight.requires_grad_(True)
            value = term(VStep(ctx, None, engine.batch_hidden(ctx.batch)))
            value.backward()
            taken = [type(held[1]) for held in ctx._side.values()]
            assert taken == ([SharedContextForward] if path == "fast" else [FullForward])
            results[path] = (float(value.detach()), weight.grad.clone(), dict(ctx.store["app"].history[-1]))
            weight.requires_grad_(False)
            weight.grad = None
            with torch.no_grad():
                weight.copy_(saved)
    finally:
        weight.requires_grad_(False)
        with torch.no_grad():
            weight.copy_(saved)
    (v_full, g_full, parts), (v_fast, g_fast, _) = results["full"], results["fast"]
    assert min(parts.values()) > 0 and float(g_full.norm()) > 0
    assert v_fast == pytest.approx(v_full, rel=1e-5, abs=1e-6)
    assert torch.allclose(g_fast, g_full, rtol=1e-4, atol=1e-6)


def test_pre_edit_filter_and_k_follow_the_peak_rule(tiny_bundles):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    request = EditRequest(REQUEST.prompt, REQUEST.subject, "Japan", correct_answers=(
        "France", "Greece", "Syria", "Italy", "Spain", "Chile"), hard_false=("Iraq", "Lebanon", "Peru", "Cuba", "Oman"))
    scores = engine.score([(request.text, a) for a in request.correct_answers + request.hard_false])
    probs = np.exp([s.sum / len(s.token_ids) for s in scores])
    keep_c, keep_h, _ = peak_answer_filter(probs[:6], probs[6:])
    want_c = [request.correct_answers[i] for i in keep_c]
    want_h = [request.hard_false[i] for i in keep_h]
    ctx = build_context(engine, request, ["{}"], f"blocks.{LAYER}.mlp_out")
    term = AppTerm(AppHParams())
    setup_terms(ctx, [term])
    state = ctx.store["app"]
    assert (state.correct, state.hard_false) == (want_c, want_h)
    assert len(want_c) < 6 or len(want_h) < 5  # the filter dropped something on this random model
    assert sorted(state.dropped["correct"] + want_c) == sorted(request.correct_answers)
    term = AppTerm(AppHParams(k_correct=1, k_false=2, filter_answers=False))
    setup_terms(ctx, [term])
    assert (ctx.store["app"].correct, ctx.store["app"].hard_false) == (["France"], ["Iraq", "Lebanon"])
    sums = [s.sum for s in scores]
    assert ctx.store["app"].pre.tolist() == pytest.approx([sums[0], sums[6], sums[7]], abs=1e-4)


def test_a_request_without_answers_is_an_error(tiny_bundles):
    with pytest.raises(EditscopeError, match="no other correct and no hard false answers"):
        get_editor("rome").compute_patch(tiny_bundles["llama"], EditRequest("{} is a citizen of", "X Y", "Japan"),
                                         plugins=["app"])


# -- coupled to the editors -------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["rome", "ft", "memit", "alphaedit"])
def test_zero_weights_give_the_base_editors_delta_w_bit_identically(tiny_bundles, method):
    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    hp = editor.load_hparams(bundle)
    base = editor.compute_patch(bundle, REQUEST, hp)
    zero = editor.compute_patch(bundle, REQUEST, hp, plugins=[("app", {"alpha": 0.0, "beta": 0.0, "gamma": 0.0,
                                                                         "filter_answers": False})])
    on = editor.compute_patch(bundle, REQUEST, hp, plugins=[("app", {"alpha": 5.0, "filter_answers": False})])
    assert base.deltas.keys() == zero.deltas.keys() == on.deltas.keys()
    assert all(torch.equal(base.deltas[n], zero.deltas[n]) for n in base.deltas)
    assert any(not torch.allclose(base.deltas[n], on.deltas[n]) for n in base.deltas)  # APP reaches the editor


def test_large_alpha_reaches_the_margin_after_a_rome_edit(tiny_bundles):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    editor = get_editor("rome")
    # Bare prompt only (k* = the bare prompt's key, so ROME's update reproduces v* there), no KL, no norm penalty,
    # a wide clamp; the subject ends the prompt, so δ sits where the answer is predicted (on this random 4-layer
    # model δ three tokens earlier cannot move the margin by 2 nats). After 25 steps the hinge is inactive.
    hp = editor.load_hparams(bundle, overrides={
        "layers": [LAYER], "context_templates": [], "kl_factor": 0.0, "v_weight_decay": 0.0, "clamp_norm_factor": 50.0,
        "v_steps": 25, "v_lr": 0.5, "stop_loss": 0.0, "mom2_adjustment": False})
    request = EditRequest("Citizenship of {}", REQUEST.subject, "Japan", correct_answers=("Greece",),
                          hard_false=("Syria",))

    def margin() -> float:
        greece, syria = engine.score([(request.text, "Greece"), (request.text, "Syria")])
        return greece.sum - syria.sum

    assert margin() < 0  # the false answer starts above the correct one
    with_app = editor.apply(bundle, request, hp, engine=engine,
                            plugins=[("app", {"alpha": 10.0, "beta": 0.0, "gamma": 0.0, "filter_answers": False})])
    try:
        post = margin()
    finally:
        with_app.revert(bundle)
    plain = editor.apply(bundle, request, hp, engine=engine)
    try:
        post_plain = margin()
    finally:
        plain.revert(bundle)
    assert post >= 2.0
    assert post_plain < 2.0  # without APP the edit alone does not do it


# -- reachable from the CLI and the run config ----------------------------------------------------------------
def test_cli_shows_the_answers_before_and_after(tiny_bundles, capsys):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    args = ["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", REQUEST.prompt, "--subject",
            REQUEST.subject, "--target", " Japan", "--plugin", "app:alpha=5,beta=0.5,gamma=0.2,filter_answers=false",
            "--correct", " Greece", " Syria", "--hard-false", " Iraq", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "ROME+APP" and out["plugins"][0]["alpha"] == 5.0
    assert [(a["text"], a["kind"]) for a in out["answers"]] == [(" Greece", "correct"), (" Syria", "correct"),
                                                                 (" Iraq", "hard_false")]
    pre = engine.score([(REQUEST.text, a) for a in (" Greece", " Syria", " Iraq")])
    assert [a["pre"] for a in out["answers"]] == pytest.approx([s.sum for s in pre], abs=1e-4)
    assert all(a["post"] != a["pre"] for a in out["answers"])


def test_run_config_names_rome_plus_app():
    data = {"model": "tiny-llama", "dataset": "peak-cf", "suites": ["rewrite_es"],
            "methods": [{"name": "rome",
                         "plugins": [{"name": "app", "alpha": 0.2, "beta": 0.2, "gamma": 0.1, "k": 3}]}]}
    (spec,) = parse_config(data, where="exp.yaml", suites=SUITES).methods
    (plugin,) = spec.attached_plugins()
    assert spec.label == "rome+app" and get_editor("rome").display([plugin]) == "ROME+APP"
    assert plugin.hparams.limits() == (3, 3)
    data["methods"][0]["plugins"][0]["gama"] = 0.1
    with pytest.raises(EditscopeError, match="key 'gama': unknown hyperparameter"):
        parse_config(data, where="exp.yaml", suites=SUITES)


@pytest.mark.parametrize("name", ["peak-table3", "peak-table4", "peak-app-ablation"])
def test_shipped_peak_configs_pair_each_editor_with_its_app_twin(name):
    from editscope.paths import config_path
    from editscope.run import load_config

    methods = load_config(str(config_path(f"experiments/{name}"))).methods
    # editors that optimise no loss (KN) take no plug-in: their rows stand alone (the paper's KN row has no APP twin)
    plain = {m.name for m in methods if not m.plugins and get_editor(m.name).optimises}
    with_app = {m.name for m in methods if [p["name"] for p in m.plugins] == ["app"]}
    assert plain == with_app and {"rome", "memit"} <= plain
    assert all(m.label.startswith(f"{m.name}+app") for m in methods if m.plugins)
