"""WISE (side memories and a router) checked against independent computations: TIES merging worked by hand, the
router's choice computed position by position in plain loops, a routed row scored by the model with the side weight
hand-installed, a row under every threshold bit-equal to the unedited model, the shard/merge schedule counted by hand,
the partial forward against the full one, and one-line refusals of bad settings."""

from __future__ import annotations

import hashlib
import warnings

import pytest
import torch

from editscope.edit import get_editor
from editscope.edit.side_memory import SideMemoryEdit, route
from editscope.edit.ties import ties_merge
from editscope.edit.wise import WiseHParams, WiseMemory, margin_loss
from editscope.errors import EditscopeError
from editscope.lm.bundle import MemoryRead
from editscope.lm.engine import ScoringEngine
from editscope.lm.partial_forward import BlockForward

SMALL = {"n_iter": 8, "layers": [1], "context_templates": [[5, 1]], "irrelevant_pool": "counterfact-train-sample"}


def weights(model) -> dict[str, str]:
    return {n: hashlib.sha256(p.detach().cpu().numpy().tobytes()).hexdigest() for n, p in model.named_parameters()}


def wise_hparams(bundle, **overrides) -> WiseHParams:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny models have no shipped WISE file: derived layer
        return get_editor("wise").load_hparams(bundle, overrides={**SMALL, **overrides})


# -- TIES ----------------------------------------------------------------------------------------------------------
def test_ties_merge_follows_trim_elect_and_disjoint_mean_by_hand():
    base = torch.tensor([1.0, 1.0, 1.0, 1.0])
    a = base + torch.tensor([3.0, -1.0, 0.5, 2.0])
    b = base + torch.tensor([-2.0, -2.0, 1.0, 0.1])
    # trim to density 0.5 (2 of 4 entries): a's deltas (3, 0, 0, 2), b's (-2, -2, 0, 0); weights 1/2 each:
    # weighted sum (0.5, -1, 0, 1) elects (+, -, +, +); agreeing entries: a at 0 and 3, b at 1; no one at 2
    # merged delta per entry = Σ agreeing λ·τ / Σ agreeing λ = (1.5/0.5, -1/0.5, 0, 1/0.5) = (3, -2, 0, 2)
    got = ties_merge(base, [a, b], [0.5, 0.5], density=0.5)
    assert got.tolist() == [4.0, -1.0, 1.0, 3.0]
    # without the division: the sum of agreeing weighted deltas
    assert ties_merge(base, [a, b], [0.5, 0.5], density=0.5, normalize=False).tolist() == [2.5, 0.0, 1.0, 2.0]
    with pytest.raises(EditscopeError, match="one weight per tensor"):
        ties_merge(base, [a, b], [1.0], density=0.5)
    with pytest.raises(EditscopeError, match=r"density must be in \(0, 1\]"):
        ties_merge(base, [a], [1.0], density=0.0)


# -- the router ----------------------------------------------------------------------------------------------------
def hand_route(inputs, output, main_w, memories, thresholds, lasts, firsts):
    """Per row: each memory's mean over positions first..last of ‖a_t W'ᵀ − a_t Wᵀ‖, the best passing its threshold
    (the earlier on ties), written out with loops."""
    out = output.clone()
    choice = []
    for b in range(inputs.shape[0]):
        best, best_score = -1, None
        for m, w in enumerate(memories):
            dists = [float(torch.linalg.vector_norm(inputs[b, t] @ w.T - inputs[b, t] @ main_w.T))
                     for t in range(firsts[b], lasts[b] + 1)]
            score = sum(dists) / len(dists)
            if score >= thresholds[m] and (best_score is None or score > best_score):
                best, best_score = m, score
        choice.append(best)
        if best >= 0:
            out[b] = inputs[b] @ memories[best].T
    return out, choice


def test_the_router_picks_the_memory_a_hand_computation_picks():
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(4, 5, 6, generator=g, dtype=torch.float64)
    main_w = torch.randn(3, 6, generator=g, dtype=torch.float64)
    output = inputs @ main_w.T
    memories = [main_w + 0.5 * torch.randn(3, 6, generator=g, dtype=torch.float64) for _ in range(3)]
    memories[2] = main_w.clone()  # a memory equal to the main weight scores 0: never a candidate above 0
    lasts, firsts = [4, 2, 3, 4], [0, 0, 1, 2]
    stack = torch.stack(memories)
    for thresholds in ([0.5, 0.5, 0.5], [2.5, 0.1, 1e9], [1e9, 1e9, 1e9]):
        read = MemoryRead(torch.tensor(lasts), torch.tensor(firsts))
        got = route(inputs, output, read, stack, torch.tensor(thresholds), 7, False, None, None)
        want, choice = hand_route(inputs, output, main_w, memories, thresholds, lasts, firsts)
        assert torch.allclose(got, want, atol=1e-12)
        assert read.chosen[7].tolist() == choice
    # a decoding step (no positions) continues each row's last choice
    step_inputs = torch.randn(4, 1, 6, generator=g, dtype=torch.float64)
    read.positions = None
    read.chosen[7] = torch.tensor([1, -1, 0, 1])
    got = route(step_inputs, step_inputs @ main_w.T, read, stack, torch.tensor([0.0] * 3), 7, False, None, None)
    want = torch.stack([step_inputs[0] @ memories[1].T, step_inputs[1] @ main_w.T, step_inputs[2] @ memories[0].T,
                        step_inputs[3] @ memories[1].T])
    assert torch.allclose(got, want, atol=1e-12)


def test_margin_loss_matches_the_hinges_by_hand():
    hp = WiseHParams(alpha=5.0, beta=20.0, gamma=10.0)
    edits, irrelevant = torch.tensor([25.0, 12.0]), torch.tensor([7.0])
    # paper: every term averaged: max(0, 7-5) = 2; mean(max(0, 20-25), max(0, 20-12)) = 4;
    # gap γ - (Δe - Δi) = (10-18, 10-5) -> mean(0, 5) = 2.5
    assert float(margin_loss(edits, irrelevant, hp)) == pytest.approx(2 + 4 + 2.5)
    # reference: violated terms only: 2 + 8 + 5
    assert float(margin_loss(edits, irrelevant, hp.replace(convention="reference"))) == pytest.approx(2 + 8 + 5)


# -- on a model ----------------------------------------------------------------------------------------------------
def test_block_forward_equals_the_full_forward(tiny_bundles):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    batch = engine.prepare([("The Eiffel Tower is in", " Paris"), ("A cat sat on the", " mat today")])
    full = engine.batch_hidden(batch)
    for start in (0, 1, 3):
        assert torch.allclose(BlockForward(engine, batch, start).hidden(), full, atol=1e-5)



@pytest.mark.parametrize("layer", [1, -1])  # a block follows (from its input on), the last block (from the module)
def test_shard_training_equals_a_loop_of_full_forwards(tiny, layer):
    """W'_v trained by ``train_shard`` (each step only what W'_v can change) equals a plain loop: a full forward of
    the model per step with a hook putting W'_v in the module's place, the target NLL read from the logits, the
    activation scores written out as norms of output differences, SGD, the shard's mask and the clamp."""
    from editscope.edit.wise import module_path, train_shard

    engine = ScoringEngine(tiny)
    n_layers = engine.n_layers
    hp = wise_hparams(tiny, layers=[layer % n_layers], n_iter=3, lr=0.5)
    module = tiny.model.get_submodule(module_path(tiny, hp))
    rows = [("The Eiffel Tower is in", " Rome"), ("Tourists say the Eiffel Tower is in", " Rome city"),
            ("A cat sat on the", " mat")]
    n_edit = 2
    base = module.weight.detach()
    mask = (torch.rand(base.shape, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    shard = base.clone()
    got, got_score, got_loss, got_steps = train_shard(engine, module, hp.layers[0], rows, n_edit, shard, mask, hp)

    transposed = type(module).__name__ == "Conv1D"
    side = shard.clone().float().requires_grad_(True)
    optimiser = torch.optim.SGD([side], lr=hp.lr, weight_decay=hp.weight_decay)
    seen = {}

    def swap(_m, args, out):
        a = args[0]
        seen["main"], seen["side"] = out.detach(), (a @ side if transposed else a @ side.T)
        if getattr(module, "bias", None) is not None:
            seen["side"] = seen["side"] + module.bias
        return seen["side"].to(out.dtype)

    losses = []
    for _ in range(hp.n_iter):
        loss = 0.0
        all_scores = []
        for r, (prompt, target) in enumerate(rows):
            ctx, cont = engine.encode_pair(prompt, target)
            handle = module.register_forward_hook(swap)
            try:
                lp = tiny.model(torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
            finally:
                handle.remove()
            diff = (seen["side"] - seen["main"])[0, : len(ctx)].float()
            all_scores.append(diff.norm(dim=-1).mean())
            if r < n_edit:
                loss = loss - sum(lp[len(ctx) - 1 + j, t] for j, t in enumerate(cont)) / len(cont) / n_edit
        score = torch.stack(all_scores)
        loss = loss + margin_loss(score[:n_edit], score[n_edit:], hp)
        losses.append(float(loss.detach()))
        side.grad = torch.autograd.grad(loss, [side])[0] * mask
        optimiser.step()
        with torch.no_grad():
            side.copy_(torch.maximum(torch.minimum(side, base + hp.norm_constraint), base - hp.norm_constraint))
    assert got_steps == hp.n_iter and got_loss == pytest.approx(losses[-1], rel=1e-4, abs=1e-5)
    assert torch.allclose(got, side.detach(), atol=1e-5), float((got - side).abs().max())
    assert not torch.equal(got, base)  # it trained


def test_a_wise_edit_routes_as_the_hand_installed_side_weight_and_leaves_the_rest_bit_equal(tiny_bundles, request_a):
    """After one edit: a prompt whose score (computed by hand) reaches ε scores and answers exactly as the model with
    the side weight hand-installed; one below ε gives logits bit-equal to the unedited model; no weight changes."""
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    before = weights(bundle.model)
    prompts = [request_a.text, "A completely different sentence about", "The mother tongue of Danielle Darrieux is",
               "Paris is the capital of"]
    unedited = [engine.next_token_logprobs([p]) for p in prompts]
    editor = get_editor("wise")
    edit = editor.apply(bundle, request_a, wise_hparams(bundle), editor.new_state(), engine=engine)
    assert isinstance(edit, SideMemoryEdit) and edit.size == 1 and weights(bundle.model) == before
    module = bundle.model.get_submodule(edit.module)
    side, eps = edit.weights[0], float(edit.thresholds[0])
    edited = [engine.next_token_logprobs([p]) for p in prompts]
    answers = engine.answer(prompts, max_new_tokens=3)
    edit.revert(bundle)

    def installed(w):
        def hook(_m, args, _out):
            return args[0] @ w.to(args[0]).T
        return module.register_forward_hook(hook)

    routed = 0
    for p, base, got, answer in zip(prompts, unedited, edited, answers, strict=True):
        ids = engine.encode(p)
        seen: dict = {}
        handle = module.register_forward_hook(lambda _m, a, o, seen=seen: seen.update(a=a[0][0], o=o[0]))
        with torch.no_grad():
            bundle.model(torch.tensor([ids]))
        handle.remove()
        score = float(torch.stack([torch.linalg.vector_norm(seen["a"][t] @ side.T - seen["o"][t])
                                   for t in range(len(ids))]).mean())
        if score < eps:
            assert torch.equal(got, base), p
            continue
        routed += 1
        handle = installed(side)
        try:
            with torch.no_grad():
                want = bundle.model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
                greedy = list(ids)
                for _ in range(3):
                    greedy.append(int(bundle.model(torch.tensor([greedy])).logits[0, -1].argmax()))
        finally:
            handle.remove()
        assert torch.allclose(got[0], want, atol=1e-4), p
        assert answer == bundle.tokenizer.decode(greedy[len(ids):], skip_special_tokens=True).strip()
    assert 1 <= routed < len(prompts)  # the edited prompt reaches its memory, some other prompt does not
    assert weights(bundle.model) == before and not bundle.has_memory


def test_shards_are_saved_and_merged_on_schedule(tiny_bundles, request_a, request_b):
    """save_freq 2, merge_freq 4: shards saved after edits 2, 4, 6, 8, merged by TIES after 4 and 8 (the second
    merge joins the merged memory with weight 0.6); WISE-Retrieve keeps each merge as its own memory."""
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    editor = get_editor("wise")
    hp = wise_hparams(bundle, n_iter=2, save_freq=2, merge_freq=4)
    state = editor.new_state()
    seen = []
    for i in range(8):
        edit = editor.apply(bundle, [request_a, request_b][i % 2], hp, state, engine=engine)
        edit.release_superseded()  # as a lifelong chain does: one memory in force
        seen.append((state.count, len(state.saved), state.merged is not None, state.shard is not None, edit.labels))
    edit.revert(bundle)
    assert not bundle.has_memory
    assert [s[:4] for s in seen] == [(1, 0, False, True), (2, 1, False, False), (3, 1, False, True),
                                     (4, 0, True, False), (5, 0, True, True), (6, 1, True, False),
                                     (7, 1, True, True), (8, 0, True, False)]
    assert seen[2][4] == ("saved 0", "shard") and seen[4][4] == ("merged", "shard") and seen[7][4] == ("merged",)
    # the closed form `plan` counts agrees with the schedule carried out
    assert [hp.memories_after(count) for count, *_ in seen] == [(int(m), n, int(c)) for _, n, m, c, _ in seen]

    # the schedule on hand-made shards (edit k leaves W + 0.01·(k+1)·mask, score 10 − k): shard 0 ends at
    # W + 0.02·mask₀, shard 1 at W + 0.04·mask₁, and their merge is the hand-checked TIES of the two at weights 1/2
    base = bundle.model.get_submodule(edit.module).weight.detach().float()
    for retrieve in (False, True):
        hp_r = hp.replace(retrieve=retrieve)
        mem, masks = WiseMemory(), []
        for k in range(4):
            mem.begin(base, hp_r)
            masks.append(mem.mask)
            mem.record(base + 0.01 * (k + 1) * mem.mask, 10.0 - k, base, hp_r)
            held = (int(mem.merged is not None), len(mem.saved), int(mem.shard is not None))
            assert hp_r.memories_after(k + 1) == held
        assert torch.equal(masks[0], masks[1]) and torch.equal(masks[2], masks[3]) and not torch.equal(masks[0],
                                                                                                         masks[2])
        want = ties_merge(base, [base + 0.02 * masks[0], base + 0.04 * masks[2]], [0.5, 0.5], hp.density)
        assert mem.merges == 1 and mem.shard is None and mem.all_min == 7.0
        _, thresholds, names = mem.memories(hp_r)
        if retrieve:  # the merge is a memory of its own, with the least score of its shards
            assert mem.merged is None and names == ["saved 0"] and mem.saved_min == [7.0]
            assert thresholds == [pytest.approx(hp.act_ratio * 7.0)] and torch.equal(mem.saved[0], want)
        else:
            assert mem.saved == [] and names == ["merged"] and torch.equal(mem.merged, want)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"alpha": 20.0, "beta": 5.0}, "alpha < beta"),
    ({"save_freq": 3, "merge_freq": 4}, "must be a multiple of save_freq"),
    ({"layers": [9]}, r"layer 9 out of range 0\.\.3"),
    ({"convention": "mine"}, "key 'convention': must be one of paper, reference"),
    ({"mask_ratio": 0.0}, "key 'mask_ratio': must be in"),
])
def test_bad_wise_settings_are_one_line(tiny_bundles, overrides, message):
    with pytest.raises(EditscopeError, match=message):
        wise_hparams(tiny_bundles["llama"], **overrides)


def test_a_side_memory_for_another_shape_is_refused(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    editor = get_editor("wise")
    edit = editor.apply(bundle, request_a, wise_hparams(bundle), editor.new_state(), engine=ScoringEngine(bundle))
    edit.revert(bundle)
    other = SideMemoryEdit(method="wise", hparams=edit.hparams, fingerprint=edit.fingerprint, module=edit.module,
                           weights=torch.zeros(1, 2, 2), thresholds=torch.ones(1, dtype=torch.float64),
                           labels=("shard",))
    with pytest.raises(EditscopeError, match="do not fit"):
        other.apply(bundle)
    assert not bundle.has_memory
