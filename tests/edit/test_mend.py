"""MEND (Mitchell et al. 2022): the update equals eq. 3 applied by hand to independently captured gradient factors,
checkpoints round-trip through safetensors, training lowers the edit loss and resumes exactly, patches revert."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from editscope.cli import main
from editscope.data.records import EditRequest
from editscope.edit import EDITORS
from editscope.edit.mend import checkpoint_dir, load_checkpoint, new_nets, save_checkpoint
from editscope.edit.mend.core import CHECKPOINT
from editscope.edit.mend.train import mend_losses, optimizer_for, train, training_cases
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine


@pytest.fixture
def mend_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _randomise(nets, seed: int = 1) -> None:
    """Fixed, non-identity editor weights and normaliser statistics."""
    gen = torch.Generator().manual_seed(seed)
    device = nets.lrs.device
    with torch.no_grad():
        for p in nets.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        nets.lrs.copy_(torch.tensor([1e-3, -2e-3]))
        for j in range(len(nets.u_norm)):
            nets.u_norm[j].update((torch.randn(7, nets.d_in, generator=gen) * 0.5 + 0.1).to(device))
            nets.d_norm[j].update((torch.randn(7, nets.d_out, generator=gen) * 0.1).to(device))


def _factors_by_hand(bundle, layer: int, text: str, target: str):
    """u, δ of one down projection from plain module hooks, and ∂loss/∂W by autograd on the weight itself."""
    engine = ScoringEngine(bundle)
    ctx, cont = engine.encode_pair(text, target)
    device = bundle.device
    ids = torch.tensor([list(ctx) + list(cont[:-1])], device=device)
    module = bundle.arch.layer_module(bundle.model, layer, "mlp_out")
    seen = {}

    def hook(_m, args, out):
        seen["u"] = args[0].detach()[0]
        out.retain_grad()
        seen["out"] = out

    weight = module.weight
    weight.requires_grad_(True)
    handle = module.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            logits = bundle.model(input_ids=ids).logits[0, -len(cont):].log_softmax(-1)
            loss = -logits[torch.arange(len(cont), device=device), torch.tensor(cont, device=device)].mean()
            loss.backward()
    finally:
        handle.remove()
        grad_w = bundle.arch.as_out_in(weight.grad.detach().clone())
        weight.grad = None
        weight.requires_grad_(False)
    return seen["u"], seen["out"].grad[0].detach(), grad_w, len(ctx) + len(cont) - 1


def _eq3_by_hand(nets, j: int, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """ΔW = −α Σ_i δ̃_i ũ_iᵀ with g(z) of Mitchell et al. eq. 3a/3b written out."""
    def norm(x, n):
        std = (n.m2 / (n.count - 1)).sqrt().float()
        return (x - n.mean.float()) / (std + 1e-7)

    u, d = u.to(nets.lrs.device), d.to(nets.lrs.device)  # the activations, where the networks are
    z = torch.cat([norm(u, nets.u_norm[j]), norm(d, nets.d_norm[j])], -1)
    m = nets.mlps[0]
    h = z + torch.relu(nets.s1[j] * (z @ m.v1.T @ m.u1.T + m.b1) + nets.o1[j])
    g = h + torch.relu(nets.s2[j] * (h @ m.v2.T @ m.u2.T) + nets.o2[j])
    u_t, d_t = g[:, : u.shape[1]], g[:, u.shape[1]:]
    return -nets.lrs[j] * sum(torch.outer(d_t[i], u_t[i]) for i in range(len(u)))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("request_", [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
                                      EditRequest("{}", "France", "Paris")])
def test_update_equals_the_networks_rank_one_products(tiny_bundles, mend_home, family, request_):
    bundle = tiny_bundles[family]
    editor = EDITORS["mend"]
    hp = editor.load_hparams(bundle).replace(allow_untrained=False, steps=3)
    nets = new_nets(bundle, hp)
    _randomise(nets)
    # a checkpoint at the asked step and no snapshots (a cache from before snapshots) is used
    save_checkpoint(checkpoint_dir(bundle, hp) / CHECKPOINT, nets, None, {"step": 3})
    patch = editor.compute_patch(bundle, request_, hp)
    assert patch.info["trained_steps"] == 3
    with torch.no_grad():
        for j, layer in enumerate(hp.layers):
            u, d, grad_w, n_rows = _factors_by_hand(bundle, layer, request_.text, request_.target_new)
            torch.testing.assert_close(d.T @ u, grad_w, rtol=1e-4, atol=1e-7)  # ∇W = Σ δ_i u_iᵀ
            expected = _eq3_by_hand(nets, j, u, d)
            got = bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(layer)])
            # δ from two forwards agrees to ~1e-5 relative (logits_to_keep vs full logits); ΔW to 1e-4 of its scale
            torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-3, atol=1e-4 * float(expected.abs().max()))
            if n_rows == 1:  # one position: the update is exactly one rank-one product
                sv = torch.linalg.svdvals(got.double())
                assert sv[1] < 1e-5 * sv[0]


def test_untrained_editor_is_one_gradient_step_and_missing_editor_says_how_to_train(tiny_bundles, mend_home,
                                                                                   request_a):
    bundle = tiny_bundles["llama"]
    hp = EDITORS["mend"].load_hparams(bundle)
    patch = EDITORS["mend"].compute_patch(bundle, request_a, hp)  # allow_untrained: identity nets, no normalising
    layer = hp.layers[0]
    _, _, grad_w, _ = _factors_by_hand(bundle, layer, request_a.text, request_a.target_new)
    torch.testing.assert_close(bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(layer)]).cpu(),
                               (-hp.edit_lr * grad_w).cpu(), rtol=1e-4, atol=1e-9)
    with pytest.raises(EditscopeError, match=r"editscope mend train --model tiny-llama") as err:
        EDITORS["mend"].compute_patch(bundle, request_a, hp.replace(allow_untrained=False))
    assert "\n" not in str(err.value)


def _seq_logprob(bundle, engine, text: str, answer: str) -> torch.Tensor:
    """log P(answer | text), summed over its tokens, from one plain forward (differentiable)."""
    ctx, cont = engine.encode_pair(text, answer)
    device = bundle.device
    logits = bundle.model(input_ids=torch.tensor([list(ctx) + list(cont)], device=device)).logits[0].float()
    logits = logits.log_softmax(-1)
    rows = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1, device=device)
    return logits[rows, torch.tensor(cont, device=device)].sum()


def test_app_l1_is_added_to_mends_editing_loss(tiny_bundles, mend_home):
    """Paper 003 Table 8 (only α for MEND): the untrained editor's update is −lr·∇W(L_e + α·L1) with L1 (eq 7)
    written as a plain loop; L2/L3 (β, γ) vanish at MEND's unedited-weight gradient; α = 0 is the plain edit."""
    bundle = tiny_bundles["llama"]
    editor = EDITORS["mend"]
    hp = editor.load_hparams(bundle)  # allow_untrained: identity networks, ΔW = −edit_lr·∇W
    request = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France",
                          correct_answers=("France", "Belgium"), hard_false=("Germany", "Spain", "Italy"))
    app = {"alpha": 0.5, "beta": 0.0, "gamma": 0.0, "filter_answers": False}
    plain = editor.compute_patch(bundle, request, hp)
    zero = editor.compute_patch(bundle, request, hp, plugins=[("app", {**app, "alpha": 0.0})])
    with_l1 = editor.compute_patch(bundle, request, hp, plugins=[("app", app)])
    with_all = editor.compute_patch(bundle, request, hp, plugins=[("app", {**app, "beta": 1.0, "gamma": 1.0})])
    engine = ScoringEngine(bundle)
    names = [bundle.arch.weight_name(layer) for layer in hp.layers]
    params = dict(bundle.model.named_parameters())
    for p in names:
        params[p].requires_grad_(True)
    try:
        with torch.enable_grad():
            ctx, cont = engine.encode_pair(request.text, request.target_new)
            device = bundle.device
            ids = torch.tensor([list(ctx) + list(cont[:-1])], device=device)
            lp = bundle.model(input_ids=ids).logits[0, -len(cont):].float().log_softmax(-1)
            nll = -lp[torch.arange(len(cont), device=device), torch.tensor(cont, device=device)].mean()
            correct = [_seq_logprob(bundle, engine, request.text, a) for a in request.correct_answers]
            false = [_seq_logprob(bundle, engine, request.text, a) for a in request.hard_false]
            l1 = sum(torch.relu(2.0 - c + f) for c in correct for f in false) / (len(correct) * len(false))
            grads = torch.autograd.grad(nll + 0.5 * l1, [params[p] for p in names])
    finally:
        for p in names:
            params[p].requires_grad_(False)
    assert float(l1.detach()) > 0  # the hinge is active, so the check below can fail
    assert with_l1.info["terms"][0]["app"] == pytest.approx(0.5 * float(l1.detach()), rel=1e-4)
    for name, grad in zip(names, grads, strict=True):
        scale = float(grad.abs().max()) * hp.edit_lr
        torch.testing.assert_close(with_l1.deltas[name].cpu(), (-hp.edit_lr * grad).cpu(), rtol=1e-3, atol=1e-4 * scale)
        torch.testing.assert_close(zero.deltas[name], plain.deltas[name], rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(with_all.deltas[name], with_l1.deltas[name], rtol=0, atol=1e-6 * scale)
        assert not torch.allclose(with_l1.deltas[name], plain.deltas[name], rtol=1e-2, atol=1e-2 * scale)


def test_checkpoint_round_trips_through_safetensors(tiny_bundles, mend_home, tmp_path):
    bundle = tiny_bundles["llama"]
    hp = EDITORS["mend"].load_hparams(bundle)
    nets = new_nets(bundle, hp)
    _randomise(nets)
    opt = optimizer_for(nets, hp)
    loss = mend_losses(bundle, ScoringEngine(bundle), nets, hp, training_cases(hp)[0], update_stats=True)["loss"]
    loss.backward()
    opt.step()
    path = save_checkpoint(tmp_path / "e.safetensors", nets, opt, {"step": 1, "history": [{"a": 1.5}]})
    with safe_open(str(path), framework="pt") as fh:  # a plain safetensors file, metadata as JSON
        assert json.loads(fh.metadata()["meta"])["step"] == 1
        assert any(k.startswith("opt.") for k in fh.keys())  # noqa: SIM118 (not a mapping)
    nets2 = new_nets(bundle, hp)
    opt2 = optimizer_for(nets2, hp)
    meta = load_checkpoint(path, nets2, opt2)
    assert meta == {"step": 1, "history": [{"a": 1.5}]}
    s1, s2 = nets.state_dict(), nets2.state_dict()
    assert set(s1) == set(s2) and all(torch.equal(s1[k], s2[k]) for k in s1)
    o1, o2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert set(o1) == set(o2) and all(torch.equal(torch.as_tensor(o1[i][k]), torch.as_tensor(o2[i][k]))
                                      for i in o1 for k in o1[i])
    with pytest.raises(EditscopeError, match="not a MEND checkpoint"):
        (tmp_path / "bad.safetensors").write_bytes(b"junk")
        load_checkpoint(tmp_path / "bad.safetensors", nets2)


def _mean_edit_loss(bundle, hp, nets, cases) -> float:
    engine = ScoringEngine(bundle)
    nets.eval()
    with torch.no_grad():
        losses = [float(mend_losses(bundle, engine, nets, hp, c, update_stats=False)["edit"]) for c in cases]
    return sum(losses) / len(losses)


def test_training_lowers_the_edit_loss_and_resumes_exactly(tiny_bundles, mend_home, request_a, monkeypatch):
    bundle = tiny_bundles["llama"]
    hp = EDITORS["mend"].load_hparams(bundle).replace(train_records=6, checkpoint_every=4, steps=12)
    cases = training_cases(hp)
    before = _mean_edit_loss(bundle, hp, new_nets(bundle, hp), cases)  # identity nets: one small gradient step
    first = train(bundle, hp, steps=6, progress=False)
    resumed = train(bundle, hp, steps=12, progress=False)
    assert [h["step"] for h in resumed.history] == list(range(1, 13)) and resumed.curve.is_file()
    assert resumed.curve.read_bytes()[:4] == b"\x89PNG"
    nets = new_nets(bundle, hp)
    load_checkpoint(resumed.checkpoint, nets)
    after = _mean_edit_loss(bundle, hp, nets, cases)
    assert after < before - 1.0, (before, after)
    # one uninterrupted run of 12 steps gives the same networks as 6 + resumed 6
    monkeypatch.setenv("EDITSCOPE_HOME", str(mend_home.parent / "home2"))
    straight = train(bundle, hp, steps=12, progress=False)
    nets2 = new_nets(bundle, hp)
    load_checkpoint(straight.checkpoint, nets2)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(nets.state_dict().values(),
                                                                           nets2.state_dict().values(), strict=True))
    assert first.steps == 6
    # the trained editor edits, and the patch reverts bit-exactly
    before_w = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    patch = EDITORS["mend"].apply(bundle, request_a, hp)
    assert patch.info["trained_steps"] == 12 and set(patch.deltas) == {bundle.arch.weight_name(i) for i in hp.layers}
    patch.revert(bundle)
    assert all(torch.equal(p, before_w[n]) for n, p in bundle.model.named_parameters())


def test_training_under_a_callers_no_grad_equals_training_without_it(tiny_bundles, mend_home, monkeypatch):
    bundle = tiny_bundles["llama"]
    hp = EDITORS["mend"].load_hparams(bundle).replace(train_records=4, checkpoint_every=2, steps=2)
    plain = train(bundle, hp, steps=2, progress=False)
    monkeypatch.setenv("EDITSCOPE_HOME", str(mend_home.parent / "home-no-grad"))
    with torch.no_grad():  # a notebook cell, or a command run inside another's no_grad
        quiet = train(bundle, hp, steps=2, progress=False)
    nets, quiet_nets, untrained = new_nets(bundle, hp), new_nets(bundle, hp), new_nets(bundle, hp)
    load_checkpoint(plain.checkpoint, nets)
    load_checkpoint(quiet.checkpoint, quiet_nets)
    pairs = list(zip(nets.state_dict().values(), quiet_nets.state_dict().values(), strict=True))
    assert all(torch.equal(a, b) for a, b in pairs)
    assert any(not torch.equal(a, b) for a, b in zip(nets.parameters(), untrained.parameters(), strict=True))


def test_mend_train_and_edit_commands(tiny_bundles, mend_home, capsys):
    assert main(["mend", "train", "--model", "tiny-llama", "--steps", "2", "--no-progress", "--json",
                 "--set", "train_records=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 2 and out["checkpoint"].startswith(str(mend_home)) and out["loss_curve"]
    assert out["saved_steps"] == [2] and out["snapshot"].endswith("snapshots/step-2.safetensors")
    edit_args = ["edit", "--model", "tiny-llama", "--method", "mend", "--prompt", "{} is a citizen of", "--subject",
                 "Danielle Darrieux", "--target", " Japan", "--json", "--set", "allow_untrained=false",
                 "train_records=4"]
    assert main([*edit_args, "--set", "steps=2"]) == 0  # a second --set adds to the first
    edit = json.loads(capsys.readouterr().out)
    assert edit["label"] == "MEND" and edit["post"]["target"] != edit["pre"]["target"]
    assert main([*edit_args, "--set", "steps=3"]) == 2  # the editor after 3 steps is not saved: the one-line error
    err = capsys.readouterr().err.strip()
    assert "only the editor after steps 2 is saved" in err and err.endswith("mend train --model tiny-llama --steps 3")
