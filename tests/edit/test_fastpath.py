"""The suffix-only v*/z forward (lm.partial_forward, the edit runtime's ``fast`` forward) against the full forward it
replaces (tiny models)."""

from __future__ import annotations

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.context import context_templates
from editscope.edit.objective import FORWARDS, EssenceKL, build_context, setup_terms
from editscope.edit.runtime import EditRuntime, RuntimeSettings
from editscope.lm.engine import ScoringEngine
from editscope.lm.full_forward import FullForward
from editscope.lm.partial_forward import SuffixForward, lanes_of, start_block
from tests.conftest import TINY_MODELS

FAMILIES = TINY_MODELS  # every family's tiny model, and Llama 3's rope scaling


def _context(bundle, request, hook_point: str):
    engine = ScoringEngine(bundle)
    templates = context_templates(engine, [[5, 3]], 0)
    return engine, build_context(engine, request, templates, hook_point)


def _read(ctx) -> torch.Tensor:
    """[B, T] True at the positions the objective reads up to: <= ctx.last_read[r] (what step.hidden holds)."""
    device = ctx.batch.input_ids.device
    cols = torch.arange(ctx.batch.input_ids.shape[1], device=device)
    return cols[None, :] <= torch.tensor(ctx.last_read, device=device)[:, None]


def _both(ctx, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden, d loss / dδ) on the fast path and on the full forward, for a loss reading every position up to
    each row's last read one."""
    out = []
    read = _read(ctx)
    for path in ("fast", "plain"):
        ctx.forward = FORWARDS[path]
        ctx.release()
        d = delta.clone().requires_grad_(True)
        hidden = ctx.run(ctx.batch, ctx.subject_positions, d)
        weights = torch.linspace(-1, 1, hidden.shape[-1], device=hidden.device)
        loss = ((hidden * weights).sum(-1) * read).sum()
        loss.backward()
        out += [hidden.detach(), d.grad]
    ctx.forward = FORWARDS["fast"]
    ctx.release()
    ctx.main_forward()
    return tuple(out)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["mlp_out", "resid_post"])
@pytest.mark.parametrize("layer", [0, 1])
def test_suffix_forward_equals_full_forward(tiny_bundles, request_a, family, kind, layer):
    bundle = tiny_bundles[family]
    engine, ctx = _context(bundle, request_a, f"blocks.{layer}.{kind}")
    assert min(ctx.subject_positions) > 0  # a real prefix to reuse
    delta = torch.randn(ctx.v_init.shape[0], generator=torch.Generator().manual_seed(1)).to(bundle.device)
    delta = delta * ctx.v_init.norm()
    fast, fast_grad, full, full_grad = _both(ctx, delta.float())
    read = _read(ctx)
    assert isinstance(ctx._main, SuffixForward)
    # blocks run per step: from L (δ inside block L) or L + 1 (δ after block L)
    assert ctx._main.start == layer + (kind == "resid_post")
    assert (fast[read] - full[read]).abs().max() <= 1e-5 * full[read].abs().max()
    assert (fast_grad - full_grad).norm() <= 1e-5 * full_grad.norm()
    # δ does act: the states after the subject differ from the unedited ones, those before do not
    base = engine.batch_hidden(ctx.batch).detach()
    row, p, end = 0, ctx.subject_positions[0], ctx.last_read[0] + 1
    assert torch.equal(fast[row, :p], base[row, :p])
    assert (fast[row, p:end] - base[row, p:end]).abs().max() > 1e-3
    # after the last read position nothing is computed: the unedited states
    real = ctx.batch.attention_mask.bool()
    assert torch.equal(fast[real & ~read], ctx.unedited_hidden()[real & ~read])
    assert (real & ~read).any()


def test_last_read_positions(tiny_bundles, request_a):
    """Rewrite rows end at the last target token's predecessor, the essence row at its prompt's end."""
    engine, ctx = _context(tiny_bundles["llama"], request_a, "blocks.1.mlp_out")
    b = ctx.batch
    for r in range(b.input_ids.shape[0]):
        if r < ctx.n_rewrite:
            assert ctx.last_read[r] == b.context_lengths[r] + b.continuation_lengths[r] - 2
        else:
            assert ctx.last_read[r] == b.context_lengths[r] - 1
    # the suffix forward's width: the longest read suffix, not the longest row
    fast = SuffixForward.build(engine, b, ctx.subject_positions, ctx.hook_point, ctx.last_read)
    assert fast.ids.shape[1] == max(e - p + 1 for e, p in zip(ctx.last_read, ctx.subject_positions, strict=True))


def test_essence_setup_reuses_the_unedited_forward(tiny_bundles, request_a):
    """EssenceKL's pre-edit distribution comes from the fast path's unedited forward (no second forward) and
    equals a plain unedited forward's."""
    engine, ctx = _context(tiny_bundles["llama"], request_a, "blocks.1.mlp_out")
    term = EssenceKL(at="next")
    calls = []
    handle = engine.model.get_submodule(engine.arch.base).register_forward_hook(lambda *a: calls.append(1))
    try:
        setup_terms(ctx, [term])
        ctx.run(ctx.batch, ctx.subject_positions, torch.zeros(ctx.v_init.shape[0], device=engine.bundle.device))
    finally:
        handle.remove()
    assert len(calls) == 2  # the unedited forward (cache + setup) and one step
    hidden = engine.batch_hidden(ctx.batch).detach()
    rows = ctx.essence_rows
    want = engine.logits_from_hidden(hidden[rows, [ctx.batch.context_lengths[r] - 1 for r in rows]]).log_softmax(-1)
    assert (ctx.store[term.name] - want).abs().max() <= 1e-5


def test_other_batches_take_the_full_forward(tiny_bundles, request_a):
    """A plug-in's ``ctx.run`` of another batch (APP's other answers) is the plain hooked forward."""
    engine, ctx = _context(tiny_bundles["llama"], request_a, "blocks.1.mlp_out")
    other = engine.prepare([("Danielle Darrieux speaks", " French"), ("Danielle Darrieux lives in", " Paris")])
    pos = [3, 3]
    delta = torch.ones(ctx.v_init.shape[0], device=engine.bundle.device)
    got = ctx.run(other, pos, delta)
    ctx.forward = FORWARDS["plain"]
    want = ctx.run(other, pos, delta)
    assert torch.equal(got, want)
    assert ctx._main is None  # never built for a batch other than the main one


def test_rows_beyond_the_sliding_window_take_the_full_forward(tiny_bundles):
    bundle = tiny_bundles["gemma3"]
    window = bundle.arch.sliding_window(bundle.model.config)
    long_prompt = "Once upon a time " * (window // 3) + "{} speaks"
    request = EditRequest(long_prompt, "Danielle Darrieux", "English", "French")
    engine, ctx = _context(bundle, request, "blocks.1.mlp_out")
    assert int(ctx.batch.attention_mask.sum(-1).max()) > window
    assert SuffixForward.build(engine, ctx.batch, ctx.subject_positions, ctx.hook_point) is None
    delta = torch.randn(ctx.v_init.shape[0], generator=torch.Generator().manual_seed(2)).to(bundle.device)
    fast, _, full, _ = _both(ctx, delta)
    assert isinstance(ctx._main, FullForward) and torch.equal(fast, full)


def test_start_block():
    assert start_block("blocks.3.mlp_out", 6) == (3, False)
    assert start_block("blocks.3.resid_post", 6) == (4, True)
    assert start_block("blocks.5.resid_post", 6) == (5, False)  # the last block: δ by its output hook
    assert start_block("blocks.3.resid_pre", 6) == (3, True)
    assert start_block("embed", 6) is None


def _patch(bundle, method: str, request, path: str, **changes):
    editor = get_editor(method)
    hp = editor.load_hparams(bundle).replace(**changes)
    return editor.compute_patch(bundle, request, hp, runtime=EditRuntime(RuntimeSettings(forward=path)))


#: end to end on the first four families and on the new ones whose blocks differ most (a window and soft-capping,
#: a parallel residual, layers without rotary embeddings); the forwards themselves are compared on every family above
@pytest.mark.parametrize("method,family", [("rome", f) for f in ("llama", "gpt2", "gptj", "gemma3", "gemma2",
                                                                 "gpt_neox", "smollm3")]
                         + [("memit", f) for f in ("llama", "gpt2", "gptj")])
def test_edit_equals_full_forward_path(tiny_bundles, request_a, method, family):
    """Same ΔW as every step's full forward to 1e-5 relative, and as the reference cost structure (full
    logits: the vocabulary-wide head rounds differently, 1e-5 after a few Adam steps) to 1e-4."""
    bundle = tiny_bundles[family]
    changes = {"v_steps": 8}
    fast = _patch(bundle, method, request_a, "fast", **changes)
    for path, tol in (("full", 1e-5), ("plain", 1e-4)):
        other = _patch(bundle, method, request_a, path, **changes)
        assert fast.deltas.keys() == other.deltas.keys()
        for name, d in other.deltas.items():
            assert d.norm() > 0
            assert (fast.deltas[name] - d).norm() <= tol * d.norm(), (path, name)


def _brute_force_lanes(counts: list[int], overhead: int) -> int:
    """The least Σ (rows × widest + overhead) over every partition of the rows into lanes (any subsets, not only
    runs of the sorted lengths): the optimum :func:`lanes_of` must reach."""
    best = None

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for part in partitions(rest):
            yield [[first], *part]
            for i in range(len(part)):
                yield [*part[:i], [first, *part[i]], *part[i + 1:]]

    for part in partitions(list(range(len(counts)))):
        cost = sum(len(lane) * max(counts[r] for r in lane) + overhead for lane in part)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("overhead", [0, 3, 10, 1000])
def test_lanes_reach_the_least_padded_cost(overhead):
    rng = torch.Generator().manual_seed(overhead)
    for _ in range(20):
        counts = torch.randint(1, 9, (7,), generator=rng).tolist()
        lanes = lanes_of(counts, overhead)
        assert sorted(r for lane in lanes for r in lane) == list(range(len(counts)))  # every row once
        cost = sum(len(lane) * max(counts[r] for r in lane) + overhead for lane in lanes)
        assert cost == _brute_force_lanes(counts, overhead)
    # by hand: two short rows and two long ones; one lane pads the short rows to 6 (24 tokens), two lanes cost
    # 2·2 + 2·6 = 16 tokens plus one more call
    assert lanes_of([2, 6, 2, 6], overhead=5) == [[0, 2], [1, 3]]
    assert lanes_of([2, 6, 2, 6], overhead=9) == [[0, 2, 1, 3]]


def test_lanes_of_a_batched_group_equal_the_full_forward(tiny_bundles):
    """Three requests' rows in one suffix forward cut into several lanes, with one δ per row: the states and each δ's
    gradient equal the full forward's, also after :meth:`SuffixForward.select` drops a request."""
    from editscope.edit.objective.optimise import concat_batches

    requests = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
                EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch"),
                EditRequest("{} plays the", "Toko Yasuda", "piano", "guitar")]
    engine = ScoringEngine(tiny_bundles["llama"])
    templates = context_templates(engine, [[5, 3]], 0)
    ctxs = [build_context(engine, r, templates, "blocks.1.resid_post") for r in requests]
    batch = concat_batches([c.batch for c in ctxs], engine.pad_id)
    positions = [p for c in ctxs for p in c.subject_positions]
    last = [e for c in ctxs for e in c.last_read]
    fast = SuffixForward(engine, batch, positions, "blocks.1.resid_post", last, lane_overhead=0)
    assert len(fast.lanes) > 1 and len({lane.ids.shape[1] for lane in fast.lanes}) > 1
    assert sum(lane.ids.numel() for lane in fast.lanes) < fast.ids.numel()  # less padding than one lane
    full = FullForward(engine, batch, positions, "blocks.1.resid_post")
    device = engine.bundle.device
    cols = torch.arange(batch.input_ids.shape[1], device=device)
    weights = torch.linspace(-1, 1, engine.model.config.hidden_size, device=device)

    def check(fwd, ref, ends):
        read = cols[None, :] <= torch.tensor(ends, device=device)[:, None]
        out = []
        for f in (fwd, ref):
            d = (torch.randn(len(ends), weights.shape[0], generator=torch.Generator().manual_seed(3)).to(device)
                 * 0.5).requires_grad_(True)
            hidden = f.hidden(d)
            ((hidden * weights).sum(-1) * read).sum().backward()
            out.append((hidden.detach()[read], d.grad))
        (h, g), (h_ref, g_ref) = out
        assert (h - h_ref).abs().max() <= 1e-5 * h_ref.abs().max()
        assert (g - g_ref).norm() <= 1e-5 * g_ref.norm()

    check(fast, full, last)
    keep = [r for r in range(len(positions)) if r >= len(ctxs[0].subject_positions)]  # the first request stopped
    check(fast.select(keep), full.select(keep), [last[r] for r in keep])
