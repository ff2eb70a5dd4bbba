"""Editor conventions (DESIGN rule 10).

Under ``convention: reference`` the ΔW of ROME, MEMIT and AlphaEdit equals a straight-line re-implementation of
kmeng01/rome (``compute_u``, ``compute_v``, ``execute_rome``), kmeng01/memit (``compute_z``, ``compute_ks``,
``execute_memit``) and jianghoucheng/AlphaEdit (``execute_AlphaEdit``) written here from plain HF forwards, torch
forward hooks, a plain Adam loop and ``torch.linalg.solve`` — none of the editor's helpers. Under ``paper`` it
equals the same code with the paper's three readings switched on (essence KL after "{s} is a"; ROME eq. 2 on k*;
uniform key average), and the two ΔW differ. The inputs both sides share are the sampled context templates
(returned by the editor) and the key second moment C.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from editscope.edit import get_editor
from editscope.edit.context import context_templates, template_weights
from editscope.edit.objective import EssenceKL
from editscope.errors import EditscopeError
from editscope.lm.archs import ARCHS
from editscope.lm.engine import ScoringEngine
from editscope.lm.tiny import tiny_family
from editscope.stats import second_moments
from tests.conftest import TINY_MODELS

STEPS = 3
#: the HF module names of each tiny model's MLP down projection by model_type, written out here (not the arch maps)
DOWN = {"llama": "down_proj", "gemma3_text": "down_proj", "gpt2": "c_proj", "gptj": "fc_out", "qwen3": "down_proj",
        "gemma2": "down_proj", "phi3": "down_proj", "gpt_neox": "dense_4h_to_h", "olmo2": "down_proj",
        "smollm3": "down_proj"}
#: MEMIT's residual spread needs a linear residual: not a family whose MLP output passes a norm first (Gemma 2/3,
#: OLMo 2), read off each tiny model's architecture map
ROME_FAMILIES = TINY_MODELS
MEMIT_FAMILIES = [m for m in TINY_MODELS if ARCHS[tiny_family(m)].mlp_post_norm is None]


def blocks(model):
    if hasattr(model, "transformer"):
        return model.transformer.h
    return model.gpt_neox.layers if hasattr(model, "gpt_neox") else model.model.layers


def down_proj(model, layer: int):
    return getattr(blocks(model)[layer].mlp, DOWN[model.config.model_type])


# -- a straight-line reference implementation ---------------------------------------------------------------
def ids(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]


def lookup_idx(tok, template: str, subject: str) -> int:
    """repr_tools.get_words_idxs_in_templates(subtoken="last"): the subject's last token."""
    i = template.index("{}")
    prefix, word = template[:i], subject
    if prefix:
        assert prefix.endswith(" ")
        prefix, word = prefix[:-1], " " + subject.strip()
    return len(ids(tok, prefix)) + len(ids(tok, word)) - 1


def batch(tok, texts: list[str], device: torch.device) -> dict:
    rows = [ids(tok, t) for t in texts]
    width = max(map(len, rows))
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        input_ids[r, : len(row)] = torch.tensor(row)
        mask[r, : len(row)] = 1
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}


def mlp_io(model, layer: int, tok, prompts: list[str], subject: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and output of the layer's down projection at the subject's last token of each prompt."""
    seen = {}
    module = down_proj(model, layer)
    handle = module.register_forward_hook(lambda m, i, o: seen.update(i=i[0].detach(), o=o.detach()))
    try:
        with torch.no_grad():
            model(**batch(tok, [p.format(subject) for p in prompts], model.device))
    finally:
        handle.remove()
    idx = [lookup_idx(tok, p, subject) for p in prompts]
    rows = torch.arange(len(prompts), device=model.device)
    return seen["i"][rows, idx].double(), seen["o"][rows, idx].double()


def block_out(model, layer: int, tok, prompt: str, subject: str) -> torch.Tensor:
    seen = {}
    handle = blocks(model)[layer].register_forward_hook(
        lambda m, i, o: seen.update(h=(o[0] if isinstance(o, tuple) else o).detach()))
    try:
        with torch.no_grad():
            model(**batch(tok, [prompt.format(subject)], model.device))
    finally:
        handle.remove()
    return seen["h"][0, lookup_idx(tok, prompt, subject)].double()


def compute_target(model, tok, req, templates, hp, module, kl_at_subject: bool) -> torch.Tensor:
    """compute_v / compute_z: v* (or z) = init + δ, δ from Adam on NLL + KL + weight decay."""
    target_ids = ids(tok, " " + req.target_new)
    rewriting = [c.format(req.prompt) + tok.decode(target_ids[:-1]) for c in templates]
    all_prompts = rewriting + ["{} is a"]
    inputs = batch(tok, [p.format(req.subject) for p in all_prompts], model.device)
    n = len(rewriting)
    targets = torch.full((n, inputs["input_ids"].shape[1]), -100)
    for i in range(n):
        ex_len = int(inputs["attention_mask"][i].sum())
        targets[i, ex_len - len(target_ids): ex_len] = torch.tensor(target_ids)
    targets = targets.to(model.device)
    lookup = [lookup_idx(tok, p, req.subject) for p in all_prompts]
    kl_pos = lookup[-1] if kl_at_subject else int(inputs["attention_mask"][-1].sum()) - 1

    delta = torch.zeros(model.config.hidden_size, requires_grad=True, device=model.device)
    state = {"init": None}

    def edit(mod, inp, out):
        h = out[0] if isinstance(out, tuple) else out
        if state["init"] is None:
            state["init"] = h[0, lookup[0]].detach().clone()
        h = h.clone()
        for i, idx in enumerate(lookup):
            h[i, idx] = h[i, idx] + delta
        return (h, *out[1:]) if isinstance(out, tuple) else h

    opt = torch.optim.Adam([delta], lr=hp.v_lr)
    kl_init = None
    handle = module.register_forward_hook(edit)
    try:
        for it in range(hp.v_steps):
            opt.zero_grad()
            logits = model(**inputs).logits
            kl_lp = torch.log_softmax(logits[-1, kl_pos][None], dim=1)
            if kl_init is None:
                kl_init = kl_lp.detach().clone()
            lp = torch.log_softmax(logits[:n], dim=2)
            tok_lp = torch.gather(lp, 2, torch.where(targets != -100, targets, 0).unsqueeze(2)).squeeze(2)
            nll = (-(tok_lp * (targets != -100).float()).sum(1) / len(target_ids)).mean()
            kl = hp.kl_factor * F.kl_div(kl_init, kl_lp, log_target=True, reduction="batchmean")
            loss = nll + kl + hp.v_weight_decay * delta.norm() / state["init"].norm() ** 2
            if loss < hp.stop_loss or it == hp.v_steps - 1:
                break
            loss.backward()
            opt.step()
            max_norm = hp.clamp_norm_factor * state["init"].norm()
            if delta.norm() > max_norm:
                with torch.no_grad():
                    delta[...] = delta * max_norm / delta.norm()
    finally:
        handle.remove()
    return (state["init"] + delta).detach().double()


def reference_rome(bundle, req, templates, cov, hp, paper: bool, bare_key: bool | None = None) -> torch.Tensor:
    """``paper`` switches the essence KL to after "{s} is a" and (unless ``bare_key`` says otherwise) the update
    to eq. 2 on k*."""
    model, tok, layer = bundle.model, bundle.tokenizer, hp.layers[0]
    bare_key = not paper if bare_key is None else bare_key
    target = compute_target(model, tok, req, templates, hp, blocks(model)[layer].mlp, kl_at_subject=not paper)
    keys, _ = mlp_io(model, layer, tok, [c.format(req.prompt) for c in templates], req.subject)
    k_star = keys.mean(0)
    u = torch.linalg.solve(cov.double().to(k_star.device), k_star)
    if not bare_key:  # eq. 2: Λ = (v* − W k*) / ((C⁻¹k*)ᵀ k*)
        w_k = down_proj(model, layer)(k_star.float()[None])[0].detach().double()
        return torch.outer(target - w_k, u) / (u @ k_star)
    left = u / u.norm()
    cur_input, cur_output = mlp_io(model, layer, tok, [req.prompt], req.subject)
    right = (target - cur_output[0]) / (cur_input[0] @ left)
    return torch.outer(right, left)


def reference_memit_family(bundle, reqs, templates, groups, covs, hp, paper: bool, solve) -> dict[int, torch.Tensor]:
    model, tok = bundle.model, bundle.tokenizer
    z_layer = hp.layers[-1]
    zs = torch.stack([compute_target(model, tok, r, templates, hp, blocks(model)[z_layer], not paper)
                      for r in reqs], dim=1)
    originals = {la: down_proj(model, la).weight.detach().clone() for la in hp.layers}
    out = {}
    try:
        for i, layer in enumerate(hp.layers):
            ks = []
            for r in reqs:
                k, _ = mlp_io(model, layer, tok, [c.format(r.prompt) for c in templates], r.subject)
                if paper:
                    ks.append(k.mean(0))
                else:  # compute_ks: mean per template group, then over groups
                    bounds = torch.tensor([0, *groups]).cumsum(0).tolist()
                    means = [k[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
                    ks.append(torch.stack(means).mean(0))
            layer_ks = torch.stack(ks, dim=1)
            cur_zs = torch.stack([block_out(model, z_layer, tok, r.prompt, r.subject) for r in reqs], dim=1)
            resid = (zs - cur_zs) / (len(hp.layers) - i)
            upd = solve(layer, layer_ks, resid, covs[layer].double().to(layer_ks.device))
            with torch.no_grad():
                module = down_proj(model, layer)
                stored = upd.T if type(module).__name__ == "Conv1D" else upd
                module.weight[...] = originals[layer] + stored.float()
            out[layer] = upd
    finally:
        with torch.no_grad():
            for la, w in originals.items():
                down_proj(model, la).weight[...] = w
    return out


def memit_solve(lam):
    def solve(_layer, ks, resid, cov):
        adj_k = torch.linalg.solve(lam * cov + ks @ ks.T, ks)
        return resid @ adj_k.T
    return solve


def alphaedit_solve(threshold, l2):
    def solve(_layer, ks, resid, cov):
        u, s, _ = torch.linalg.svd(cov, full_matrices=False)
        small = u[:, s < threshold]
        p = small @ small.T
        eye = torch.eye(ks.shape[0], dtype=torch.float64, device=ks.device)
        return torch.linalg.solve(p @ (ks @ ks.T) + l2 * eye, p @ ks @ resid.T).T  # (in, out) -> (out, in)
    return solve


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


# -- tests -----------------------------------------------------------------------------------------------------
def _patch(bundle, method, reqs, convention):
    editor = get_editor(method)
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, convention=convention)
    patch = editor.compute_patch(bundle, reqs if len(reqs) > 1 else reqs[0], hp, engine=ScoringEngine(bundle))
    deltas = {la: bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(la)]).double() for la in hp.layers}
    return hp, patch.info["templates"], deltas


@pytest.mark.parametrize("family", ROME_FAMILIES)
def test_rome_reference_and_paper_match_straight_line(tiny_bundles, request_a, family):
    bundle = tiny_bundles[family]
    got = {}
    for convention in ("reference", "paper"):
        hp, templates, deltas = _patch(bundle, "rome", [request_a], convention)
        cov = second_moments(bundle, hp.layers, token_budget=hp.mom2_tokens, weights="base")[hp.layers[0]]
        want = reference_rome(bundle, request_a, templates, cov, hp, paper=convention == "paper")
        got[convention] = deltas[hp.layers[0]]
        assert rel(got[convention], want) < 1e-5, convention
    assert rel(got["paper"], got["reference"]) > 1e-3


@pytest.mark.parametrize("family", MEMIT_FAMILIES)
@pytest.mark.parametrize("method", ["memit", "alphaedit"])
def test_memit_family_reference_and_paper_match_straight_line(tiny_bundles, request_a, request_b, method, family):
    bundle = tiny_bundles[family]
    got = {}
    for convention in ("reference", "paper"):
        hp, templates, deltas = _patch(bundle, method, [request_a, request_b], convention)
        groups = [1] + [n for _, n in hp.context_templates]
        covs = second_moments(bundle, hp.layers, token_budget=hp.mom2_tokens, weights="base")
        solve = (memit_solve(hp.mom2_update_weight) if method == "memit"
                 else alphaedit_solve(hp.nullspace_threshold, hp.L2))
        want = reference_memit_family(bundle, [request_a, request_b], templates, groups, covs, hp,
                                      convention == "paper", solve)
        for layer in hp.layers:
            assert rel(deltas[layer], want[layer]) < 1e-5, (convention, layer)
        got[convention] = torch.cat([deltas[la].flatten() for la in hp.layers])
    assert rel(got["paper"], got["reference"]) > 1e-3


@pytest.mark.parametrize(("preset", "switch", "paper", "bare_key"), [
    ("paper", {"update_key": "bare"}, True, True),
    ("reference", {"update_key": "k_star"}, False, False),
    ("reference", {"kl_at": "next"}, True, True),
])
def test_one_switch_over_a_preset_changes_only_its_reading(tiny_bundles, request_a, preset, switch, paper, bare_key):
    """Each switch acts alone: a preset with one switch overridden equals the reference re-implementation with
    only that reading changed, and the switches in force are what the hparams report (recorded per row)."""
    bundle = tiny_bundles["llama"]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, convention=preset, **switch)
    patch = editor.compute_patch(bundle, request_a, hp)
    layer = hp.layers[0]
    cov = second_moments(bundle, hp.layers, token_budget=hp.mom2_tokens, weights="base")[layer]
    want = reference_rome(bundle, request_a, patch.info["templates"], cov, hp, paper=paper, bare_key=bare_key)
    assert rel(bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(layer)]).double(), want) < 1e-5
    assert {k: hp.protocol()[k] for k in switch} == switch and hp.protocol()["convention"] == preset


def test_template_weights_hand_examples():
    half = torch.tensor([0.5] + [0.1] * 5, dtype=torch.float64)  # MEMIT's spec: the bare prompt weighs ½
    assert torch.allclose(template_weights([[10, 5]], "grouped"), half)
    assert torch.allclose(template_weights([[10, 5]], "flat"), torch.full((6,), 1 / 6, dtype=torch.float64))
    ref = template_weights([[5, 10], [10, 10]], "grouped")  # ROME's original spec as MEMIT groups: ⅓ each group
    assert torch.allclose(ref, torch.tensor([1 / 3] + [1 / 30] * 20, dtype=torch.float64))
    with pytest.raises(EditscopeError):
        template_weights([[10, 5]], "easyedit")


def test_essence_kl_reads_at_declared_position(tiny_bundles, request_a):
    """``at="subject"`` reads the logits at the subject's last token of "{s} is a", ``at="next"`` after "a"."""
    from editscope.edit.objective import VStep, build_context

    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    ctx = build_context(engine, request_a, ["{}"], "blocks.1.mlp_out")
    hidden = engine.batch_hidden(ctx.batch).detach()
    tok = bundle.tokenizer
    text = f"{request_a.subject} is a"
    with torch.no_grad():
        logits = bundle.model(torch.tensor([ids(tok, text)], device=bundle.device)).logits[0].log_softmax(-1)
    subj = len(ids(tok, request_a.subject)) - 1
    for at, pos in (("subject", subj), ("next", len(ids(tok, text)) - 1)):
        got = EssenceKL(at=at).logprobs(VStep(ctx, None, hidden))[0]
        assert torch.allclose(got.cpu(), logits[pos].cpu(), atol=1e-4), at
    with pytest.raises(ValueError):
        EssenceKL(at="elsewhere")


def test_convention_is_validated(tiny_bundles):
    editor = get_editor("rome")
    with pytest.raises(EditscopeError, match="convention"):
        editor.load_hparams(tiny_bundles["llama"]).replace(convention="easyedit")


def test_template_start_is_not_kept_in_the_prefix(tiny_bundles):
    engine = ScoringEngine(tiny_bundles["gpt2"])
    templates = context_templates(engine, [[4, 3]], 0, start="<|endoftext|>")
    assert templates[0] == "{}" and len(templates) == 4
    for template, word in zip(templates[1:], ("The", "Therefore", "Because"), strict=True):
        assert template.startswith(word) and template.endswith(". {}") and "<|endoftext|>" not in template
