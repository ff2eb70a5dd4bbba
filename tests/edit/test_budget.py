"""``editscope plan`` (editscope.edit.budget, editscope.run.budget): every memory term against a closed form computed
here by hand from the published architecture numbers, the phases and the peak, FLOPs, the advice, the CLI and the
check ``editscope run`` makes first. No weights: the models are built on the meta device from config.json
fixtures (tests/fixtures/configs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editscope.edit import budget as B
from editscope.errors import EditscopeError

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
GiB = 2 ** 30

#: published parameter counts (model cards: GPT-2 XL 1.5B, GPT-J 6B, Llama-3-8B 8.03B, Qwen3-8B 8.2B, Mistral 7.24B),
#: as the architecture numbers give them exactly (embeddings tied for GPT-2 only)
PARAMS = {"gpt2-xl": 1_557_611_200, "gpt-j-6B": 6_050_882_784, "Meta-Llama-3-8B": 8_030_261_248,
          "Qwen3-8B": 8_190_735_360, "Mistral-7B-v0.1": 7_241_732_096}


@pytest.fixture(scope="module")
def shapes():
    return {name: B.model_shape(str(CONFIGS / name)) for name in PARAMS}


def test_fixture_shapes_are_the_published_architectures(shapes):
    for name, n in PARAMS.items():
        assert shapes[name].n_params == n, name
    llama = shapes["Meta-Llama-3-8B"]
    assert (llama.n_layers, llama.hidden, llama.mlp, llama.n_heads, llama.n_kv_heads, llama.vocab) == \
        (32, 4096, 14336, 32, 8, 128256)
    assert llama.gated and not llama.tied and llama.family == "llama"
    gpt2 = shapes["gpt2-xl"]
    assert (gpt2.mlp, gpt2.tied, gpt2.gated, gpt2.family) == (6400, True, False, "gpt2")
    # a block's parameters by hand: attention q,o (d x d) + k,v (d x kv) + gate/up/down (3 d d_ff) + 2 norms, and the
    # final norm spread over the 32 blocks
    d, kv = 4096, 8 * 128
    assert llama.block_params == 2 * d * d + 2 * d * kv + 3 * d * 14336 + 2 * d + d // 32


def _term(plan, name, phase=None):
    found = [t for t in plan.terms if t.name == name and (phase is None or t.during(phase))]
    assert len(found) == 1, (name, [t.name for t in plan.terms])
    return found[0].bytes


def test_alphaedit_llama3_terms_equal_their_closed_forms(shapes):
    shape = shapes["Meta-Llama-3-8B"]
    hp, note = B.plan_hparams("alphaedit", shape, shape.name)
    assert hp.layers == [4, 5, 6, 7, 8] and note == "shipped hparams"  # the folder name finds llama3-8b's file
    plan = B.plan_edit(shape, "alphaedit", hp, dtype="bfloat16", device="cpu")
    n, ff, d = 5, 14336, 4096
    c = ff * ff * 8  # one float64 C: 1.53 GiB
    assert _term(plan, "weights") == 8_030_261_248 * 2
    assert _term(plan, "load") == 8_030_261_248 * 4  # float32 on the host first
    assert _term(plan, "C") == n * c
    assert _term(plan, "projector") == 2 * n * c
    assert _term(plan, "solve") == 8 * c
    assert _term(plan, "patch") == n * d * ff * (4 + 2 + 8)
    act = 8 * 256 * (4 * d + 3 * ff) * 2 + 8 * 32 * 256 ** 2 * 4
    assert _term(plan, "statistics") == 2 * n * c + ff * ff * 4 + act
    phases = plan.phases()
    edit = B.RUNTIME_HOST + 8_030_261_248 * 2 + n * c + 2 * n * c + n * d * ff * 14 + max(8 * c, _term(plan, "vstar"))
    assert phases["edit"] == edit and plan.peak == edit and plan.peak_phase == "edit"
    # the float32 load and its bfloat16 copy are both resident while the copy is made
    assert phases["load"] == B.RUNTIME_HOST + 8_030_261_248 * 4 + 8_030_261_248 * 2
    # read from a cache already in bfloat16 (a registry model's converted copy): the weights alone, as stored
    cached = B.plan_edit(shape, "alphaedit", hp, dtype="bfloat16", device="cpu", converted=True)
    assert cached.phases()["load"] == B.RUNTIME_HOST + 8_030_261_248 * 2 and _term(cached, "load") == 8_030_261_248 * 2
    assert cached.phases()["edit"] == edit and cached.to_dict()["converted"] is True
    assert plan.biggest().name == "projector"
    assert 48 * GiB < plan.peak < 80 * GiB  # over a 48 GB card (AlphaEdit's own tracker ran out there), under 80


def test_float32_statistics_halve_c_and_the_pass_not_the_solve(shapes):
    """mom2_dtype float32 (Llama-3-8B MEMIT, 5 layers of d_ff 14,336): C 4 B an entry, the pass a float32 sum and
    its compensation per layer, the solve's matrices still float64."""
    shape = shapes["Meta-Llama-3-8B"]
    hp, _ = B.plan_hparams("memit", shape, shape.name)
    n, ff, d = len(hp.layers), 14336, 4096
    plan = B.plan_edit(shape, "memit", hp.replace(mom2_dtype="float32"), dtype="bfloat16")
    assert _term(plan, "C") == n * ff * ff * 4  # 0.77 GiB a layer instead of 1.53
    assert _term(plan, "solve") == 3 * ff * ff * 8
    act = 8 * 256 * (4 * d + 3 * ff) * 2 + 8 * 32 * 256 ** 2 * 4
    assert _term(plan, "statistics") == 2 * n * ff * ff * 4 + ff * ff * 4 + act
    f64 = B.plan_edit(shape, "memit", hp, dtype="bfloat16")
    assert _term(f64, "C") - _term(plan, "C") == n * ff * ff * 4
    assert _term(f64, "statistics") - _term(plan, "statistics") == 2 * n * ff * ff * 4
    assert "(float32)" in next(t.how for t in plan.terms if t.name == "C")


FIVE_PREFIXES = {"context_templates": [[10, 5]]}  # the shipped GPT-2 XL files use ROME's 20 prefixes


def test_rome_gpt2xl_float32_and_vstar_batch(shapes):
    shape = shapes["gpt2-xl"]
    hp, _ = B.plan_hparams("rome", shape, shape.name, overrides=FIVE_PREFIXES)
    assert hp.layers == [17] and hp.context_templates == [[10, 5]]
    one = B.plan_edit(shape, "rome", hp, dtype="float32", stats_cached=True)
    assert _term(one, "C") == 6400 ** 2 * 8 and _term(one, "solve") == 6400 ** 2 * 8
    assert not any(t.name == "statistics" for t in one.terms)
    # the v* batch by hand: 5 prefixes + bare prompt rows of 6 suffix tokens, an essence row of 3, through 31
    # blocks; values per token and block 6 d + 2 d_ff (GELU MLP) + 2 heads x row width (10 + 12 + 3)
    tokens = 6 * 6 + 3
    per = 6 * 1600 + 2 * 6400 + 2 * 25 * 25
    assert _term(one, "vstar") == tokens * 31 * per * 4 + tokens * 50257 * 4 * 3
    # batched: the engine's 2,048 tokens hold 2048 // (7 rows x 25) = 11 requests per forward, vstar_batch caps it
    memit_hp = B.plan_hparams("memit", shape, shape.name, overrides=FIVE_PREFIXES)[0]
    many = B.plan_edit(shape, "memit", memit_hp, requests=100)
    assert many.batch_tokens == 11 * tokens
    capped = B.plan_edit(shape, "memit", memit_hp, requests=100, vstar_batch=2)
    assert capped.batch_tokens == 2 * tokens
    assert _term(many, "vstar") > _term(capped, "vstar")


def test_rome_without_c_inverse_holds_no_c(shapes):
    shape = shapes["Meta-Llama-3-8B"]
    hp, _ = B.plan_hparams("rome", shape, shape.name)
    assert hp.mom2_adjustment is False  # AlphaEdit's ROME baseline on Llama-3, as published
    plan = B.plan_edit(shape, "rome", hp, dtype="bfloat16")
    assert _term(plan, "C") == 0 and _term(plan, "solve") == 0 and plan.flops["solve fp64"] == 0
    assert not any(t.name == "statistics" for t in plan.terms)


def test_time_is_flops_over_the_given_rates(shapes):
    shape = shapes["gpt2-xl"]
    hp, _ = B.plan_hparams("rome", shape, shape.name, overrides=FIVE_PREFIXES)
    plan = B.plan_edit(shape, "rome", hp, stats_cached=True, rates=B.Rates(1e12, 5e11))
    tokens, after = 39, 48 - 17
    zflops = 20 * tokens * (4.0 * shape.block_params * after + 4.0 * 1600 * 50257)
    assert plan.flops["v*/z optimisation"] == pytest.approx(zflops)
    assert plan.flops["solve fp64"] == pytest.approx(2 / 3 * 6400 ** 3)
    secs = plan.seconds()
    assert secs["v*/z optimisation"] == pytest.approx(zflops / 1e12)
    assert secs["solve fp64"] == pytest.approx(2 / 3 * 6400 ** 3 / 5e11)
    keys = 3 * 7 * 25 * 2.0 * shape.block_params * 48  # 3 forwards of the request's 7 rows x 25 tokens
    assert plan.flops["keys and initial forwards"] == pytest.approx(keys)
    assert plan.seconds_per_edit() == pytest.approx(sum(secs.values()))
    cold = B.plan_edit(shape, "rome", hp, stats_cached=False, rates=B.Rates(1e12, 5e11))
    stats = 100_000 * (2.0 * shape.block_params * 18 + 2.0 * 6400 ** 2)  # forward to layer 17 + k k^T, per token
    assert cold.flops["once: statistics"] == pytest.approx(stats)
    assert cold.seconds_per_edit() == pytest.approx(plan.seconds_per_edit())  # once per run, not per edit
    assert cold.seconds_first_edit() == pytest.approx(plan.seconds_first_edit() + stats / 1e12)


def test_kn_and_mend_terms(shapes):
    shape = shapes["Mistral-7B-v0.1"]
    kn_hp, note = B.plan_hparams("kn", shape, shape.name)
    assert kn_hp.layers == list(range(32)) and "defaults" in note
    kn = B.plan_edit(shape, "kn", kn_hp, dtype="bfloat16")
    rows = min(32, 1024 // 20) * 20  # every layer's 20 IG steps fit one forward
    kv = 12 * 2 * 8 * 128 * 2  # per row: the 12-token prompt's keys and values (8 key/value heads)
    per = (6 * 4096 + 3 * 14336 + 2 * 32 * 12) * 2 + kv
    assert _term(kn, "ig") == rows * 32 * per + rows * 32000 * 12
    mend_hp, _ = B.plan_hparams("mend", shape, shape.name)
    assert mend_hp.layers == [29, 30, 31]
    mend = B.plan_edit(shape, "mend", mend_hp, dtype="bfloat16")
    dim = 4096 + 14336
    nets = (4 * mend_hp.rank * dim + dim) * 4 + 3 * (4 * dim + 1) * 4 + 3 * 3 * dim * 8
    assert _term(mend, "mend") == nets + 3 * 4096 * 14336 * (2 + 4)


def test_only_editors_that_declare_plan_layers_plan_without_a_file_or_a_rule():
    """Each editor's hparams class declares the layers a plan assumes when no file and no layer rule gives them (KN:
    every layer, as Dai et al.; MEND: the last three); every other editor declares none."""
    from editscope.edit.hparams import plan_layers
    from editscope.edit.registry import EDITORS

    want = {"kn": list(range(12)), "mend": [9, 10, 11]}
    for name, editor in EDITORS.items():
        assert plan_layers(editor.hparams_class, 12) == want.get(name), name


def test_a_family_editscope_cannot_edit_is_still_planned(tmp_path):
    from transformers import OPTConfig

    OPTConfig(hidden_size=64, ffn_dim=256, num_hidden_layers=4, num_attention_heads=4, vocab_size=1000,
              word_embed_proj_dim=64).save_pretrained(tmp_path)
    shape = B.model_shape(str(tmp_path))
    assert shape.family is None and shape.mlp == 256 and shape.n_layers == 4
    hp, note = B.plan_hparams("rome", shape, str(tmp_path))
    plan = B.plan_edit(shape, "rome", hp, hparams_note=note)
    assert not plan.editable and "cannot edit" in plan.notes[0] and "'opt'" in plan.notes[0]
    assert _term(plan, "C") == 256 ** 2 * 8


def test_memit_refuses_gemma3_in_the_plan():
    shape = B.model_shape("tiny-gemma3")
    hp, _ = B.plan_hparams("memit", shape, "tiny-gemma3")
    plan = B.plan_edit(shape, "memit", hp)
    assert not plan.editable and "does not support the 'gemma3'" in plan.notes[0]
    assert B.plan_edit(shape, "rome", B.plan_hparams("rome", shape, "tiny-gemma3")[0]).editable


def test_advice_when_it_does_not_fit(shapes):
    shape = shapes["Meta-Llama-3-8B"]
    hp, _ = B.plan_hparams("alphaedit", shape, shape.name)
    fits = B.plan_edit(shape, "alphaedit", hp, dtype="bfloat16", available=80 * GiB, stats_cached=True)
    assert fits.fits is True and fits.advice == []
    over = B.plan_edit(shape, "alphaedit", hp, dtype="float32", available=40 * GiB, stats_cached=True)
    assert over.fits is False
    assert over.advice[0].startswith("--dtype bfloat16")
    assert any(a.startswith("statistics in float32 (--set mom2_dtype=float32)") and "(-3.8 GiB;" in a
               for a in over.advice)  # 5 layers x d_ff^2 x 4 B saved of the float64 C
    f32 = B.plan_edit(shape, "alphaedit", hp.replace(mom2_dtype="float32"), dtype="float32", available=40 * GiB,
                      stats_cached=True)
    assert not any("mom2_dtype" in a for a in f32.advice)
    # per edited layer: float64 C, P and K_p K_p^T, each d_ff^2 x 8 B (3 x 14336^2 x 8 B = 4.6 GiB); C in float32: 3.8
    assert any(a.startswith("fewer edited layers (5 now") and a.endswith("each holds 4.6 GiB of C, P and K_p K_p^T")
               for a in over.advice)
    assert any(a.endswith("each holds 3.8 GiB of C, P and K_p K_p^T") for a in f32.advice)
    assert B.plan_edit(shape, "alphaedit", hp, available=None).fits is None


def _run_config(tmp_path, model, method="alphaedit", dtype="bfloat16"):
    cfg = tmp_path / "c.yaml"
    data = CONFIGS.parent / "counterfact_rome_sample.json"
    cfg.write_text(f"model: {model}\nmethods: [{method}]\ndtype: {dtype}\ndevice: cpu\noutput: {tmp_path / 'out'}\n"
                   f"dataset: {data}\nslice: {{offset: 0, limit: 1}}\nsuites: [counterfact]\n")
    return cfg


def test_check_fits_refuses_in_one_line_naming_the_biggest_term(tmp_path, monkeypatch):
    from editscope.run import load_config
    from editscope.run.budget import check_fits

    config = load_config(_run_config(tmp_path, CONFIGS / "Meta-Llama-3-8B"))
    with pytest.raises(EditscopeError) as err:
        check_fits(config, available=40 * GiB)
    line = str(err.value)
    assert "\n" not in line and "biggest term: projector" in line and "alphaedit" in line
    plans = check_fits(config, available=200 * GiB)
    assert [p.method for p in plans] == ["alphaedit"] and plans[0].fits
    monkeypatch.setenv("EDITSCOPE_PLAN_CHECK", "0")
    assert check_fits(config, available=1) == []


def test_run_command_stops_before_loading_a_model_that_cannot_fit(tmp_path, monkeypatch, capsys):
    from editscope import cli
    from editscope.run import budget as run_budget

    monkeypatch.setattr(run_budget, "available_memory", lambda device: (10 * GiB, 10 * GiB))
    code = cli.main(["run", str(_run_config(tmp_path, CONFIGS / "Mistral-7B-v0.1", "rome", "float32"))])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert err.startswith("editscope: error: rome on") and "biggest term: weights" in err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_cli_plan_json_offline(tmp_path, capsys, monkeypatch):
    from editscope import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = cli.main(["plan", "--model", str(CONFIGS / "Qwen3-8B"), "--method", "alphaedit", "--dtype", "bfloat16",
                     "--available-gib", "80", "--tflops", "400", "--json"])
    assert code == 0
    (plan,) = json.loads(capsys.readouterr().out)
    assert plan["model"]["n_params"] == PARAMS["Qwen3-8B"] and plan["dtype"] == "bfloat16"
    terms = {t["name"]: t["bytes"] for t in plan["terms"]}
    assert terms["C"] == len(plan["layers"]) * 12288 ** 2 * 8
    assert plan["rates"]["matmul"] == 400e12 and plan["rates"]["fp64"] == 200e12
    assert plan["seconds_per_edit"] > 0 and plan["fits"] is True
    if plan["model"]["family"] is None:  # until editscope maps qwen3
        assert "cannot edit" in plan["notes"][0]
    code = cli.main(["plan", "--model", str(CONFIGS / "gpt2-xl"), "--method", "rome", "--method", "kn",
                     "--available-gib", "1", "--no-time"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("DOES NOT FIT") == 2 and "to fit:" in out and "time (" not in out


def test_run_config_modes_set_the_requests_per_edit(tmp_path):
    from editscope.run import load_config
    from editscope.run.budget import plans_for_config

    cfg = _run_config(tmp_path, CONFIGS / "gpt2-xl", "memit", "float32")
    base = cfg.read_text()
    (plan,) = plans_for_config(load_config(cfg), available=100 * GiB)
    assert (plan.requests, plan.vstar_batch, plan.dtype, plan.device) == (1, None, "float32", "cpu")
    cfg.write_text(base + "mode: {batch: 10}\nruntime: {vstar_batch: 4}\n")
    (plan,) = plans_for_config(load_config(cfg), available=100 * GiB)
    assert (plan.requests, plan.vstar_batch) == (10, 4)
    cfg.write_text(base + "runtime: {vstar_batch: 8}\n")  # single mode: a window of 8 cases' v* optimised together
    (plan,) = plans_for_config(load_config(cfg), dtype="bfloat16", available=100 * GiB)
    assert (plan.requests, plan.dtype) == (8, "bfloat16")
    assert plan.held == 0
    # a chain's last edit: a memory editor's state holds the group's earlier edits (3 rounds of 10: 20 held)
    cfg = _run_config(tmp_path, CONFIGS / "gpt2-xl", "grace", "float32")
    cfg.write_text(cfg.read_text() + "mode: {sequential_batches: {batch: 10, rounds: 3}}\n")
    (plan,) = plans_for_config(load_config(cfg), available=100 * GiB)
    assert (plan.requests, plan.held) == (10, 20)
    assert _term(plan, "codebook") == 2 * 30 * (6400 * 12 + 8 + 1600 * 4 + 8)  # GPT-2 XL: d 1,600, d_ff 6,400


@pytest.mark.parametrize(("change", "needle"), [
    ({"hidden_size": None}, "config.json: names no hidden size (key 'hidden_size' or 'n_embd' or 'd_model')"),
    ({"vocab_size": None}, "config.json: names no vocabulary size (key 'vocab_size')"),
    ({"intermediate_size": None}, "config.json: names no MLP width (key 'intermediate_size' or 'n_inner' or "
                                  "'ffn_dim')"),
    ({"model_type": None}, "config.json: key 'model_type': expected the model's type"),
    ({"intermediate_size": 0}, "config key 'intermediate_size': expected a positive integer, got 0"),
    ({"num_key_value_heads": -8}, "config key 'num_key_value_heads': expected a positive integer, got -8"),
    ({"num_hidden_layers": 0}, "config key 'num_hidden_layers': expected a positive integer, got 0"),
    # absurd sizes are refused before transformers builds per-layer lists (10^9 layers ran for minutes)
    ({"num_hidden_layers": 10 ** 9}, "key 'num_hidden_layers': 1,000,000,000 is beyond what a plan accepts (1,000"),
    ({"num_hidden_layers": 10 ** 4}, "key 'num_hidden_layers': 10,000 is beyond what a plan accepts"),
    ({"hidden_size": 10 ** 7}, "key 'hidden_size': 10,000,000 is beyond what a plan accepts"),
    ({"hidden_size": "4096"}, "cannot read its config.json"),
    ({"model_type": "nosuch"}, "cannot read its config.json"),
    ("", "config.json: not readable JSON"),
    ("{hidden_size: 1", "config.json: not readable JSON"),
    ("[1, 2]", "config.json: expected a JSON object, got list"),
])
def test_plan_refuses_an_odd_config_json_in_one_line(tmp_path, capsys, change, needle):
    from editscope import cli

    text = change if isinstance(change, str) else json.dumps(
        {k: v for k, v in {**json.loads((CONFIGS / "Meta-Llama-3-8B" / "config.json").read_text()), **change}.items()
         if v is not None})
    (tmp_path / "config.json").write_text(text)
    code = cli.main(["plan", "--model", str(tmp_path), "--no-time", "--available-gib", "80"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and str(tmp_path) in err[0] and needle in err[0], err


_PEAK_CHILD = """
import json, sys
import numpy as np
from editscope.edit.budget import peak_rss
block = np.ones(int(sys.argv[1]) // 8)  # touched: resident
print(json.dumps({"peak": peak_rss(), "block": block.nbytes}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc (Linux)")
def test_peak_rss_of_a_child_is_its_own_not_its_parents():
    """A parent that has held 1 GiB starts a child (subprocess: vfork + exec) that holds 128 MiB: the child's peak
    is its 128 MiB plus the interpreter, far below the parent's 1 GiB (``ru_maxrss`` would report the parent's)."""
    import os
    import subprocess
    import sys

    import numpy as np

    big = np.ones(GiB // 8)
    parent_peak = B.peak_rss()
    assert parent_peak >= GiB
    del big
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    block = 128 * 2 ** 20
    out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(block)], capture_output=True, text=True, env=env,
                         check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["block"] == block
    assert block <= got["peak"] < block + 400 * 2 ** 20 < parent_peak


def test_a_method_without_hparams_costs_its_own_plan_only(tmp_path, capsys, monkeypatch):
    """Two methods planned, one without hparams for this model: the other's plan is printed, the missing one is one
    line naming it; with none left, the command fails in one line."""
    from editscope import cli
    from editscope.edit import budget

    real = budget.plan_hparams

    def only_rome(method, *args, **kwargs):
        if method != "rome":
            raise EditscopeError(f"no hparams for {method} on this model")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(budget, "plan_hparams", only_rome)
    code = cli.main(["plan", "--model", str(CONFIGS / "gpt2-xl"), "--method", "ultraedit", "--method", "rome",
                     "--available-gib", "80", "--no-time", "--json"])
    captured = capsys.readouterr()
    assert code == 0 and [p["method"] for p in json.loads(captured.out)] == ["rome"]
    assert captured.err.strip() == ("editscope plan: no plan for ultraedit: no hparams for ultraedit on this model")
    assert cli.main(["plan", "--model", str(CONFIGS / "gpt2-xl"), "--method", "ultraedit", "--no-time"]) != 0
    assert "no plan for ultraedit" in capsys.readouterr().err


def test_each_editor_declares_its_cost_model_and_an_undeclared_one_gets_no_plan(shapes):
    """``plan`` asks the editor (``Editor.cost``): every declared model exists, the MEMIT family shares MEMIT's, the
    memory editors their own, the context editors one, and an editor registered without one gets "no plan", never
    another's."""
    from dataclasses import replace

    from editscope.edit.budget import COST_MODELS, NoPlan, plan_edit
    from editscope.edit.registry import EDITORS, register_editor

    costs = {name: EDITORS[name].cost for name in EDITORS.names()}
    assert {c for c in costs.values() if c is not None} == set(COST_MODELS)
    assert costs["prune"] == costs["rect"] == "memit" and costs["evk_edit"] == "alphaedit"
    assert costs["grace"] == "grace" and costs["wise"] == "wise"
    assert costs["prompt"] == costs["ike"] == costs["retrieval"] == "context"
    assert {n for n, c in costs.items() if c is None} == set()
    shape = shapes["Meta-Llama-3-8B"]
    hp, _ = B.plan_hparams("memit", shape, shape.name)
    assert plan_edit(shape, "memit", hp).peak > 0
    register_editor(replace(EDITORS["memit"], name="memit_copy", cost=None))
    try:
        with pytest.raises(NoPlan, match="no plan for memit_copy: the editor declares no cost model"):
            plan_edit(shape, "memit_copy", hp)
    finally:
        del EDITORS["memit_copy"]


def test_bfloat16_is_advised_only_where_its_own_peak_is_lower(shapes):
    """On a CPU the bfloat16 load holds the float32 weights and their copy (6 B a parameter): for ROME on Llama-3-8B,
    whose float32 edit needs little beyond the weights, bfloat16 would raise the peak, so it is not advised; on a
    GPU the load is the host's and the device's weights halve."""
    shape = shapes["Meta-Llama-3-8B"]
    hp, _ = B.plan_hparams("rome", shape, shape.name)
    n = 8_030_261_248
    cpu = B.plan_edit(shape, "rome", hp, dtype="float32", device="cpu", available=20 * GiB, stats_cached=True)
    assert cpu.fits is False and cpu.peak < B.RUNTIME_HOST + 6 * n  # the bfloat16 load phase, by hand
    assert not any(a.startswith("--dtype bfloat16") for a in cpu.advice)
    gpu = B.plan_edit(shape, "rome", hp, dtype="float32", device="cuda", available=20 * GiB, stats_cached=True)
    bf16 = B.plan_edit(shape, "rome", hp, dtype="bfloat16", device="cuda", stats_cached=True)
    saved = gpu.peak - bf16.peak
    assert saved >= 2 * n  # at least the weights' two bytes a parameter
    assert gpu.advice[0] == f"--dtype bfloat16: weights and activations in half the bytes (-{saved / GiB:.1f} GiB)"


def test_memory_and_context_editors_terms_equal_their_closed_forms(shapes):
    """GRACE: a codebook of one entry per request (float32 key of width d_ff with its float64 copy and norm, float32
    value of width d, float64 radius) in rooms up to twice the rows, the value rows through the blocks from its
    layer on; WISE: the side memories in force after the requests (saved every save_freq, merged every merge_freq),
    stacked in the edit, and one edit's training copies; a context editor: the weights alone. Llama-3-8B numbers."""
    shape = shapes["Meta-Llama-3-8B"]
    d, ff, n_layers, vocab = 4096, 14336, 32, 128256
    hp, _ = B.plan_hparams("grace", shape, shape.name, overrides={"layers": [27]})
    plan = B.plan_edit(shape, "grace", hp, dtype="bfloat16", requests=1000)
    assert _term(plan, "codebook") == 2 * 1000 * (ff * 4 + ff * 8 + 8 + d * 4 + 8)
    per_token = 6 * d + 3 * ff + 2 * 32 * 15  # ACT_D d + 3 d_ff (gated) + attention over 15 tokens
    assert _term(plan, "vstar") == 1000 * 15 * (n_layers - 27) * per_token * 2 + 1000 * 3 * vocab * 12
    assert not any(t.name in ("patch", "C", "statistics") for t in plan.terms)  # no weight written, no statistics
    assert plan.phases()["edit"] == B.RUNTIME_HOST + 8_030_261_248 * 2 + _term(plan, "codebook") + _term(plan, "vstar")

    weight = d * ff
    for n, memories, mask in ((1, 1, 1), (500, 1, 0), (999, 2, 1), (1000, 1, 0), (2500, 2, 0)):
        # after n edits (save 500, merge 1,000): 999 = one saved shard + the current; 1,000 = the merged memory;
        # 2,500 = the merged memory and one saved shard, no current shard
        hp, _ = B.plan_hparams("wise", shape, shape.name, overrides={"layers": [27]})
        plan = B.plan_edit(shape, "wise", hp, dtype="bfloat16", requests=n)
        assert _term(plan, "side memory") == memories * weight * 8 + mask * weight, n
        assert _term(plan, "optimizer") == 5 * weight * 4
    held = B.plan_edit(shape, "wise", hp, dtype="bfloat16", requests=1, held=2499)  # the 2,500th edit
    assert _term(held, "side memory") == _term(plan, "side memory") and held.held == 2499
    assert held.flops["side memory training (at most n_iter steps)"] * 2500 == pytest.approx(
        plan.flops["side memory training (at most n_iter steps)"])  # the training is the one edit's
    retrieve = B.plan_edit(shape, "wise", hp.replace(retrieve=True), dtype="bfloat16", requests=2500)
    assert _term(retrieve, "side memory") == 3 * weight * 8  # two merges kept apart, one saved shard
    rows, width = 11, 10 + 15  # "{}" and ten prefixes of context_templates [[5, 5], [10, 5]]; the widest row
    assert _term(plan, "vstar") == (12 * width * (ff + 2 * d) * 4 + rows * width * 4 * (6 * d + 3 * ff + 2 * 32 * width)
                                    * 2 + rows * 3 * vocab * 12)

    for method in ("prompt", "ike", "retrieval"):
        hp, _ = B.plan_hparams(method, shape, shape.name)
        plan = B.plan_edit(shape, method, hp, dtype="bfloat16")
        assert [t.name for t in plan.terms] == ["runtime", "weights", "load"] and plan.flops == {}
