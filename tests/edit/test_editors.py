"""Each editor's formula against an independent computation (tiny models and random matrices)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.alphaedit import alphaedit_update, null_space_projector
from editscope.edit.context import context_templates, mlp_out_of_keys, subject_keys
from editscope.edit.memit import memit_update
from editscope.edit.prune import restrain
from editscope.edit.rect import keep_top_relative
from editscope.edit.rome import rank_one_update
from editscope.edit.runtime import EditRuntime
from editscope.lm.engine import ScoringEngine
from editscope.stats.second_moment import second_moment


def random_spd(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 3 * n, generator=g, dtype=torch.float64)
    return a @ a.T / (3 * n)


# -- ROME -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rome_is_rank_one_and_maps_k_star_to_v_star(tiny_bundles, request_a, family):
    bundle = tiny_bundles[family]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle)
    layer = hp.layers[0]
    engine = ScoringEngine(bundle)
    k_star = subject_keys(engine, [request_a], context_templates(engine, hp.context_templates, hp.template_seed),
                          [layer])[0, 0]
    w_k = mlp_out_of_keys(bundle, layer, k_star[None])[0]  # W k* (+ bias) before the edit
    patch = editor.compute_patch(bundle, request_a, hp, engine=engine)
    assert torch.allclose(patch.info["vectors"]["k_star"][0].cpu(), k_star.cpu())
    k_star, w_k = k_star.cpu(), w_k.cpu()  # the checks below are on the CPU, with C from second_moment
    v_star = patch.info["vectors"]["v_star"][0].cpu()
    delta = bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(layer)]).double().cpu()
    s = torch.linalg.svdvals(delta)
    assert s[1] / s[0] < 1e-5  # rank one
    assert torch.allclose(delta @ k_star, v_star - w_k, rtol=1e-4, atol=1e-5)
    # the update direction is C⁻¹k* (covariance adjustment on by default)
    cov = second_moment(bundle, layer, token_budget=hp.mom2_tokens, progress=False)
    u = torch.linalg.solve(cov, k_star)
    row = delta[int(delta.abs().sum(1).argmax())]
    assert torch.allclose(row / row.norm(), u / u.norm() * torch.sign(row @ u), atol=1e-4)


def test_rank_one_update_formula():
    g = torch.Generator().manual_seed(1)
    k, r = torch.randn(12, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    cov = random_spd(12)
    d = rank_one_update(k, r, cov)
    u = torch.linalg.solve(cov, k)
    assert torch.allclose(d, torch.outer(r, u) / (u @ k))
    assert torch.allclose(d @ k, r)
    assert torch.allclose(rank_one_update(k, r, None), torch.outer(r, k) / (k @ k))


# -- MEMIT ----------------------------------------------------------------------------------------------
def test_memit_one_key_closed_form_and_rome_limit():
    g = torch.Generator().manual_seed(2)
    k, r = torch.randn(10, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)
    cov = random_spd(10, 3)
    u = torch.linalg.solve(cov, k)
    for lam in (15000.0, 1.0, 0.3):
        got = memit_update(k[:, None], r[:, None], cov, lam)
        assert torch.allclose(got, torch.outer(r, u) / (lam + k @ u), rtol=1e-9, atol=1e-12)
    assert torch.allclose(memit_update(k[:, None], r[:, None], cov, 1e-7), rank_one_update(k, r, cov), rtol=1e-5)


def test_memit_batch_matches_normal_equations():
    g = torch.Generator().manual_seed(4)
    keys, resid = torch.randn(10, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g,
                                                                                       dtype=torch.float64)
    cov, lam = random_spd(10, 5), 2.0
    d = memit_update(keys, resid, cov, lam)
    # Δ minimises λ‖Δ C^{1/2}‖² + ‖ΔK − R‖²: gradient Δ(λC + KKᵀ) − RKᵀ = 0
    assert torch.allclose(d @ (lam * cov + keys @ keys.T), resid @ keys.T, atol=1e-10)


def test_memit_single_layer_end_to_end(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    editor = get_editor("memit")
    hp = editor.load_hparams(bundle).replace(layers=[2])
    patch = editor.compute_patch(bundle, request_a, hp)
    keys, resid = patch.info["vectors"]["keys.2"].cpu(), patch.info["vectors"]["resid.2"].cpu()
    cov = second_moment(bundle, 2, token_budget=hp.mom2_tokens, progress=False)
    u = torch.linalg.solve(cov, keys[:, 0])
    want = torch.outer(resid[:, 0], u) / (hp.mom2_update_weight + keys[:, 0] @ u)
    got = patch.deltas[bundle.arch.weight_name(2)].double().cpu()
    assert torch.allclose(got, want.float().double(), rtol=1e-4, atol=1e-8)


# -- AlphaEdit ------------------------------------------------------------------------------------------
def test_alphaedit_update_is_zero_on_preserved_keys():
    g = torch.Generator().manual_seed(6)
    basis = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=torch.float64)).Q
    s = torch.cat([torch.linspace(5, 1, 10), torch.full((6,), 1e-4)]).double()
    cov = basis @ torch.diag(s) @ basis.T
    proj = null_space_projector(cov, 2e-2)
    assert torch.allclose(proj @ proj, proj, atol=1e-10) and round(float(torch.trace(proj))) == 6
    keys, resid = torch.randn(16, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g,
                                                                                       dtype=torch.float64)
    cache = random_spd(16, 7)
    d = alphaedit_update(keys, resid, proj, cache, 10.0)
    preserved = basis[:, :10]  # singular vectors with large singular values
    assert d.abs().max() > 1e-3 and (d @ preserved).abs().max() < 1e-10
    lhs = proj @ (keys @ keys.T + cache) + 10.0 * torch.eye(16, dtype=torch.float64)
    assert torch.allclose(lhs @ d.T, proj @ keys @ resid.T, atol=1e-10)


def test_alphaedit_end_to_end_and_sequential_state(tiny_bundles, request_a, request_b):
    bundle = tiny_bundles["llama"]
    editor = get_editor("alphaedit")
    hp = editor.load_hparams(bundle)
    state = editor.new_state()
    covs = {layer: second_moment(bundle, layer, token_budget=hp.mom2_tokens, progress=False)  # of the base weights
            for layer in hp.layers}
    with torch.no_grad():
        patch = editor.apply(bundle, request_a, hp, state)
    try:
        for layer in hp.layers:
            cov = covs[layer]
            u, s, _ = torch.linalg.svd(cov)
            preserved = u[:, s >= hp.nullspace_threshold]
            assert 0 < preserved.shape[1] < cov.shape[0]
            d = bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(layer)]).double().cpu()
            assert d.abs().max() > 0 and (d @ preserved).abs().max() < 1e-5 * d.abs().max() * math.sqrt(d.shape[1])
            assert state.cache_c[layer].abs().max() > 0
        assert state.n_edits == 1
        first = {layer: c.clone() for layer, c in state.cache_c.items()}
        patch2 = editor.apply(bundle, request_b, hp, state)
        assert state.n_edits == 2 and all(not torch.equal(first[la], state.cache_c[la]) for la in hp.layers)
        patch2.revert(bundle)
    finally:
        patch.revert(bundle)


@pytest.mark.parametrize("method", ["memit", "alphaedit"])
def test_solve_condition_number_equals_numpys_of_the_matrix_the_editor_inverts(tiny_bundles, request_a, method):
    """Under runtime diagnostics MEMIT reports κ₂(λC + KKᵀ) and AlphaEdit κ₂(P(KKᵀ + K_pK_pᵀ) + L2·I) per layer
    (K_pK_pᵀ = 0 on a new chain), against numpy's cond of the matrix built here from the patch's keys; without
    diagnostics neither is computed."""
    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    hp = editor.load_hparams(bundle)
    assert "solve_cond" not in editor.compute_patch(bundle, request_a, hp).info
    patch = editor.compute_patch(bundle, request_a, hp, runtime=EditRuntime(diagnostics=True))
    conds = patch.info["solve_cond"]
    assert sorted(conds) == sorted(hp.layers) and patch.info["solve_cond_max"] == max(conds.values())
    for layer in hp.layers:
        keys = patch.info["vectors"][f"keys.{layer}"].double().cpu()
        cov = second_moment(bundle, layer, token_budget=hp.mom2_tokens, progress=False).double()
        eye = torch.eye(cov.shape[0], dtype=torch.float64)
        if method == "memit":
            matrix = hp.mom2_update_weight * cov + keys @ keys.T
        else:
            matrix = null_space_projector(cov, hp.nullspace_threshold) @ (keys @ keys.T) + hp.L2 * eye
        assert conds[layer] == pytest.approx(np.linalg.cond(matrix.numpy()), rel=1e-6)
        assert conds[layer] > 1.0


# -- RECT -----------------------------------------------------------------------------------------------
def test_rect_keeps_exactly_the_share_by_relative_change():
    g = torch.Generator().manual_seed(8)
    delta, weight = torch.randn(20, 30, generator=g), torch.randn(20, 30, generator=g)
    kept = keep_top_relative(delta, weight, 0.4)
    mask = kept != 0
    assert int(mask.sum()) == 240
    assert torch.equal(kept[mask], delta[mask])
    rel = (delta / weight).abs()
    assert rel[mask].min() >= rel[~mask].max()


def test_rect_end_to_end_share(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    patch = get_editor("rect").compute_patch(bundle, request_a)
    for delta in patch.deltas.values():
        assert int((delta != 0).sum()) == round(0.4 * delta.numel())


# -- PRUNE ----------------------------------------------------------------------------------------------
def test_prune_restrains_large_singular_values():
    g = torch.Generator().manual_seed(9)
    u = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64)).Q
    s = torch.tensor([20.0, 9.0, 3.0, 2.0, 0.5, 0.1], dtype=torch.float64)
    delta = u[:, :6] @ torch.diag(s) @ v.T
    out = torch.linalg.svdvals(restrain(delta, 3.0))
    want = torch.tensor([3 + math.log(20 / 3), 3 + math.log(9 / 3), 3.0, 2.0, 0.5, 0.1], dtype=torch.float64)
    assert torch.allclose(out, want)
    assert torch.allclose(restrain(delta, 25.0), delta)  # nothing above the bound: unchanged


def test_prune_state_keeps_model_at_w0_plus_restrained_sum(tiny_bundles, request_a, request_b):
    bundle = tiny_bundles["llama"]
    editor = get_editor("prune")
    hp = editor.load_hparams(bundle)
    state = editor.new_state()
    params = dict(bundle.model.named_parameters())
    w0 = {n: params[bundle.arch.weight_name(la)].detach().clone() for la in hp.layers
          for n in [bundle.arch.weight_name(la)]}
    patches = [editor.apply(bundle, r, hp, state) for r in (request_a, request_b)]
    try:
        for name, w in w0.items():
            assert state.sigma_max[name] == pytest.approx(float(torch.linalg.matrix_norm(w.double(), ord=2)))
            want = w.double() + restrain(state.accumulated[name], state.sigma_max[name])
            assert torch.allclose(params[name].double(), want, atol=1e-6)
        # the row scalars: singular values above the bound, and the largest one's share of it (numpy's SVD)
        svs = {n: np.linalg.svd(state.accumulated[n].cpu().numpy(), compute_uv=False) for n in w0}
        info = patches[-1].info
        assert info["restrained_total"] == sum(int((svs[n] > state.sigma_max[n]).sum()) for n in w0)
        assert info["top_sv_ratio"] == pytest.approx(max(svs[n][0] / state.sigma_max[n] for n in w0), rel=1e-9)
    finally:
        for p in reversed(patches):
            p.revert(bundle)


# -- FT -------------------------------------------------------------------------------------------------
def test_ft_on_a_batch_equals_a_loop_with_one_forward_per_request(tiny_bundles):
    """FT's ΔW on three requests, their rows stacked into one forward per step, against FT-L written out with one
    forward per request (mean over requests of the target NLL, Adam, the L∞ clamp after each step)."""
    bundle = tiny_bundles["llama"]
    editor = get_editor("ft")
    hp = editor.load_hparams(bundle).replace(steps=6, stop_loss=0.0, norm_constraint=1e-2, lr=5e-3)
    requests = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
                EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch"),
                EditRequest("{} plays the", "Toko Yasuda", "piano", "guitar")]
    got = editor.compute_patch(bundle, requests, hp).deltas

    engine = ScoringEngine(bundle)
    (name,) = got
    weight = dict(bundle.model.named_parameters())[name]
    w0 = weight.detach().clone()
    batches = [engine.prepare([(r.text, r.target_new)]) for r in requests]
    try:
        weight.requires_grad_(True)
        opt = torch.optim.Adam([weight], lr=hp.lr)
        for _ in range(hp.steps - 1):  # the last step's loss is only read (FT's early-stop check), never applied
            opt.zero_grad()
            with torch.enable_grad():
                loss = 0.0
                for b in batches:
                    logp = engine.logits_from_hidden(engine.batch_hidden(b)).float().log_softmax(-1)
                    start, n = b.context_lengths[0], b.continuation_lengths[0]
                    ids = b.input_ids[0, start:start + n]
                    loss = loss - logp[0, start - 1:start + n - 1].gather(-1, ids[:, None]).mean()
                (loss / len(batches)).backward()
            opt.step()
            with torch.no_grad():
                weight.copy_(torch.clamp(weight, w0 - hp.norm_constraint, w0 + hp.norm_constraint))
        want = (weight.detach() - w0).clone()
    finally:
        with torch.no_grad():
            weight.requires_grad_(False)
            weight.copy_(w0)
    assert want.abs().max() > 0
    # Adam divides each step by sqrt(v): an element whose gradient sits near float32 noise moves by up to lr
    # either way, so the batched and the looped forward (summed in another order, which also depends on the
    # thread count) differ by ~1e-5 of the norm; a packing or position bug differs by O(1).
    assert float((got[name] - want).norm() / want.norm()) <= 1e-4


def test_ft_respects_the_norm_bound(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    editor = get_editor("ft")
    hp = editor.load_hparams(bundle)
    engine = ScoringEngine(bundle)
    pre = engine.score([(request_a.text, request_a.target_new)])[0].sum
    patch = editor.apply(bundle, request_a, hp, engine=engine)
    try:
        post = engine.score([(request_a.text, request_a.target_new)])[0].sum
        (delta,) = patch.deltas.values()
        assert delta.abs().max() <= hp.norm_constraint * (1 + 1e-3) and delta.abs().max() > 0
        assert post > pre
    finally:
        patch.revert(bundle)
