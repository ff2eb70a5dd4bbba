"""EVK-Align (paper 004, eqs 11-14) and EVK-Edit: hand-computed top-k KL, identity edits, λ = 0 neutrality."""

from __future__ import annotations

import math

import pytest
import torch

from editscope.edit.context import subject_last_token_index
from editscope.edit.objective import VStep, build_context
from editscope.edit.plugins import PLUGINS, get_plugin
from editscope.edit.plugins.evk_align import EvkAlign, EvkAlignHParams, topk_kl
from editscope.edit.registry import get_editor
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import hooks
from editscope.lm.scorer import ScoreRequest


def test_topk_kl_hand_computation():
    pre = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0]])
    post = torch.tensor([[0.5, 1.5, 0.0, 3.0], [1.0, 2.0, 3.0, 0.0]])
    # row 0: I_2 = {0, 1}; p̃ = softmax(2, 1), q̃ = softmax(0.5, 1.5) (token 3's large post logit is ignored)
    p = [math.e / (math.e + 1), 1 / (math.e + 1)]
    q = [math.exp(0.5) / (math.exp(0.5) + math.exp(1.5)), math.exp(1.5) / (math.exp(0.5) + math.exp(1.5))]
    kl0 = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    # row 1: I_2 = {2, 3}; p̃ = softmax(3, 1), q̃ = softmax(3, 0)
    p = [math.exp(3) / (math.exp(3) + math.e), math.e / (math.exp(3) + math.e)]
    q = [math.exp(3) / (math.exp(3) + 1), 1 / (math.exp(3) + 1)]
    kl1 = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    got = topk_kl(pre, post, 2)
    assert got.tolist() == pytest.approx([kl0, kl1], abs=1e-12)
    # log-probs and logits give the same value (renormalisation over I_k removes the constant)
    assert topk_kl(pre.log_softmax(-1), post.log_softmax(-1), 2).tolist() == pytest.approx([kl0, kl1], abs=1e-6)
    # k = V is the full KL
    full = (pre.softmax(-1) * (pre.log_softmax(-1) - post.log_softmax(-1))).sum(-1)
    assert topk_kl(pre, post, 10).tolist() == pytest.approx(full.tolist(), abs=1e-6)
    assert topk_kl(pre, pre.clone(), 3).tolist() == [0.0, 0.0]


def test_registered_and_validated():
    assert PLUGINS["evk_align"] is get_plugin("evk_align")
    hp = get_plugin("evk_align").attach({"sigma": 0.2, "lam": 1}).hparams
    assert (hp.sigma, hp.lam, hp.k1, hp.k2) == (0.2, 1.0, 10, 50)
    with pytest.raises(EditscopeError, match="drifts"):
        get_plugin("evk_align").attach({"drifts": ["object"]})
    with pytest.raises(EditscopeError, match="'k1'"):
        get_plugin("evk_align").attach({"k1": 0})


@pytest.fixture(scope="module")
def ctx_and_term(tiny_bundles):
    from editscope.data.records import EditRequest

    engine = ScoringEngine(tiny_bundles["llama"])
    request = EditRequest("The mother tongue of {} is", "Danielle Darrieux", "English", "French")
    term = EvkAlign(EvkAlignHParams(sigma=0.3, lam=2.0, n=4, k1=3, k2=7, switch_step=1))
    ctx = build_context(engine, request, ["{}"], "blocks.1.mlp_out", terms=[term])
    term.setup(ctx)
    return ctx, term


def _copies_logprobs(ctx, term, delta: torch.Tensor) -> torch.Tensor:
    """The N copies' next-token log-probs with δ, computed apart from the main batch: their own batch, the whole
    model with a hook adding δ at the subject's last token, read after the prompt."""
    engine, request = ctx.engine, ctx.request
    _, embeds = term.copies(engine, request)
    text = request.prompt.replace("{}", request.subject)
    batch = engine.prepare([ScoreRequest(text, request.target_new, e) for e in embeds])
    position = subject_last_token_index(engine, request.prompt, request.subject)

    def add(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, position] += delta
        return x

    with torch.no_grad(), hooks(engine.model, engine.arch, {ctx.hook_point: add}):
        hidden = engine.batch_hidden(batch)
    read = torch.tensor([n - 1 for n in batch.context_lengths], device=hidden.device)
    rows = torch.arange(len(embeds), device=hidden.device)
    return engine.logits_from_hidden(hidden[rows, read]).double().log_softmax(-1)


def test_identity_edit_gives_zero_and_a_real_delta_gives_the_hand_kl(ctx_and_term):
    ctx, term = ctx_and_term
    copies = ctx.store[term.name]
    assert len(copies.drifts) == 4 and set(copies.drifts) <= {"subject", "relation", "all"}
    zero = torch.zeros(ctx.v_init.shape[0], device=ctx.engine.bundle.device)
    hidden = ctx.run(ctx.batch, ctx.subject_positions, zero)
    copies.calls = 0
    assert abs(float(term(VStep(ctx, zero, hidden)))) < 1e-9  # p_θ is read off the unedited forward
    # a non-zero δ: λ · mean_i KL over TopK(p_pre) with k2 = 7 (second call, past switch_step = 1)
    delta = torch.randn(ctx.v_init.shape[0], generator=torch.Generator().manual_seed(0)).to(ctx.engine.bundle.device)
    hidden = ctx.run(ctx.batch, ctx.subject_positions, delta)
    got = float(term(VStep(ctx, delta, hidden)))
    post = _copies_logprobs(ctx, term, delta)
    pre = _copies_logprobs(ctx, term, torch.zeros_like(delta))
    assert copies.pre.double().cpu().numpy() == pytest.approx(pre.cpu().numpy(), abs=1e-4)
    want = 0.0
    for r in range(4):
        idx = pre[r].topk(7).indices
        p = pre[r, idx].exp() / pre[r, idx].exp().sum()
        q = post[r, idx].exp() / post[r, idx].exp().sum()
        want += float((p * (p / q).log()).sum()) / 4
    assert got == pytest.approx(2.0 * want, rel=1e-5)
    assert got > 0


def test_copies_are_the_seeded_evk_instances(ctx_and_term):
    ctx, term = ctx_and_term
    drifts, embeds = term.copies(ctx.engine, ctx.request)
    assert drifts == ctx.store[term.name].drifts  # same seed -> same copies
    clean = ctx.engine.embed(ctx.request.text)
    assert any(not torch.equal(e, clean) for e in embeds)
    assert [term.k_at(i) for i in range(3)] == [3, 7, 7]


@pytest.mark.parametrize("method", ["rome", "memit"])
def test_lambda_zero_leaves_delta_w_bit_identical(tiny_bundles, request_a, method):
    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    base = editor.compute_patch(bundle, request_a)
    zero = editor.compute_patch(bundle, request_a, plugins=[("evk_align", {"lam": 0.0, "n": 2})])
    assert zero.info["requests"][0]["losses"][-1]["evk_align"] == 0.0  # the term ran
    for name, delta in base.deltas.items():
        assert torch.equal(zero.deltas[name], delta)
    strong = editor.compute_patch(bundle, request_a, plugins=[("evk_align", {"lam": 5.0, "n": 2, "sigma": 0.5})])
    assert any(not torch.equal(strong.deltas[n], d) for n, d in base.deltas.items())  # the term acts


def test_evk_edit_is_alphaedit_plus_evk_align(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    evk = get_editor("evk_edit")
    hp = evk.load_hparams(bundle)
    assert (hp.evk_sigma, hp.evk_lam, hp.evk_n, hp.evk_k1, hp.evk_k2) == (0.1, 0.3, 1, 10, 50)
    alpha = get_editor("alphaedit")
    plain = alpha.compute_patch(bundle, request_a, alpha.load_hparams(bundle))
    neutral = evk.compute_patch(bundle, request_a, hp.replace(evk_lam=0.0))
    for name, delta in plain.deltas.items():
        assert torch.equal(neutral.deltas[name], delta)
    with pytest.raises(EditscopeError, match="already includes"):
        evk.compute_patch(bundle, request_a, hp, plugins=["evk_align"])
    assert evk.sequential and evk.display() == "EVK-Edit"
