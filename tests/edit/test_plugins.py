"""Loss-term plug-ins and the editor contract: a test plug-in (``weight·‖δ − c‖²``, tests/edit/l2_plugin.py)
attached through the run config, the API and the CLI changes ROME's ΔW exactly as computed by hand (an
independent autograd gradient of a naive one-row loss, plus the plug-in's closed-form gradient, through Adam's
first step), and leaves ΔW bit-identical with weight 0; declarations refuse what an editor cannot do."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from editscope.cli import main
from editscope.data.records import EditRequest
from editscope.edit import Patch, get_editor
from editscope.edit.hparams import HParams
from editscope.edit.plugins import PLUGINS, parse_plugin_arg
from editscope.edit.registry import EDITORS, Editor
from editscope.errors import EditscopeError
from editscope.run import Runner, load_config, parse_config
from tests.edit import l2_plugin
from tests.run.helpers import SUITES

LAYER = 1
#: one Adam step (v_steps=2: step 0 updates δ, step 1 only evaluates), loss = target NLL (+ plug-in) on the bare
#: prompt, C = I, no clamp: then δ₁ = −lr·g/(|g| + ε) and ΔW = (v₀ + δ₁ − W k*) k*ᵀ / (k*ᵀk*) (ROME eq. 2).
HAND = {"layers": [LAYER], "v_steps": 2, "v_lr": 0.01, "kl_factor": 0.0, "v_weight_decay": 0.0,
        "context_templates": [], "mom2_adjustment": False, "clamp_norm_factor": 1000.0, "stop_loss": 0.0}
REQUEST = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")


def naive(bundle, request: EditRequest) -> dict[str, torch.Tensor]:
    """∂NLL/∂δ at δ = 0, k*, v₀ and W from one unpadded row through the raw HF model and plain torch hooks."""
    model, tok = bundle.model, bundle.tokenizer
    text = request.text
    ctx_ids = tok(text)["input_ids"]
    ids = tok(text + " " + request.target_new)["input_ids"]
    pos = len(tok(request.subject)["input_ids"]) - 1
    mlp = model.model.layers[LAYER].mlp  # tiny-llama: the module whose output ROME's v lives at
    delta = torch.zeros(model.config.hidden_size, requires_grad=True, device=bundle.device)
    seen = {}

    def add(_m, _a, out):
        seen["v0"] = out[0, pos].detach().clone()
        bump = torch.zeros_like(out)
        bump[0, pos] = delta
        return out + bump

    def key(_m, args):
        seen["k"] = args[0][0, pos].detach().clone()

    handles = [mlp.register_forward_hook(add), mlp.down_proj.register_forward_pre_hook(key)]
    try:
        with torch.enable_grad():
            logits = model(input_ids=torch.tensor([ids], device=bundle.device)).logits[0].float()
            lp = logits.log_softmax(-1)
            n_ctx = len(ctx_ids)
            nll = -torch.stack([lp[i - 1, ids[i]] for i in range(n_ctx, len(ids))]).mean()
            (grad,) = torch.autograd.grad(nll, delta)
    finally:
        for h in handles:
            h.remove()
    return {"g": grad.double().cpu(), "k": seen["k"].double().cpu(), "v0": seen["v0"].double().cpu(),
            "W": mlp.down_proj.weight.detach().double().cpu()}


def hand_delta_w(ref: dict[str, torch.Tensor], weight: float, center: float) -> torch.Tensor:
    g = ref["g"] + 2 * weight * (0.0 - center)  # ∂/∂δ of weight·‖δ − c‖² at δ = 0
    delta1 = -HAND["v_lr"] * g / (g.abs() + 1e-8)  # Adam's first step (bias-corrected m̂ = g, v̂ = g²)
    resid = ref["v0"] + delta1 - ref["W"] @ ref["k"]
    return torch.outer(resid, ref["k"]) / (ref["k"] @ ref["k"])


def write_config(tmp_path, methods) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"model": "tiny-llama", "dataset": "counterfact", "slice": {"limit": 1},
                                    "suites": ["rewrite_es"], "methods": methods}))
    return str(path)


def edit_from_config(bundle, spec) -> Patch:
    editor = get_editor(spec.name)
    hp = editor.load_hparams(bundle, spec.hparams, spec.overrides)
    return editor.compute_patch(bundle, REQUEST, hp, plugins=spec.attached_plugins())


@pytest.fixture(scope="module")
def reference(tiny_bundles):
    ref = naive(tiny_bundles["llama"], REQUEST)
    # A weight at which the plug-in's gradient −2w (center 1) flips the sign of about half the positive entries
    # of the base gradient: 2w halfway between two consecutive ones, so no entry of g − 2w is near 0 (where
    # Adam's g/(|g|+ε) is ill-conditioned).
    pos = ref["g"][ref["g"] > 0].sort().values
    k = len(pos) // 2
    ref["weight"] = float(pos[k - 1] + pos[k]) / 4
    return ref


def test_weight_zero_through_run_config_is_bit_identical(tiny_bundles, tmp_path):
    bundle = tiny_bundles["llama"]
    path = write_config(tmp_path, [{"name": "rome", "overrides": {"v_steps": 3},
                                    "plugins": [{"name": "l2", "weight": 0.0, "center": 1.5}]},
                                   {"name": "rome", "label": "plain", "overrides": {"v_steps": 3}}])
    cfg = load_config(path, suites=SUITES)
    with_l2, plain = cfg.methods
    assert with_l2.label == "rome+l2" and with_l2.plugins == ({"name": "l2", "weight": 0.0, "center": 1.5},)
    a, b = edit_from_config(bundle, with_l2), edit_from_config(bundle, plain)
    assert a.deltas.keys() == b.deltas.keys()
    assert all(torch.equal(a.deltas[n], b.deltas[n]) for n in a.deltas)
    assert a.info["plugins"] == [{"name": "l2", "weight": 0.0, "center": 1.5}] and "plugins" not in b.info


def test_l2_through_run_config_changes_delta_w_as_computed_by_hand(tiny_bundles, tmp_path, reference):
    bundle = tiny_bundles["llama"]
    w, c = reference["weight"], 1.0
    flipped = torch.sign(reference["g"] - 2 * w * c) != torch.sign(reference["g"])
    assert 0.1 < float(flipped.double().mean()) < 0.9  # the plug-in matters, and so does the base loss
    path = write_config(tmp_path, [{"name": "rome", "overrides": HAND, "plugins": [{"name": "l2", "weight": w,
                                                                                    "center": c}]},
                                   {"name": "rome", "label": "plain", "overrides": HAND}])
    with_l2, plain = load_config(path, suites=SUITES).methods
    name = bundle.arch.weight_name(LAYER)
    for spec, weight in ((with_l2, w), (plain, 0.0)):
        got = edit_from_config(bundle, spec).deltas[name].double().cpu()
        want = hand_delta_w(reference, weight, c)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_cli_plugin_matches_the_hand_computation(tiny_bundles, tmp_path, capsys, reference):
    bundle = tiny_bundles["llama"]
    w = reference["weight"]
    patch_file = tmp_path / "p.safetensors"
    sets = [f"{k}={json.dumps(v)}" for k, v in HAND.items()]
    code = main(["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", REQUEST.prompt, "--subject",
                 REQUEST.subject, "--target", REQUEST.target_new, "--plugin-module", "tests.edit.l2_plugin",
                 "--plugin", f"l2:weight={w!r},center=1.0", "--save-patch", str(patch_file), "--json",
                 "--set", *sets])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "ROME+L2" and out["plugins"] == [{"name": "l2", "weight": w, "center": 1.0}]
    got = Patch.load(patch_file).deltas[bundle.arch.weight_name(LAYER)].double()
    want = hand_delta_w(reference, w, 1.0)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    assert main(["edit", "--model", "tiny-llama", "--prompt", "{} is", "--subject", "X", "--target", "Y",
                 "--plugin", "nope:weight=1"]) == 2
    assert "unknown plug-in 'nope'" in capsys.readouterr().err


def test_runner_rows_name_the_combination(tiny_bundles, tmp_path):
    path = write_config(tmp_path, [{"name": "rome", "overrides": {"v_steps": 2},
                                    "plugins": [{"name": "l2", "weight": 0.5}]}])
    cfg = load_config(path, suites=SUITES)
    result = Runner(cfg, out_dir=tmp_path / "out", bundle=tiny_bundles["llama"], suite_factories=SUITES,
                    progress=False).run()
    (row,) = [json.loads(x) for x in (result.out_dir / "results.jsonl").read_text().splitlines()]
    assert row["method"] == "rome+l2" and row["method_display"] == "ROME+L2" and row["editor"] == "rome"
    assert row["plugins"] == [{"name": "l2", "weight": 0.5, "center": 0.0}]


@pytest.mark.parametrize(("plugins", "message"), [
    ([{"name": "nope"}], "key 'methods[0].plugins[0].name': unknown plug-in 'nope'"),
    ([{"name": "l2", "wieght": 1.0}], "key 'methods[0].plugins[0]': key 'wieght': unknown hyperparameter"),
    ([{"name": "l2", "weight": "big"}], "key 'methods[0].plugins[0]': key 'weight': expected float"),
    ([{"weight": 1.0}], "key 'methods[0].plugins[0].name': required"),
    ([{"name": "l2"}, {"name": "l2"}], "key 'methods[0].plugins': a plug-in appears twice"),
    ({"l2": {}}, "key 'methods[0].plugins': expected a list"),
])
def test_config_plugin_errors_name_file_method_and_key(plugins, message):
    data = {"model": "tiny-llama", "dataset": "counterfact", "suites": ["rewrite_es"],
            "methods": [{"name": "rome", "plugins": plugins}]}
    with pytest.raises(EditscopeError) as err:
        parse_config(data, where="exp.yaml", suites=SUITES)
    assert str(err.value).startswith("exp.yaml: ") and message in str(err.value)


def test_plugin_hparams_and_args():
    assert parse_plugin_arg("l2:weight=0.5, center=-1") == ("l2", {"weight": 0.5, "center": -1})
    assert parse_plugin_arg("l2") == ("l2", {})
    with pytest.raises(EditscopeError, match="is not key=value"):
        parse_plugin_arg("l2:weight")
    with pytest.raises(EditscopeError, match="key 'center': expected float"):
        PLUGINS["l2"].attach({"center": [1]})
    assert PLUGINS["l2"] is l2_plugin.L2


def test_plugins_on_a_non_optimising_editor_fail_before_work(tiny_bundles, monkeypatch):
    def compute(*_args, **_kwargs):
        raise AssertionError("no work may start")

    noop = Editor("noop", "NoOp", HParams, compute, optimises=False)
    monkeypatch.setitem(EDITORS, "noop", noop)
    with pytest.raises(EditscopeError, match="noop does not optimise a loss, so plug-ins"):
        noop.apply(tiny_bundles["llama"], REQUEST, HParams(), plugins=[("l2", {"weight": 1.0})])
    data = {"model": "tiny-llama", "dataset": "counterfact", "suites": ["rewrite_es"],
            "methods": [{"name": "noop", "plugins": ["l2"]}]}
    with pytest.raises(EditscopeError, match=r"exp.yaml: key 'methods\[0\].plugins': noop does not optimise"):
        parse_config(data, where="exp.yaml", suites=SUITES)


def test_every_optimising_editor_declares_it():
    assert {n for n, e in EDITORS.items() if e.optimises} >= {"rome", "memit", "alphaedit", "prune", "rect", "ft"}
    assert get_editor("alphaedit").sequential and get_editor("prune").sequential and not get_editor("rome").sequential


@pytest.mark.parametrize("method", ["memit", "alphaedit", "prune", "rect"])
def test_linear_residual_editors_refuse_gemma3(tiny_bundles, method):
    bundle = tiny_bundles["gemma3"]
    editor = get_editor(method)
    assert not editor.supports("gemma3") and editor.supports("llama")
    before = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    with pytest.raises(EditscopeError, match=f"{method} does not support the 'gemma3' architecture"):
        editor.apply(bundle, REQUEST, HParams.__new__(editor.hparams_class))
    assert all(torch.equal(before[n], p) for n, p in bundle.model.named_parameters())


def test_rome_runs_on_gemma3(tiny_bundles):
    bundle = tiny_bundles["gemma3"]
    editor = get_editor("rome")
    patch = editor.compute_patch(bundle, REQUEST, editor.load_hparams(bundle).replace(v_steps=2))
    assert set(patch.deltas) == {bundle.arch.weight_name(editor.load_hparams(bundle).layers[0])}


# -- set-up once per edit, one forward per step ----------------------------------------------------------
def count_forwards(bundle):
    counter = {"n": 0}

    def hook(*_args):
        counter["n"] += 1

    return counter, bundle.model.model.layers[0].register_forward_hook(hook)


def test_ft_sets_up_once_and_runs_one_forward_per_step_for_its_requests(tiny_bundles):
    """FT stacks its requests' rows into one forward per step when every term is ``batched``; a term that is not
    (it runs forwards of its own per request) puts each request in a forward of its own."""
    bundle = tiny_bundles["llama"]
    editor = get_editor("ft")
    hp = editor.load_hparams(bundle).replace(steps=3, stop_loss=0.0)
    other = EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch")
    subjects = [REQUEST.subject, other.subject]
    for batched, forwards in ((True, 3), (False, 3 * 2)):
        l2_plugin.CALLS.clear()
        counter, handle = count_forwards(bundle)
        original = l2_plugin.CountTerm.batched
        try:
            l2_plugin.CountTerm.batched = batched
            editor.compute_patch(bundle, [REQUEST, other], hp, plugins=["count", ("l2", {"weight": 1.0})])
        finally:
            l2_plugin.CountTerm.batched = original
            handle.remove()
        assert [c for c in l2_plugin.CALLS if c[0] == "setup"] == [("setup", s) for s in subjects]
        assert [c for c in l2_plugin.CALLS if c[0] == "call"] == [("call", s) for _ in range(3) for s in subjects]
        assert counter["n"] == forwards  # three steps: one forward per step, or one per request per step


def test_rome_sets_up_once_per_request(tiny_bundles):
    bundle = tiny_bundles["llama"]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=3, stop_loss=0.0)
    other = EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch")
    l2_plugin.CALLS.clear()
    editor.compute_patch(bundle, [REQUEST, other], hp, plugins=["count"])
    want = [(kind, s) for s in (REQUEST.subject, other.subject) for kind in ("setup", "call", "call", "call")]
    assert want == l2_plugin.CALLS
