"""The architecture families beyond GPT-2, GPT-J, LLaMA and Gemma 3 — Qwen3, Gemma 2, Phi-3/4, Pythia (GPT-NeoX),
OLMo 2, SmolLM3 — and Llama 3.x's rope scaling, each on a tiny random-init model built from transformers' own config
class.

For each: the family comes from ``config.model_type``; scoring equals a plain HF forward to 1e-5; every path and
hook point of the map resolves to the module the transformers module tree has there, with that module's shape; the
MLP output adds linearly to the residual stream exactly where the map declares no ``mlp_post_norm`` (what decides
which editors accept the family); every accepting editor edits and reverts bit-exactly and every other refuses with
its reason; ``editscope models --families`` lists them. (The engine-vs-naive, hook and partial-forward tests of
``TINY_FAMILIES``, the reference-code conventions and the derived hparams run on them too.)
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import NamedTuple

import numpy as np
import pytest
import torch
from torch import nn

from editscope.cli import main
from editscope.data.records import EditRequest
from editscope.edit import EDITORS, get_editor
from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.archs import ARCHS, arch_for_config
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture, hooks, point
from editscope.lm.tiny import LLAMA3_ROPE, tiny_family


class Tree(NamedTuple):
    """Facts of one tiny model, written out from transformers 5's modeling files (not read from the maps)."""

    model_type: str
    family: str
    down: str  #: the MLP down projection, relative to a block
    up: str  #: the MLP input projection (fused gate and up for Phi-3)
    up_rows: int  #: its output rows in units of intermediate_size
    post_norm: str | None  #: the norm between the MLP output and the residual add
    tied: bool  #: LM head shares the embedding table


TREES = {
    "llama3": Tree("llama", "llama", "mlp.down_proj", "mlp.up_proj", 1, None, False),
    "qwen3": Tree("qwen3", "qwen3", "mlp.down_proj", "mlp.up_proj", 1, None, True),
    "gemma2": Tree("gemma2", "gemma2", "mlp.down_proj", "mlp.up_proj", 1, "post_feedforward_layernorm", True),
    "phi3": Tree("phi3", "phi3", "mlp.down_proj", "mlp.gate_up_proj", 2, None, False),
    "gpt_neox": Tree("gpt_neox", "gpt_neox", "mlp.dense_4h_to_h", "mlp.dense_h_to_4h", 1, None, False),
    "olmo2": Tree("olmo2", "olmo2", "mlp.down_proj", "mlp.up_proj", 1, "post_feedforward_layernorm", False),
    "smollm3": Tree("smollm3", "smollm3", "mlp.down_proj", "mlp.up_proj", 1, None, True),
}
NEW = list(TREES)

CONTEXTS = ["The capital of France is", "Q: Who wrote Hamlet? A:",
            # 52 tokens: past the tiny Llama 3's original context of 40, under Gemma 2's window of 64
            "The Eiffel Tower, built for the 1889 World's Fair on the Champ de Mars in Paris, was at first criticised "
            "by some of France's leading artists and intellectuals, and it is now one of the most visited monuments "
            "of the world, and it is"]
CONTINUATIONS = ["Paris", " the city of Rome", "William Shakespeare, the English poet"]


def checksums(model) -> dict[str, str]:
    return {n: hashlib.sha256(p.detach().cpu().numpy().tobytes()).hexdigest() for n, p in model.named_parameters()}


def plain_logprobs(model, ids: list[int]) -> torch.Tensor:
    """Log-softmax of a plain HF forward of one unpadded row (its own logit soft-capping included)."""
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0].double().log_softmax(-1)


# -- the family and the module tree --------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_family_is_chosen_by_model_type(tiny_bundles, name):
    bundle, want = tiny_bundles[name], TREES[name]
    assert bundle.config.model_type == want.model_type
    assert arch_for_config(bundle.config) is ARCHS[want.family] is bundle.arch
    assert want.model_type in bundle.arch.model_types and tiny_family(name) == want.family


@pytest.mark.parametrize("name", NEW)
def test_paths_and_hook_points_resolve_to_the_module_tree(tiny_bundles, name):
    bundle, want = tiny_bundles[name], TREES[name]
    model, arch, cfg = bundle.model, bundle.arch, bundle.config
    d, m, heads = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or d // heads
    assert (bundle.n_layers, arch.hidden_size(cfg), arch.mlp_size(cfg)) == (cfg.num_hidden_layers, d, m)
    assert (arch.n_heads(cfg), arch.head_dim(cfg), arch.mlp_in_parts) == (heads, head_dim, want.up_rows)
    assert arch.n_kv_heads(cfg) == (getattr(cfg, "num_key_value_heads", None) or heads)
    assert model.get_submodule(arch.embed) is model.get_input_embeddings()
    assert model.get_submodule(arch.lm_head) is model.get_output_embeddings()
    assert model.get_submodule(arch.base) is model.base_model
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == want.tied
    assert arch.mlp_post_norm == want.post_norm
    final = model.get_submodule(arch.final_norm)
    assert tuple(final.weight.shape) == (d,)
    blocks = model.get_submodule(arch.blocks)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == cfg.num_hidden_layers
    for i, block in enumerate(blocks):
        down, up = block.get_submodule(want.down), block.get_submodule(want.up)
        assert arch.layer_module(model, i, "mlp_out") is down and arch.layer_module(model, i, "mlp_in") is up
        assert isinstance(down, nn.Linear) and (down.in_features, down.out_features) == (m, d)
        assert isinstance(up, nn.Linear) and (up.in_features, up.out_features) == (d, want.up_rows * m)
        mlp, attn = arch.layer_module(model, i, "mlp"), arch.layer_module(model, i, "attn")
        assert any(x is down for x in mlp.modules()) and any(x is up for x in mlp.modules())
        o_proj = arch.layer_module(model, i, "attn_out")
        assert any(x is o_proj for x in attn.modules())
        assert isinstance(o_proj, nn.Linear) and (o_proj.in_features, o_proj.out_features) == (heads * head_dim, d)
        if want.post_norm:
            assert tuple(block.get_submodule(arch.mlp_post_norm).weight.shape) == (d,)
        # every per-block hook point is that block's module at the declared path
        expected = {"resid_pre": block, "resid_post": block, "attn_out": o_proj, "attn_heads": o_proj,
                    "mlp_key": down, "mlp_out": mlp}
        for kind, module in expected.items():
            assert point(model, arch, f"blocks.{i}.{kind}")[0] is module, kind
    # and every point captures a tensor of the shape its module has there
    ids = torch.tensor([bundle.tokenizer("The capital of France is")["input_ids"]], device=bundle.device)
    names = ["embed", "final"] + [f"blocks.1.{k}" for k in ("resid_pre", "resid_post", "attn_out", "attn_heads",
                                                           "mlp_key", "mlp_out")]
    with torch.no_grad(), capture(model, arch, names) as store:
        model(ids)
    t = ids.shape[1]
    assert {n: tuple(store[n].shape) for n in names} == {
        "embed": (1, t, d), "final": (1, t, d), "blocks.1.resid_pre": (1, t, d), "blocks.1.resid_post": (1, t, d),
        "blocks.1.attn_out": (1, t, d), "blocks.1.attn_heads": (1, t, heads, head_dim), "blocks.1.mlp_key": (1, t, m),
        "blocks.1.mlp_out": (1, t, d)}


@pytest.mark.parametrize("name", NEW)
def test_mlp_output_adds_linearly_exactly_where_no_post_norm_is_declared(tiny_bundles, name):
    """A vector added to block 1's MLP output at one position moves block 1's output there by exactly that vector
    (and nowhere else) in the linear-residual families, parallel residual included; through Gemma 2's and OLMo 2's
    post-MLP norm it does not. This is the property MEMIT, AlphaEdit, PRUNE, RECT and EVK-Edit rely on."""
    bundle, want = tiny_bundles[name], TREES[name]
    model, arch = bundle.model, bundle.arch
    ids = torch.tensor([bundle.tokenizer("The capital of France is")["input_ids"]], device=bundle.device)
    delta = torch.randn(bundle.hidden_size, generator=torch.Generator().manual_seed(0)).to(bundle.device)

    def add(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, 2] += delta
        return x

    with torch.no_grad():
        with capture(model, arch, ["blocks.1.resid_post"]) as base:
            model(ids)
        with hooks(model, arch, {"blocks.1.mlp_out": add}), capture(model, arch, ["blocks.1.resid_post"]) as moved:
            model(ids)
    diff = (moved["blocks.1.resid_post"] - base["blocks.1.resid_post"])[0]
    assert torch.count_nonzero(diff[:2]) == 0  # causal: earlier positions untouched
    linear = torch.allclose(diff[2], delta, atol=1e-5) and torch.count_nonzero(diff[3:]) == 0
    assert linear == (want.post_norm is None)
    assert float((diff[2] - delta).norm()) > 0.1 or want.post_norm is None


# -- scoring ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("side", ["right", "left"])
def test_scoring_equals_a_plain_forward(tiny_bundles, name, side):
    bundle = tiny_bundles[name]
    engine = ScoringEngine(bundle, padding_side=side, token_budget=96)  # several batches
    pairs = [(c, w) for c in CONTEXTS for w in CONTINUATIONS]
    longest = 0
    for (ctx, cont), score in zip(pairs, engine.score(pairs), strict=True):
        ctx_ids, cont_ids = engine.encode_pair(ctx, cont)
        lp = plain_logprobs(bundle.model, ctx_ids + cont_ids)
        want = [float(lp[len(ctx_ids) - 1 + j, tok]) for j, tok in enumerate(cont_ids)]
        np.testing.assert_allclose(score.token_logprobs, want, atol=1e-5, rtol=0)
        longest = max(longest, len(ctx_ids) + len(cont_ids))
    assert 52 < longest <= 64
    nexts = engine.next_token_logprobs(CONTEXTS)
    for row, ctx in zip(nexts, CONTEXTS, strict=True):
        torch.testing.assert_close(row.double().cpu(), plain_logprobs(bundle.model, engine.context_ids(ctx))[-1].cpu(),
                                   atol=1e-5, rtol=0)


# -- editors ---------------------------------------------------------------------------------------------------
def _accepts(name: str, method: str) -> bool:
    editor = get_editor(method)
    family = TREES[name].family
    return (not editor.needs_linear_residual or TREES[name].post_norm is None) and (
        editor.families is None or family in editor.families)


WEIGHT_EDITORS = sorted(n for n, e in EDITORS.items() if e.kind == "weights")
ACCEPTED = [(n, m) for n in NEW for m in WEIGHT_EDITORS if _accepts(n, m)]
REFUSED = [(n, m) for n in NEW for m in sorted(EDITORS) if not _accepts(n, m)]


@pytest.mark.parametrize(("name", "method"), ACCEPTED)
def test_every_accepting_editor_edits_and_reverts_bit_exactly(tiny_bundles, request_a, name, method):
    bundle = tiny_bundles[name]
    editor = get_editor(method)
    assert editor.supports(bundle.arch.family)
    engine = ScoringEngine(bundle)
    prompt = request_a.prompt.format(request_a.subject)
    before_scores = engine.next_token_logprobs([prompt])
    before = checksums(bundle.model)
    patch = editor.apply(bundle, request_a, state=editor.new_state(), engine=engine)
    after = checksums(bundle.model)
    changed = {n for n in before if before[n] != after[n]}
    assert changed == set(patch.deltas) and changed  # exactly the patched parameters changed
    assert changed == {bundle.arch.weight_name(layer) for layer in editor.load_hparams(bundle).layers}
    assert not torch.equal(engine.next_token_logprobs([prompt]), before_scores)  # the edit acts on the model
    if TREES[name].tied:  # the head still reads the embedding table
        assert bundle.model.get_output_embeddings().weight is bundle.model.get_input_embeddings().weight
    patch.revert(bundle)
    assert checksums(bundle.model) == before
    patch.apply(bundle)
    assert checksums(bundle.model) == after
    patch.revert(bundle)
    assert checksums(bundle.model) == before
    assert torch.equal(engine.next_token_logprobs([prompt]), before_scores)


@pytest.mark.parametrize(("name", "method"), REFUSED)
def test_other_editors_refuse_naming_the_post_mlp_norm(tiny_bundles, request_a, name, method):
    bundle = tiny_bundles[name]
    before = checksums(bundle.model)
    with pytest.raises(EditscopeError, match=rf"{method} does not support the '{TREES[name].family}' architecture.*"
                                             r"adds linearly to the residual stream.*post_feedforward_layernorm"):
        get_editor(method).apply(bundle, request_a)
    assert checksums(bundle.model) == before


def test_refusals_are_the_post_norm_families_and_the_linear_residual_editors():
    assert {n for n, _ in REFUSED} == {"gemma2", "olmo2"}
    assert {m for _, m in REFUSED} == {"memit", "alphaedit", "prune", "rect", "evk_edit"}
    assert {m for n, m in ACCEPTED if n == "gemma2"} == {"rome", "ft", "kn", "mend", "ultraedit"}


# -- Llama 3.x rope scaling ------------------------------------------------------------------------------------
def llama3_inv_freq(head_dim: int, rope: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(scaled, unscaled) rotary frequencies by Llama 3.1's rule (meta-llama ``apply_scaling``): wavelengths above
    original/low_freq_factor are divided by ``factor``, below original/high_freq_factor kept, smoothly between."""
    base = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    old = rope["original_max_position_embeddings"]
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    out = []
    for f in base.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64), base


def test_llama3_rope_scaling_is_in_force_on_the_tiny_model(tiny_bundles):
    bundle = tiny_bundles["llama3"]
    rotary = bundle.model.model.rotary_emb
    assert bundle.arch.family == "llama" and bundle.config.rope_parameters["rope_type"] == "llama3"
    scaled, base = llama3_inv_freq(bundle.arch.head_dim(bundle.config), LLAMA3_ROPE)
    torch.testing.assert_close(rotary.inv_freq.double().cpu(), scaled, rtol=1e-6, atol=0)
    kept, divided = scaled == base, torch.isclose(scaled, base / LLAMA3_ROPE["factor"])
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # all three bands are exercised


def test_a_llama31_config_json_loads_as_llama_with_its_rope_scaling(tiny_bundles, tmp_path):
    """Llama 3.1/3.2/3.3 checkpoints write ``rope_scaling`` and a top-level ``rope_theta`` (the pre-5.0 keys):
    loaded from a folder they give the llama family, the llama3 rope type, and the same numbers as the tiny model,
    at positions past the original context too."""
    bundle = tiny_bundles["llama3"]
    bundle.model.save_pretrained(tmp_path)
    bundle.tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = load(str(tmp_path))
    assert again.arch.family == "llama" and again.config.rope_parameters["rope_type"] == "llama3"
    torch.testing.assert_close(again.model.model.rotary_emb.inv_freq, bundle.model.model.rotary_emb.inv_freq)
    engine = ScoringEngine(again)
    ctx_ids, cont_ids = engine.encode_pair(CONTEXTS[2], CONTINUATIONS[2])
    assert len(ctx_ids) > LLAMA3_ROPE["original_max_position_embeddings"]
    score = engine.score([(CONTEXTS[2], CONTINUATIONS[2])])[0]
    lp = plain_logprobs(bundle.model, ctx_ids + cont_ids)
    np.testing.assert_allclose(score.token_logprobs, [float(lp[len(ctx_ids) - 1 + j, t])
                                                      for j, t in enumerate(cont_ids)], atol=1e-5, rtol=0)


# -- the listing -------------------------------------------------------------------------------------------------
def _sections(out: str) -> dict[str, dict[str, str]]:
    """``editscope models --families`` output as {family: {"head": first line, label: text}} (labels: editors,
    refused, tests, notes; a label's wrapped lines joined)."""
    sections: dict[str, dict[str, str]] = {}
    label = ""
    for line in out.splitlines():
        if line and not line.startswith(" "):
            family = line.split()[0]
            sections[family] = {"head": line}
        elif line.startswith("  ") and not line.startswith("   "):
            label, _, text = line.strip().partition(" ")
            sections[family][label] = sections[family].get(label, "") + " | " * (label in sections[family]) \
                + text.strip()
        elif line.strip():
            sections[family][label] += " " + line.strip()
    return sections


def test_models_families_lists_every_family_with_its_editors(capsys):
    assert main(["models", "--families"]) == 0
    sections = _sections(capsys.readouterr().out)
    assert set(sections) == set(ARCHS)
    for family, section in sections.items():
        arch = ARCHS[family]
        assert section["head"] == f"{family}  (model_type: {', '.join(arch.model_types)})"
        assert section["editors"].split(", ") == [e.name for e in EDITORS.values() if e.supports(family)]
        refused = [e.name for e in EDITORS.values() if not e.supports(family)]
        assert ("refused" in section) == bool(refused)
        for name in refused:
            assert name in section["refused"]
    for name, tree in TREES.items():
        assert f"tiny-{name}" in sections[tree.family]["tests"].split(", ")
        if tree.post_norm:
            assert sections[tree.family]["refused"] == (
                "memit, alphaedit, prune, rect, evk_edit: it assumes the MLP output adds linearly to the residual "
                f"stream, and {tree.family} normalises it first (post_feedforward_layernorm)")
    assert "parallel" in sections["gpt_neox"]["notes"] and "gate_up_proj" in sections["phi3"]["notes"]


# -- tuning ------------------------------------------------------------------------------------------------------
def test_layer_candidates_follow_the_family_reference():
    """The tuner's layer candidates take the published position from the family's own reference (GPT-NeoX-20B's
    ROME layer 15 of 44 for Pythia: floor(15 * 24 / 44) = 8 on a 24-layer Pythia) or, without one, Llama-3-8B's."""
    from editscope.tune.space import layer_candidates

    found, why = layer_candidates("rome", "gpt_neox", 24, None, [8])
    assert why["published"] == [8] and found == [[7], [8], [9]]
    found, why = layer_candidates("rome", "olmo2", 16, None, [5])
    assert why["published"] == [2] and found == [[1], [2], [3], [4], [5], [6]]  # floor(5 * 16 / 32) = 2


def test_tune_runs_end_to_end_on_a_new_family(tiny_bundles, tmp_path):
    """``editscope tune`` on Pythia's family (parallel residual, its own LayerReference): 2 layers x 2 v_lr
    candidates on 2 then 4 validation cases; the tuned YAML loads for the model and edits it."""
    from editscope.edit.hparams import load_yaml
    from editscope.edit.rome import RomeHParams
    from editscope.tune import Tuner, TuneSettings

    bundle = tiny_bundles["gpt_neox"]
    out = tmp_path / "tune"
    settings = TuneSettings(model="tiny-gpt_neox", method="rome", out=str(out), budget_minutes=30,
                            overrides={"v_steps": 2}, knobs=["layers", "v_lr"], grid={"layers": ([1], [2])},
                            first=2, eta=2, max_cases=4)
    result = Tuner(settings, bundle=bundle, progress=False, log=lambda _m: None).run()
    assert result.halving.complete and result.chosen is not None and len(result.halving.rungs[0][1]) == 4
    hp = load_yaml(result.yaml_path, RomeHParams, n_layers=bundle.n_layers)
    assert hp.layers == result.chosen.to_dict()["hparams"]["layers"] and hp.v_steps == 2
    before = checksums(bundle.model)
    patch = get_editor("rome").apply(bundle, EditRequest("{} is located in", "Paris", "Rome", "France"), hp)
    assert set(patch.deltas) == {bundle.arch.weight_name(hp.layers[0])}
    patch.revert(bundle)
    assert checksums(bundle.model) == before
