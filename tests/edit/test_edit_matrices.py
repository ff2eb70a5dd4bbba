"""Which MLP matrices an editor writes (``modules: [gate, up, down]``): UltraEdit's gate/up turn against a plain
re-implementation with each matrix's own keys, FT training the named matrices, the parameters a patch holds and
reverts, the plan's count, and the refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.budget import model_shape, plan_edit
from editscope.edit.ultraedit import EPS, shape_key
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine

TURN = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
        EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch"),
        EditRequest("{} plays the position of", "Toko Yasuda", "Ouagadougou quarterback", "guitar")]


def matrix_rows(model, engine: ScoringEngine, req: EditRequest, mods: dict) -> dict:
    """One request's inputs and output gradients of each module in ``mods`` (name -> nn.Linear) at the positions
    predicting its answer, from one plain HF forward of Σ −log P(o* | p) (no padding, no batching)."""
    ctx, cont = engine.encode_pair(req.text, req.target_new)
    ids = torch.tensor([ctx + cont])
    c, n = len(ctx), len(cont)
    seen = {}

    def keep(name):
        def hook(_module, args, output):
            output.retain_grad()
            seen[name] = (args[0], output)
        return hook

    handles = [m.register_forward_hook(keep(name)) for name, m in mods.items()]
    try:
        with torch.enable_grad():
            embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            lp = model(inputs_embeds=embeds).logits[0][c - 1:c + n - 1].log_softmax(-1)
            (-lp.gather(-1, ids[0, c:c + n][:, None]).sum()).backward()
    finally:
        for h in handles:
            h.remove()
    return {name: (x[0, c - 1:c + n - 1].detach().double(), y.grad[0, c - 1:c + n - 1].double())
            for name, (x, y) in seen.items()}


def plain_turn(model, engine, requests, mods: dict, lr: float, ridge: float) -> dict:
    """UltraEdit's turn on the named modules with an empty normaliser: keys K (each module's own input: the post-norm
    hidden state for gate and up), gradients at each module's output; the modules of one shape share μ and σ (the
    reference keys its normalisers by shape); ΔWᵀ = (KᵀK + λI)⁻¹ KᵀV in the paper's (in × in) form."""
    rows = {name: ([], []) for name in mods}
    for req in requests:
        for name, (k, g) in matrix_rows(model, engine, req, mods).items():
            rows[name][0].append(k)
            rows[name][1].append(g)
    feats = {name: torch.cat([torch.cat(ks), torch.cat(gs)], -1) for name, (ks, gs) in rows.items()}
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for name, z in feats.items():
        by_shape.setdefault(tuple(mods[name].weight.shape), []).append(z)
    out = {}
    for name, z in feats.items():
        pool = torch.cat(by_shape[tuple(mods[name].weight.shape)])
        z_hat = (z - pool.mean(0)) / (pool.std(0) + EPS)
        n_in = mods[name].weight.shape[1]
        keys = torch.cat(rows[name][0])
        values = -lr * (z_hat[:, :n_in] ** 2).sum(-1, keepdim=True) * z_hat[:, n_in:]
        out[name] = torch.linalg.solve(keys.T @ keys + ridge * torch.eye(n_in, dtype=torch.float64),
                                       keys.T @ values).T
    return out


def test_a_gate_and_up_turn_equals_the_ridge_solve_on_each_matrixs_own_keys(tiny_bundles):
    bundle = copy.deepcopy(tiny_bundles["llama"])
    bundle.model.double()
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(bundle).replace(layers=[1, 2], lr=3e-3, ridge=0.5, modules=["gate", "up"])
    mlp = {la: bundle.model.model.layers[la].mlp for la in hp.layers}
    mods = {f"model.layers.{la}.mlp.{p}.weight": getattr(mlp[la], p) for la in hp.layers
            for p in ("gate_proj", "up_proj")}
    engine = ScoringEngine(bundle, token_budget=24)
    want = plain_turn(bundle.model, engine, TURN, mods, hp.lr, hp.ridge)
    patch, state = editor.compute_edit(bundle, TURN, hp, editor.new_state(), engine=engine)
    assert set(patch.deltas) == set(mods)  # gate and up at each layer; no down projection
    for name, delta in patch.deltas.items():
        assert want[name].abs().max() > 1e-4
        assert (delta - want[name]).abs().max() <= 1e-7 * want[name].abs().max(), name
    d, ff = bundle.hidden_size, bundle.arch.mlp_size(bundle.config)
    n_rows = patch.info["answer_tokens"]
    assert state.counts == {shape_key(d, ff): 4 * n_rows}  # one normaliser: 2 layers x gate and up
    assert set(patch.info["solve_cond"]) == {"1.gate", "1.up", "2.gate", "2.up"}
    assert hp.to_dict()["modules"] == ["gate", "up"]
    assert "modules" not in editor.load_hparams(bundle).to_dict()  # the default: rows keep their bytes


def test_down_with_up_keeps_one_normaliser_per_shape_and_the_down_delta_of_a_down_only_turn(tiny_bundles):
    """The down projection's ΔW depends only on its own shape's statistics, so adding the up projection leaves it
    unchanged; the edit applies and reverts every written matrix exactly."""
    bundle = copy.deepcopy(tiny_bundles["llama"])
    bundle.model.double()
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(bundle).replace(layers=[2, 3], lr=3e-3)
    engine = ScoringEngine(bundle)
    down_only, _ = editor.compute_edit(bundle, TURN, hp, editor.new_state(), engine=engine)
    both, state = editor.compute_edit(bundle, TURN, hp.replace(modules=["up", "down"]), editor.new_state(),
                                      engine=engine)
    d, ff = bundle.hidden_size, bundle.arch.mlp_size(bundle.config)
    assert set(state.counts) == {shape_key(d, ff), shape_key(ff, d)}
    for name, delta in down_only.deltas.items():
        torch.testing.assert_close(both.deltas[name], delta, rtol=0, atol=0)
    assert editor.param_names(bundle, hp.replace(modules=["up", "down"])) == [
        f"model.layers.{la}.mlp.{p}.weight" for la in (2, 3) for p in ("up_proj", "down_proj")]
    before = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    applied = editor.apply(bundle, TURN, hp.replace(modules=["up", "down"]), editor.new_state(), engine=engine)
    changed = {n for n, p in bundle.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(both.deltas)
    applied.revert(bundle)
    assert all(torch.equal(p, before[n]) for n, p in bundle.model.named_parameters())


def test_ft_trains_only_the_named_matrices(tiny_bundles):
    bundle = copy.deepcopy(tiny_bundles["llama"])
    editor = get_editor("ft")
    hp = editor.load_hparams(bundle).replace(layers=[1], modules=["gate"], steps=3, lr=1e-2, norm_constraint=1.0)
    patch = editor.compute_patch(bundle, TURN[:1], hp)
    assert list(patch.deltas) == ["model.layers.1.mlp.gate_proj.weight"]
    assert patch.deltas["model.layers.1.mlp.gate_proj.weight"].abs().max() > 0
    # Adam moves each entry by at most ~lr per step: the clamp at 1.0 never binds, the bound at 1e-4 does
    clamped = editor.compute_patch(bundle, TURN[:1], hp.replace(norm_constraint=1e-4))
    assert clamped.deltas["model.layers.1.mlp.gate_proj.weight"].abs().max() <= 1e-4 + 1e-7


def test_a_matrix_the_family_lacks_or_an_unknown_name_is_one_line(tiny_bundles):
    gpt2 = tiny_bundles["gpt2"]
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(gpt2).replace(modules=["gate"])
    with pytest.raises(EditscopeError, match="gpt2 architecture has no separate gate projection"):
        editor.compute_patch(gpt2, TURN[:1], hp)
    with pytest.raises(EditscopeError, match="gpt2 architecture has no separate gate projection"):
        editor.load_hparams(gpt2, overrides={"modules": ["gate"]})  # before any work, where a run loads them
    with pytest.raises(EditscopeError, match="key 'modules': 'fc' is not one of gate, up, down"):
        hp.replace(modules=["fc"])
    with pytest.raises(EditscopeError, match="key 'modules': a matrix is named twice"):
        hp.replace(modules=["up", "up"])
    with pytest.raises(EditscopeError, match="key 'modules': at least one"):
        get_editor("ft").load_hparams(gpt2).replace(modules=[])
    # GPT-2's up projection (c_fc, stored in x out) is written in its own orientation
    patch = editor.compute_patch(gpt2, TURN[:1], editor.load_hparams(gpt2).replace(modules=["up"]))
    for name, delta in patch.deltas.items():
        assert name.endswith("mlp.c_fc.weight") and delta.shape == dict(gpt2.model.named_parameters())[name].shape


def test_the_plan_counts_every_written_matrix():
    shape = model_shape("tiny-llama")
    hp = get_editor("ultraedit").load_hparams("tiny-llama")
    one = plan_edit(shape, "ultraedit", hp)
    three = plan_edit(shape, "ultraedit", hp.replace(modules=["gate", "up", "down"]))
    patch = {p.name: p.bytes for p in one.terms}["patch"]
    assert {p.name: p.bytes for p in three.terms}["patch"] == 3 * patch
    # the gate and up solves are d x d, the down projection's d_ff x d_ff (float64, the system and its LU)
    gate_up = plan_edit(shape, "ultraedit", hp.replace(modules=["gate", "up"]))
    assert {p.name: p.bytes for p in gate_up.terms}["solve"] == 3 * shape.hidden ** 2 * 8
    assert {p.name: p.bytes for p in one.terms}["solve"] == 3 * shape.mlp ** 2 * 8


def test_a_layer_set_per_matrix_writes_each_matrix_at_its_own_layers(tiny_bundles):
    """``modules: {gate: [1], up: [2]}`` (the reference's LLaMA-3 split, in small): the turn writes the gate
    projection of block 1 and the up projection of block 2 and nothing else, each equal to the plain ridge solve on
    its own keys (the two share one normaliser: one shape); ``layers`` is their union, filled in when left out."""
    bundle = copy.deepcopy(tiny_bundles["llama"])
    bundle.model.double()
    editor = get_editor("ultraedit")
    split = {"gate": [1], "up": [2]}
    hp = editor.load_hparams(bundle).replace(layers=[1, 2], lr=3e-3, ridge=0.5, modules=split)
    assert type(hp).from_dict({"modules": split}).layers == [1, 2]  # implied by the mapping
    layers = bundle.model.model.layers
    mods = {"model.layers.1.mlp.gate_proj.weight": layers[1].mlp.gate_proj,
            "model.layers.2.mlp.up_proj.weight": layers[2].mlp.up_proj}
    engine = ScoringEngine(bundle, token_budget=24)
    want = plain_turn(bundle.model, engine, TURN, mods, hp.lr, hp.ridge)
    patch, state = editor.compute_edit(bundle, TURN, hp, editor.new_state(), engine=engine)
    assert list(patch.deltas) == list(mods) == editor.param_names(bundle, hp)
    for name, delta in patch.deltas.items():
        assert want[name].abs().max() > 1e-4
        assert (delta - want[name]).abs().max() <= 1e-7 * want[name].abs().max(), name
    assert state.counts == {shape_key(bundle.hidden_size, bundle.arch.mlp_size(bundle.config)):
                            2 * patch.info["answer_tokens"]}
    assert set(patch.info["solve_cond"]) == {"1.gate", "2.up"} and hp.to_dict()["modules"] == split
    ft = get_editor("ft")
    trained = ft.compute_patch(bundle, TURN[:1], ft.load_hparams(bundle).replace(layers=[1, 3], steps=2,
                                                                                  modules={"gate": [1], "down": [3]}))
    assert list(trained.deltas) == ["model.layers.1.mlp.gate_proj.weight", "model.layers.3.mlp.down_proj.weight"]
    shape = model_shape("tiny-llama")
    one = {p.name: p.bytes for p in plan_edit(shape, "ultraedit", hp.replace(modules=["gate"], layers=[1])).terms}
    split_plan = plan_edit(shape, "ultraedit", hp.replace(modules={"gate": [1], "up": [1, 2]}))
    assert {p.name: p.bytes for p in split_plan.terms}["patch"] == 3 * one["patch"]


def test_a_bad_layer_set_per_matrix_is_one_line(tiny_bundles):
    hp = get_editor("ultraedit").load_hparams(tiny_bundles["llama"])
    with pytest.raises(EditscopeError, match=r"key 'layers': with a layer set per matrix in 'modules' it is their "
                                             r"union \[1, 2\] \(or leave it out\), got \[0\]"):
        hp.replace(layers=[0], modules={"gate": [1], "up": [2]})
    with pytest.raises(EditscopeError, match=r"key 'modules.up': its layers must be increasing without repeats"):
        hp.replace(layers=[1, 2], modules={"gate": [1], "up": [2, 1]})
    with pytest.raises(EditscopeError, match=r"key 'modules.up': .*at least one, got \[\]"):
        hp.replace(layers=[1], modules={"gate": [1], "up": []})
    with pytest.raises(EditscopeError, match=r"key 'modules': 'fc' is not one of"):
        hp.replace(layers=[1], modules={"fc": [1]})
    with pytest.raises(EditscopeError, match=r"key 'layers'.*layer 9"):
        get_editor("ultraedit").load_hparams(tiny_bundles["llama"], overrides={"layers": [9], "modules": {"up": [9]}})
