"""The scoring engine against a naive computation: one unbatched forward per pair, plain transformers."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from editscope.edit.patch import Patch, tensor_checksum
from editscope.errors import EditscopeError
from editscope.lm.bundle import patched_fingerprint
from editscope.lm.engine import ScoreRequest, ScoringEngine
from editscope.lm.scorer import Scorer

CONTEXTS = ["The capital of France is", "The Eiffel Tower is located in ", "Q: Who wrote Hamlet? A:"]
CONTINUATIONS = ["Paris", " London", "the city of Rome", "William Shakespeare, the English poet", "a"]


def naive_logprobs(bundle, context: str, continuation: str) -> list[float]:
    """Reference: apply the boundary rule by hand, encode the whole string, split at the context length,
    one forward of the whole row, read each continuation token from the full logits."""
    tok = bundle.tokenizer
    if context.endswith(" "):
        context, continuation = context[:-1], " " + continuation
    elif not continuation.startswith(" "):
        continuation = " " + continuation
    ctx = tok(context)["input_ids"]
    whole = tok(context + continuation)["input_ids"]
    cont = whole[len(ctx):]
    with torch.no_grad():
        logits = bundle.model(torch.tensor([whole], device=bundle.device)).logits[0].double()
    lp = logits.log_softmax(-1)
    return [float(lp[len(ctx) - 1 + j, cont[j]]) for j in range(len(cont))]


def pairs():
    return [(c, w) for c in CONTEXTS for w in CONTINUATIONS]


@pytest.mark.parametrize("side", ["right", "left"])
def test_engine_equals_naive(tiny, side):
    engine = ScoringEngine(tiny, padding_side=side, token_budget=96)  # small budget: several batches
    scores = engine.score(pairs())
    lengths = set()
    for (ctx, cont), score in zip(pairs(), scores, strict=True):
        ref = naive_logprobs(tiny, ctx, cont)
        lengths.add(len(ref))
        assert score.n_tokens == len(ref)
        np.testing.assert_allclose(score.token_logprobs, ref, atol=1e-4)
        assert score.sum == pytest.approx(sum(ref), abs=1e-4)
        assert score.mean == pytest.approx(sum(ref) / len(ref), abs=1e-4)
    assert {1, 2}.issubset(lengths) and max(lengths) >= 5  # 1..5+ token continuations covered


def test_left_and_right_padding_agree(tiny):
    right = ScoringEngine(tiny, padding_side="right").score(pairs())
    left = ScoringEngine(tiny, padding_side="left").score(pairs())
    for a, b in zip(right, left, strict=True):
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=1e-5)


def test_argmax_flags_match_naive(tiny):
    engine = ScoringEngine(tiny)
    ctx, cont = CONTEXTS[0], CONTINUATIONS[3]
    score = engine.score([(ctx, cont)])[0]
    ids_ctx, ids_cont = engine.encode_pair(ctx, cont)
    with torch.no_grad():
        logits = tiny.model(torch.tensor([ids_ctx + ids_cont], device=tiny.device)).logits[0]
    expected = [int(logits[len(ids_ctx) - 1 + j].argmax()) == ids_cont[j] for j in range(len(ids_cont))]
    assert list(score.token_is_argmax) == expected


def test_boundary_rule_moves_trailing_space(tiny):
    engine = ScoringEngine(tiny)
    a = engine.score([("The capital of France is ", "Paris")])[0]
    b = engine.score([("The capital of France is", " Paris")])[0]
    c = engine.score([("The capital of France is", "Paris")])[0]
    assert a.token_ids == b.token_ids == c.token_ids
    assert a.sum == pytest.approx(b.sum, abs=1e-6) and b.sum == pytest.approx(c.sum, abs=1e-6)


def test_inputs_embeds_path_equals_token_path(tiny):
    engine = ScoringEngine(tiny)
    reqs = [(c, w) for c in CONTEXTS[:2] for w in CONTINUATIONS[:3]]
    plain = engine.score(reqs)
    embedded = engine.score([
        ScoreRequest(c, w, engine.embed(engine.encode_pair(c, w)[0])) for c, w in reqs
    ])
    for a, b in zip(plain, embedded, strict=True):
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=1e-5)
    # Perturbed embeddings must change the numbers (the path is really used).
    ids = engine.encode_pair(*reqs[0])[0]
    noise = torch.randn(len(ids), tiny.hidden_size, generator=torch.Generator().manual_seed(0)).to(tiny.device)
    noisy = engine.embed(ids) + 0.5 * noise
    moved = engine.score([ScoreRequest(*reqs[0], noisy)])[0]
    assert abs(moved.sum - plain[0].sum) > 1e-3


def test_next_token_logprobs_equal_naive(tiny):
    engine = ScoringEngine(tiny)
    lp = engine.next_token_logprobs(CONTEXTS)
    for i, ctx in enumerate(CONTEXTS):
        with torch.no_grad():
            ref = tiny.model(torch.tensor([engine.encode(ctx)], device=tiny.device)).logits[0, -1].log_softmax(-1)
        torch.testing.assert_close(lp[i].cpu(), ref.cpu(), atol=1e-4, rtol=0)
    values, indices = engine.next_token_logprobs(CONTEXTS, top_k=5)
    torch.testing.assert_close(values, lp.topk(5).values)
    embeds = [engine.embed(c) for c in CONTEXTS]
    torch.testing.assert_close(engine.next_token_logprobs(CONTEXTS, context_embeds=embeds), lp, atol=1e-5, rtol=0)


def test_hidden_states_equal_output_hidden_states(tiny):
    engine = ScoringEngine(tiny)
    layers = [0, tiny.n_layers - 2]
    states = engine.hidden_states(CONTEXTS, layers)
    keys = engine.hidden_states(CONTEXTS, [1], kind="mlp_key", positions=[0, -2, 1])
    for i, ctx in enumerate(CONTEXTS):
        ids = torch.tensor([engine.encode(ctx)], device=tiny.device)
        with torch.no_grad():
            hs = tiny.model(ids, output_hidden_states=True).hidden_states
        for j, layer in enumerate(layers):  # hidden_states[l + 1] is the output of block l (not the last)
            # relative too: Gemma's residual stream is scaled by sqrt(hidden), so padded-batch fp32 rounding
            # reaches 1.3e-5 absolute at 2.6e-6 relative (seen with 2 threads)
            torch.testing.assert_close(states[i, j].cpu(), hs[layer + 1][0, -1].cpu(), atol=1e-5, rtol=1e-5)
        # mlp_key: read the down projection's input with a plain torch hook (not editscope's).
        seen: dict[str, torch.Tensor] = {}

        def record(_module, args, store=seen):
            store["k"] = args[0].detach()

        handle = tiny.arch.layer_module(tiny.model, 1, "mlp_out").register_forward_pre_hook(record)
        try:
            with torch.no_grad():
                tiny.model(ids)
        finally:
            handle.remove()
        pos = [0, -2, 1][i]
        # rtol: a GPU picks float32 kernels by batch shape (2.4e-6 absolute at 2.9e-6 relative on an H200, Gemma)
        torch.testing.assert_close(keys[i, 0].cpu(), seen["k"][0, pos].cpu(), atol=1e-6, rtol=1e-5)


def test_greedy_generation_equals_argmax_loop(tiny):
    engine = ScoringEngine(tiny)
    out = engine.generate(CONTEXTS[:2], max_new_tokens=4)
    for ctx, text in zip(CONTEXTS[:2], out, strict=True):
        ids = engine.encode(ctx)
        for _ in range(4):
            with torch.no_grad():
                ids.append(int(tiny.model(torch.tensor([ids], device=tiny.device)).logits[0, -1].argmax()))
        assert text == tiny.tokenizer.decode(ids[len(engine.encode(ctx)):], skip_special_tokens=True)
    a = engine.generate(CONTEXTS[:1], max_new_tokens=6, top_k=20, seed=3)
    b = engine.generate(CONTEXTS[:1], max_new_tokens=6, top_k=20, seed=3)
    assert a == b


def test_bfloat16_generation_gives_its_head_contiguous_rows_and_equals_an_argmax_loop():
    """transformers hands the LM head the prompt's last position as a strided view; a bfloat16 CPU matmul with such
    an input converts the whole head to float32 first (a transient of ~10 B a head parameter). The engine's
    generate hands it a contiguous copy: every input the head sees is contiguous, and the greedy tokens still
    equal a plain argmax loop of full forwards (each forward's last position read as a contiguous row)."""
    from editscope.lm import load

    bundle = load("tiny-llama", device="cpu", dtype="bfloat16")
    engine = ScoringEngine(bundle)
    seen = []
    spy = engine.model.get_output_embeddings().register_forward_hook(  # the input as the head got it
        lambda _m, args, _out: seen.append(args[0].is_contiguous()))
    try:
        out = engine.generate(CONTEXTS[:2], max_new_tokens=4)
    finally:
        spy.remove()
    assert seen and all(seen)
    head = engine.model.get_output_embeddings()
    for ctx, text in zip(CONTEXTS[:2], out, strict=True):
        ids = engine.encode(ctx)
        for _ in range(4):
            with torch.no_grad():
                hidden = engine.model.model(torch.tensor([ids])).last_hidden_state[:, -1:].contiguous()
                ids.append(int(head(hidden)[0, -1].argmax()))
        assert text == bundle.tokenizer.decode(ids[len(engine.encode(ctx)):], skip_special_tokens=True)


@pytest.mark.parametrize("seed", [0, 3])
def test_top_k_sampling_equals_transformers_sampling(tiny, seed):
    """Top-k draws are made on the host (editscope.lm.sampling), so that a GPU samples what the CPU does: on any
    device they must be transformers' own top-k sampling of the model on the CPU after torch.manual_seed: the same
    tokens. They come from a generator of the call's own: torch's default generator is left where it was."""
    engine = ScoringEngine(tiny)
    on_host = tiny.model if next(tiny.model.parameters()).device.type == "cpu" else copy.deepcopy(tiny.model).cpu()
    for ctx in CONTEXTS[:2]:
        torch.manual_seed(1234)
        got = engine.generate([ctx], max_new_tokens=8, top_k=5, seed=seed)[0]
        after_got = torch.rand(4)
        torch.manual_seed(1234)
        untouched = torch.rand(4)
        ids = torch.tensor([engine.encode(ctx)])
        torch.manual_seed(seed)
        with torch.no_grad():
            out = on_host.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=True,
                                      top_k=5, top_p=1.0, temperature=1.0, pad_token_id=engine.pad_id)
        assert got == tiny.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        assert torch.equal(after_got, untouched)


def test_differentiable_batch_logprobs_equal_score(tiny):
    engine = ScoringEngine(tiny)
    reqs = pairs()[:6]
    batch = engine.prepare(reqs)
    token_lp = engine.batch_logprobs(batch)
    sums = token_lp.sum(-1)
    for s, ref in zip(sums, engine.score(reqs), strict=True):
        assert float(s) == pytest.approx(ref.sum, abs=1e-4)


@pytest.mark.parametrize("ctx,cont", [("   ", "Paris"), ("", ""), ("The capital is", ""), ("The capital is", " ")])
def test_empty_input_is_a_clear_error(tiny_bundles, ctx, cont):
    engine = ScoringEngine(tiny_bundles["gpt2"])
    with pytest.raises(EditscopeError, match="empty"):
        engine.score([(ctx, cont)])


def test_duplicate_requests_are_scored_once_and_returned_in_order(tiny):
    engine = ScoringEngine(tiny)
    reqs = [("The capital of France is", "Paris"), ("Hello", "world"), ("The capital of France is", "Paris")]
    scores = engine.score(reqs)
    assert [s.continuation for s in scores] == ["Paris", "world", "Paris"]
    np.testing.assert_array_equal(scores[0].token_logprobs, scores[2].token_logprobs)
    np.testing.assert_allclose(scores[1].token_logprobs, naive_logprobs(tiny, "Hello", "world"), atol=1e-4)


SHARED_PREFIXES = ["New York", "New York City", "New Jersey", "New", "Newcastle upon Tyne", "Old York"]


@pytest.mark.parametrize("max_row_tokens", [512, 9])
def test_shared_continuation_prefixes_equal_naive(tiny, max_row_tokens):
    """Continuations sharing token prefixes share tree nodes; a tiny row cap splits the tree over rows."""
    engine = ScoringEngine(tiny, max_row_tokens=max_row_tokens)
    reqs = [(ctx, cont) for ctx in CONTEXTS[:2] for cont in SHARED_PREFIXES]
    for (ctx, cont), score in zip(reqs, engine.score(reqs), strict=True):
        np.testing.assert_allclose(score.token_logprobs, naive_logprobs(tiny, ctx, cont), atol=1e-4)


def test_prefix_tree_computes_each_shared_prefix_once(tiny_bundles):
    from editscope.lm.engine import _Encoded, _TreeRow

    engine = ScoringEngine(tiny_bundles["llama"])
    row = _TreeRow(tuple(engine.encode("The city of")), None)
    conts = [tuple(engine.encode_pair("The city of", c)[1]) for c in SHARED_PREFIXES]
    for i, cont in enumerate(conts):
        row.add(_Encoded(i, row.ctx_ids, cont, None))
    expected = {cont[:j] for cont in conts for j in range(1, len(cont))}  # naive: every distinct fed prefix
    assert row.n_nodes == len(expected)
    mask = row.mask()
    c = len(row.ctx_ids)
    for k, depth in enumerate(row.node_depth):  # a node sees the whole context plus exactly its own prefix
        assert mask[c + k, :c].all() and mask[c + k, c:].sum() == depth


def test_empty_context_is_scored_from_the_start_token(tiny):
    """Reference: a plain forward of [start] + the text's tokens, start = BOS else EOS (GPT-2's <|endoftext|>)."""
    engine = ScoringEngine(tiny)
    tok = tiny.tokenizer
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    texts = ["some sentence", "The Eiffel Tower is in Paris.", "Paris"]
    scores = engine.score([("", t) for t in texts] + [("The capital of France is", "Paris")])
    for text, score in zip(texts, scores, strict=False):
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            lp = tiny.model(torch.tensor([[start] + ids], device=tiny.device)).logits[0].double().log_softmax(-1)
        ref = [float(lp[j, ids[j]]) for j in range(len(ids))]
        assert score.token_ids == ids  # no space added: the text starts a document
        np.testing.assert_allclose(score.token_logprobs, ref, atol=1e-4)
        assert np.isfinite(score.token_logprobs).all() and (score.token_logprobs <= 0).all()
    # the unconditional next-token distribution agrees with the first scored token
    first = engine.next_token_logprobs([""])[0]
    assert float(first[tok("Paris")["input_ids"][0]]) == pytest.approx(scores[2].token_logprobs[0], abs=1e-4)


def test_engine_implements_the_scorer_protocol(tiny_bundles):
    assert isinstance(ScoringEngine(tiny_bundles["gpt2"]), Scorer)


def test_scorer_fingerprint_follows_the_weights_and_prompt_format_the_chat_template(tiny_bundles):
    bundle = copy.deepcopy(tiny_bundles["llama"])
    engine = ScoringEngine(bundle)
    loaded = bundle.base_fingerprint
    assert engine.fingerprint == engine.base_fingerprint == loaded and engine.prompt_format is None
    name = bundle.arch.weight_name(1)
    weight = dict(bundle.model.named_parameters())[name]
    delta = torch.zeros_like(weight)
    delta[0, 0] = 0.5
    patch = Patch(deltas={name: delta}, method="manual", hparams={}, fingerprint=loaded,
                  checksums={name: tensor_checksum(weight)})
    patch.apply(bundle)
    try:  # the weights changed: the fingerprint a score cache keys on changes with them, the loaded one does not
        assert engine.fingerprint == patched_fingerprint(loaded, [patch.digest]) != loaded
        assert engine.base_fingerprint == loaded
    finally:
        patch.revert(bundle)
    assert engine.fingerprint == loaded


def test_hidden_states_kind_comes_from_the_hook_point_map(tiny_bundles):
    engine = ScoringEngine(tiny_bundles["llama"])
    heads = engine.hidden_states(["The capital of France is"], [0, 2], kind="attn_heads")
    assert heads.shape == (1, 2, 4, 16)
    with pytest.raises(EditscopeError, match="resid_pre.*not 'bogus'"):
        engine.hidden_states(["The capital"], [0], kind="bogus")


def test_progress_counts_every_request_once_and_changes_no_score(tiny):
    """``score(..., progress=)``: called after each batched forward with the requests scored so far (a duplicated
    pair counts each time it was asked), ending at all of them; the scores are bit-equal to a call without it."""
    asked = pairs() + pairs()[:3]  # three duplicates, computed once
    engine = ScoringEngine(tiny, token_budget=8)  # one context row per batch: three batches
    calls: list[int] = []
    scores = engine.score(asked, progress=calls.append)
    assert len(calls) >= 3 and calls == sorted(calls) and calls[-1] == len(asked)
    assert len(set(calls)) == len(calls)  # each batch adds requests
    plain = engine.score(asked)
    assert [list(s.token_logprobs) for s in scores] == [list(s.token_logprobs) for s in plain]


DEMOS = "New Fact: The capital of Spain is Lisbon\nPrompt: The capital of Spain is Lisbon\n\n"


class _Demonstrations:
    """A context edit as IKE's: the same demonstrations before every prompt, then a fact of the prompt's first word
    (one prompt gets other text, so not every context opens the same way)."""

    method = "demos"

    def prefix(self, prompt: str) -> str:
        if prompt.startswith("Q:"):
            return "Unrelated text comes first here. "
        return DEMOS + f"New Fact: {prompt.split()[0]} is new\nPrompt: "


def _forwarded_tokens(engine, requests, head_rows: list | None = None) -> tuple[int, list]:
    seen = []
    handle = engine.base_module.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"].numel()), with_kwargs=True)
    head = engine.model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: head_rows.append(args[0].shape[0]) if head_rows is not None else None)
    try:
        scores = engine.score(requests)
    finally:
        handle.remove()
        head.remove()
    return sum(seen), scores


@pytest.mark.parametrize("max_row_tokens", [32, 5])
def test_prompts_opening_with_one_context_share_its_forward_and_equal_naive(tiny, max_row_tokens, monkeypatch):
    """Reference: one plain forward of (context edit's text + prompt + continuation) per request. With sharing the
    demonstrations are forwarded once for all prompts that open with them, so far fewer tokens go through the model."""
    reqs = [(ctx, cont) for ctx in CONTEXTS for cont in SHARED_PREFIXES[:4]]
    monkeypatch.setattr(ScoringEngine, "share_prefix_min", 16)  # short texts: the tiny Gemmas' window is 64 tokens
    options = dict(max_row_tokens=max_row_tokens, token_budget=32)  # one row per forward: no padding counted
    edit = _Demonstrations()
    tiny.add_context(edit)
    try:
        shared_reads, plain_reads = [], []
        shared_tokens, shared = _forwarded_tokens(ScoringEngine(tiny, **options), reqs, shared_reads)
        plain_tokens, plain = _forwarded_tokens(
            ScoringEngine(tiny, share_prefix=False, **options), reqs, plain_reads)
        # one context opens the other: the shorter one's whole context is the row's prefix, read at its end
        nested = [("The capital of France is", "Paris"), ("The capital of France", "is Paris")]
        for (ctx, cont), score in zip(nested, ScoringEngine(tiny, **options).score(nested), strict=True):
            np.testing.assert_allclose(score.token_logprobs, naive_logprobs(tiny, edit.prefix(ctx) + ctx, cont),
                                       atol=1e-4)
    finally:
        tiny.remove_context(edit)
    demo_tokens = len(tiny.tokenizer(DEMOS)["input_ids"])
    assert demo_tokens >= ScoringEngine.share_prefix_min
    for (ctx, cont), score, separate in zip(reqs, shared, plain, strict=True):
        ref = naive_logprobs(tiny, edit.prefix(ctx) + ctx, cont)
        np.testing.assert_allclose(score.token_logprobs, ref, atol=1e-4)
        np.testing.assert_allclose(score.token_logprobs, separate.token_logprobs, atol=1e-5)
        assert list(score.token_is_argmax) == list(separate.token_is_argmax)
    if max_row_tokens == 32:  # two prompts open with the demonstrations: they are forwarded once, not twice
        assert plain_tokens - shared_tokens >= demo_tokens
    # the head reads only where a continuation token is read: a shared row's context tokens (the fact, the prompt)
    # are forwarded but not read, so it reads no more than the plain rows, whose contexts are never nodes
    assert 0 < sum(shared_reads) <= sum(plain_reads) < sum(len(tiny.tokenizer(c)["input_ids"]) for c, _ in reqs)
