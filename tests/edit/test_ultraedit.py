"""UltraEdit: ΔW against a plain-torch re-implementation of the paper's turn, the lifelong normaliser's statistics
and its round trip through a saved state, efficacy on every tiny family, and a slow SmolLM2 turn of CounterFact
edits."""

from __future__ import annotations

import copy
import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from editscope.data import load_cases
from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.ultraedit import EPS, UltraEditState, ridge_condition, ridge_update, shape_key
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine

TURN_1 = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
          EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch"),
          EditRequest("{} plays the position of", "Toko Yasuda", "Ouagadougou quarterback", "guitar")]
TURN_2 = [EditRequest("{} was founded in", "Apple", "Berlin", "California"),
          EditRequest("The capital of {} is", "France", "Madrid", "Paris")]


def _keep_output_grad(seen: dict, layer: int):
    """A forward hook recording a module's input and its output, whose gradient the backward keeps."""
    def hook(_module, args, output):
        output.retain_grad()
        seen[layer] = (args[0], output)
    return hook


def request_rows(model, engine: ScoringEngine, req, layers, scale: float = 1.0
                 ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One request's down-projection inputs and output gradients per layer at the positions predicting its answer,
    from one plain HF forward (no padding, no batching) of ``scale`` · Σ −log P(o* | p) from input embeddings that
    require grad (float64)."""
    mods = {la: model.model.layers[la].mlp.down_proj for la in layers}
    ctx, cont = engine.encode_pair(req.text, req.target_new)
    ids = torch.tensor([ctx + cont])
    c, n = len(ctx), len(cont)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = [m.register_forward_hook(_keep_output_grad(seen, la)) for la, m in mods.items()]
    try:
        with torch.enable_grad():
            embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            lp = model(inputs_embeds=embeds).logits[0][c - 1:c + n - 1].log_softmax(-1)
            (-lp.gather(-1, ids[0, c:c + n][:, None]).sum() * scale).backward()
    finally:
        for h in handles:
            h.remove()
    return {la: (seen[la][0][0, c - 1:c + n - 1].detach().double(), seen[la][1].grad[0, c - 1:c + n - 1].double())
            for la in layers}


def plain_turn(model, engine: ScoringEngine, requests, layers, lr: float, ridge: float
               ) -> dict[int, torch.Tensor]:
    """UltraEdit's turn from its description, on an unedited LLaMA-layout model with an empty normaliser: per request
    one HF forward (no padding, no batching) from input embeddings that require grad, the down projections' inputs
    and output gradients (retain_grad) at the positions predicting the answer, L = Σ −log P(o* | p); z = [k ‖ g];
    μ, σ (unbiased) over every row of every layer (one shape); ẑ = (z − μ)/(σ + ε); V = −η‖k̂‖² ĝ; and
    ΔWᵀ = (KᵀK + λI)⁻¹ KᵀV solved in the paper's (in × in) form."""
    keys = {la: [] for la in layers}
    grads = {la: [] for la in layers}
    for req in requests:
        for la, (k, g) in request_rows(model, engine, req, layers).items():
            keys[la].append(k)
            grads[la].append(g)
    K = {la: torch.cat(keys[la]) for la in layers}
    G = {la: torch.cat(grads[la]) for la in layers}
    Z = torch.cat([torch.cat([K[la], G[la]], -1) for la in layers])
    mu, sigma = Z.mean(0), Z.std(0)
    out = {}
    for la in layers:
        z_hat = (torch.cat([K[la], G[la]], -1) - mu) / (sigma + EPS)
        k_hat, g_hat = z_hat[:, :K[la].shape[1]], z_hat[:, K[la].shape[1]:]
        V = -lr * (k_hat ** 2).sum(-1, keepdim=True) * g_hat
        n_in = K[la].shape[1]
        out[la] = torch.linalg.solve(K[la].T @ K[la] + ridge * torch.eye(n_in, dtype=torch.float64),
                                     K[la].T @ V).T
    return out


@pytest.mark.parametrize("dtype,rel", [(torch.float64, 1e-7), (torch.float32, 5e-5)])
def test_delta_w_equals_a_plain_reimplementation_of_the_turn(tiny_bundles, dtype, rel):
    """In float64 the two agree to rounding; in float32 the output gradients themselves differ by ~1e-5 (relative)
    between one batched forward and single-row forwards (the LM head's backward sums 50k vocabulary terms), and ΔW
    by up to ~2e-5."""
    bundle = copy.deepcopy(tiny_bundles["llama"])
    bundle.model.to(dtype)
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(bundle).replace(layers=[1, 2, 3], lr=3e-3, ridge=0.5)
    engine = ScoringEngine(bundle, token_budget=24)  # the editor's forwards split the turn into chunks
    want = plain_turn(bundle.model, engine, TURN_1, hp.layers, hp.lr, hp.ridge)
    patch, state = editor.compute_edit(bundle, TURN_1, hp, editor.new_state(), engine=engine)  # the state update
    for layer in hp.layers:
        got = bundle.arch.as_out_in(patch.deltas[bundle.arch.weight_name(layer)])
        assert got.dtype == dtype and want[layer].abs().max() > 1e-3
        assert (got.double() - want[layer]).abs().max() <= rel * want[layer].abs().max(), layer
    n_rows = sum(len(engine.encode_pair(r.text, r.target_new)[1]) for r in TURN_1)
    assert patch.info["answer_tokens"] == n_rows and n_rows > len(TURN_1)  # multi-token answers: every token's row
    assert state.counts == {shape_key(128, 64): 3 * n_rows} and state.n_edits == 3 and state.n_turns == 1
    assert set(patch.info["solve_cond"]) == set(hp.layers)
    assert patch.info["solve_cond_max"] == max(patch.info["solve_cond"].values()) > 1.0


def plain_reference_turn(model, engine: ScoringEngine, requests, layers, lr: float, ridge: float, sub_batch: int
                         ) -> dict[int, torch.Tensor]:
    """The reference code's turn as docs/editors.md describes it, written plainly: requests in sub-batches of
    ``sub_batch``; each sub-batch's loss the mean NLL over its answer tokens (so each request's backward is scaled by
    1/T_b); a running mean, M2 and count updated once per (sub-batch, layer) with n times the rows' *unbiased*
    variance (Chan's combination); σ = sqrt(M2 / (N − 1 + ε)); then as the paper."""
    tokens = [len(engine.encode_pair(r.text, r.target_new)[1]) for r in requests]
    batches = [list(range(i, min(i + sub_batch, len(requests)))) for i in range(0, len(requests), sub_batch)]
    feats: dict[tuple[int, int], list[torch.Tensor]] = {}
    keys = {la: [] for la in layers}
    for b, members in enumerate(batches):
        t_b = sum(tokens[i] for i in members)
        for i in members:
            for la, (kk, gg) in request_rows(model, engine, requests[i], layers, 1.0 / t_b).items():
                keys[la].append(kk)
                feats.setdefault((b, la), []).append(torch.cat([kk, gg], -1))
    mean = m2 = None
    count = 0
    for b in range(len(batches)):
        for la in layers:
            z = torch.cat(feats[(b, la)])
            n = z.shape[0]
            z_mean, z_var = z.mean(0), z.var(0, unbiased=True)
            if mean is None:
                mean, m2 = torch.zeros_like(z_mean), torch.zeros_like(z_mean)
            delta, total = z_mean - mean, count + n
            mean = mean + delta * n / total
            m2 = m2 + z_var * n + delta ** 2 * count * n / total
            count = total
    sigma = (m2 / (count - 1 + EPS)).sqrt()
    out = {}
    for la in layers:
        K = torch.cat(keys[la])
        Z = torch.cat([torch.cat(feats[(b, la)]) for b in range(len(batches))])
        z_hat = (Z - mean) / (sigma + EPS)
        k_hat, g_hat = z_hat[:, :K.shape[1]], z_hat[:, K.shape[1]:]
        V = -lr * (k_hat ** 2).sum(-1, keepdim=True) * g_hat
        out[la] = torch.linalg.solve(K.T @ K + ridge * torch.eye(K.shape[1], dtype=torch.float64), K.T @ V).T
    return out


def test_the_reference_convention_equals_a_plain_reimplementation_of_the_references_turn(tiny_bundles):
    """convention: reference (the mean NLL per sub-batch, the normaliser updated per sub-batch with n × the unbiased
    variance) against the plain loop above; the paper's ΔW differs from it; the switches are recorded."""
    bundle = copy.deepcopy(tiny_bundles["llama"])
    bundle.model.double()
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(bundle).replace(layers=[1, 2, 3], lr=3e-3, ridge=0.5, convention="reference",
                                             sub_batch=2)
    engine = ScoringEngine(bundle, token_budget=24)
    want = plain_reference_turn(bundle.model, engine, TURN_1, hp.layers, hp.lr, hp.ridge, sub_batch=2)
    patch, _ = editor.compute_edit(bundle, TURN_1, hp, editor.new_state(), engine=engine)
    paper, _ = editor.compute_edit(bundle, TURN_1, hp.replace(convention="paper"), editor.new_state(), engine=engine)
    for layer in hp.layers:
        name = bundle.arch.weight_name(layer)
        got = bundle.arch.as_out_in(patch.deltas[name])
        assert (got - want[layer]).abs().max() <= 1e-7 * want[layer].abs().max(), layer
        assert (bundle.arch.as_out_in(paper.deltas[name]) - want[layer]).abs().max() > 1e-3 * want[layer].abs().max()
    assert hp.protocol() == {"convention": "reference", "loss": "subbatch_mean", "variance": "subbatch_unbiased",
                             "sub_batch": "2"}
    assert editor.load_hparams(bundle).protocol() == {} and "convention" not in editor.load_hparams(bundle).to_dict()
    # one switch alone, and the refusal where the reference gives NaN (a sub-batch of one answer token)
    assert hp.replace(convention="paper", loss="subbatch_mean").switches() == {"loss": "subbatch_mean",
                                                                              "variance": "exact"}
    one_token = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")]
    assert len(engine.encode_pair(one_token[0].text, "Japan")[1]) == 1
    with pytest.raises(EditscopeError, match="a sub-batch holds one answer token.*NaN"):
        editor.compute_edit(bundle, one_token, hp.replace(sub_batch=1), editor.new_state(), engine=engine)
    with pytest.raises(EditscopeError, match="key 'variance': must be one of exact, subbatch_unbiased"):
        hp.replace(variance="biased")


def test_running_statistics_equal_those_of_all_rows_and_one_row_gives_zero():
    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(n, 5, generator=g, dtype=torch.float64) * 3 + 1 for n in (4, 1, 7)]
    state = UltraEditState()
    for part in parts:
        state.update("a", part)
    rows = torch.cat(parts)
    assert state.counts["a"] == 12
    torch.testing.assert_close(state.means["a"], rows.mean(0), rtol=0, atol=1e-12)
    torch.testing.assert_close(state.std("a"), rows.std(0), rtol=1e-7, atol=0)  # N−1+ε against N−1
    x = torch.randn(2, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(state.normalise("a", x), (x - rows.mean(0)) / (rows.std(0) + EPS))
    one = UltraEditState()
    one.update("b", parts[1])  # a single row: σ = 0 and the row normalises to exactly 0 (no NaN)
    assert torch.equal(one.normalise("b", parts[1]), torch.zeros_like(parts[1]))
    with pytest.raises(EditscopeError, match="no normaliser statistics"):
        one.normalise("c", parts[1])


def test_dual_solve_equals_the_papers_primal_solve():
    g = torch.Generator().manual_seed(5)
    keys, values = torch.randn(6, 20, generator=g, dtype=torch.float64), torch.randn(6, 9, generator=g,
                                                                                       dtype=torch.float64)
    for k in (keys, torch.randn(30, 20, generator=g, dtype=torch.float64)):
        v = values if k is keys else torch.randn(30, 9, generator=g, dtype=torch.float64)
        primal = torch.linalg.solve(k.T @ k + 2.0 * torch.eye(20, dtype=torch.float64), k.T @ v).T
        torch.testing.assert_close(ridge_update(k, v, 2.0), primal, rtol=1e-10, atol=1e-12)


def test_the_solve_condition_number_is_that_of_the_primal_matrix():
    """Against numpy's condition number of KᵀK + λI itself: fewer rows than inputs (rank-deficient KᵀK, so the
    smallest eigenvalue is λ) and more."""
    g = torch.Generator().manual_seed(7)
    for n in (6, 40):
        keys = torch.randn(n, 20, generator=g, dtype=torch.float64) * 3.0
        want = np.linalg.cond((keys.T @ keys + 0.5 * torch.eye(20, dtype=torch.float64)).numpy())
        assert ridge_condition(keys, 0.5) == pytest.approx(want, rel=1e-8)


def _save_and_load(state: UltraEditState, path) -> UltraEditState:
    """The state through safetensors and JSON, as a lifelong chain's checkpoint stores it (no pickle)."""
    tensors, meta = state.state_dict()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"state": json.dumps(meta)})
    return UltraEditState.from_state_dict(load_file(str(path)), json.loads(json.dumps(meta)), str(path))


def test_two_turns_after_a_round_trip_equal_two_uninterrupted_turns(tiny_bundles, tmp_path):
    bundle = tiny_bundles["gpt2"]
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(bundle)
    engine = ScoringEngine(bundle)
    runs = []
    for interrupted in (False, True):
        state = editor.new_state()
        first = editor.apply(bundle, TURN_1, hp, state, engine=engine)
        if interrupted:
            before = copy.deepcopy(state)
            state = _save_and_load(state, tmp_path / "state.safetensors")
            assert state.counts == before.counts and (state.n_edits, state.n_turns) == (3, 1)
            assert all(torch.equal(state.means[k], before.means[k]) and torch.equal(state.sq_devs[k], before.sq_devs[k])
                       for k in before.counts)
        second = editor.apply(bundle, TURN_2, hp, state, engine=engine)
        second.revert(bundle)
        first.revert(bundle)
        runs.append((first.deltas, second.deltas, state))
    (a1, a2, sa), (b1, b2, sb) = runs
    assert a1.keys() == b1.keys() == a2.keys() == b2.keys()
    assert all(torch.equal(a1[n], b1[n]) and torch.equal(a2[n], b2[n]) for n in a1)
    assert sa.n_turns == sb.n_turns == 2 and sa.n_edits == 5 and sa.counts == sb.counts
    # the second turn depends on the first's statistics: a fresh normaliser gives another ΔW on the same weights
    first = editor.apply(bundle, TURN_1, hp, editor.new_state(), engine=engine)
    try:
        fresh = editor.compute_patch(bundle, TURN_2, hp, editor.new_state(), engine=engine)
    finally:
        first.revert(bundle)
    assert any(not torch.allclose(fresh.deltas[n], a2[n]) for n in a2)


def test_a_saved_state_missing_a_tensor_or_count_is_refused(tmp_path):
    state = UltraEditState()
    state.update("8x4", torch.ones(2, 12, dtype=torch.float64))
    tensors, meta = state.state_dict()
    assert set(tensors) == {"mean.8x4", "sq_dev.8x4"} and meta == {"counts": {"8x4": 2}, "n_edits": 0, "n_turns": 0}
    with pytest.raises(EditscopeError, match=r"ck: editor state: missing tensor\(s\) \['sq_dev.8x4'\]"):
        UltraEditState.from_state_dict({"mean.8x4": tensors["mean.8x4"]}, meta, "ck")
    with pytest.raises(EditscopeError, match="metadata key 'counts'"):
        UltraEditState.from_state_dict(tensors, {"counts": {"8x4": 0}, "n_edits": 0, "n_turns": 0}, "ck")
    assert UltraEditState.from_state_dict({}, {"counts": {}, "n_edits": 0, "n_turns": 0}, "ck").counts == {}
    assert state.without_edits().counts == {}


def test_a_turn_raises_every_target_on_each_tiny_family(tiny):  # every family of conftest's TINY_FAMILIES
    bundle = tiny
    editor = get_editor("ultraedit")
    assert editor.supports(bundle.arch.family) and editor.sequential and not editor.optimises
    engine = ScoringEngine(bundle)
    pairs = [(r.text, r.target_new) for r in TURN_1]
    pre = [s.sum for s in engine.score(pairs)]
    before = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    patch = editor.apply(bundle, TURN_1, state=editor.new_state(), engine=engine)
    try:
        post = [s.sum for s in engine.score(pairs)]
    finally:
        patch.revert(bundle)
    assert all(b > a + 0.3 for a, b in zip(pre, post, strict=True)), (pre, post)
    assert all(torch.equal(before[n], p) for n, p in bundle.model.named_parameters())


def test_plugins_are_refused(tiny_bundles):
    with pytest.raises(EditscopeError, match="ultraedit does not optimise a loss"):
        get_editor("ultraedit").apply(tiny_bundles["llama"], TURN_1, plugins=["app"])


def _weights_hash(model) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.slow
def test_smollm2_one_turn_of_counterfact_edits(smollm2):
    """Ten CounterFact edits in one turn with the shipped config: ES (P(new) > P(true), mean token NLL) rises
    from the unedited share to at least 0.8; the revert is exact."""
    cases = load_cases("counterfact", limit=10)
    requests = [c.request for c in cases]
    engine = ScoringEngine(smollm2)
    pairs = [pair for r in requests for pair in ((r.text, r.target_new), (r.text, r.target_true))]

    def es() -> float:
        s = [x.mean for x in engine.score(pairs)]
        return sum(s[i] > s[i + 1] for i in range(0, len(s), 2)) / len(requests)

    before, pre = _weights_hash(smollm2.model), es()
    editor = get_editor("ultraedit")
    patch = editor.apply(smollm2, requests, state=editor.new_state(), engine=engine)
    try:
        post = es()
    finally:
        patch.revert(smollm2)
    assert post >= 0.8 and post > pre + 0.3, (pre, post)
    assert _weights_hash(smollm2.model) == before
