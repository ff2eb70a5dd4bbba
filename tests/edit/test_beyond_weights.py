"""Memory and context edits (GRACE; PROMPT, IKE, retrieval) behind the one intervention contract: each checked
against an independent computation — a hand-computed BM25, a hand-written IKE prompt, GRACE's Algorithm 1 worked by
hand, the model scored on the concatenated text or with a hand-installed hook — and for exact apply, revert, save and
load, with every base weight bit-equal throughout."""

from __future__ import annotations

import hashlib
import math
import warnings

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import EDITORS, get_editor
from editscope.edit.context_edit import ContextEdit, fact_text, render
from editscope.edit.grace import GraceCodebook
from editscope.edit.ike import IkeHParams, choose
from editscope.edit.intervention import load_intervention
from editscope.edit.memory import MemoryEdit, SearchKeys, nearest
from editscope.edit.retrievers import BM25, words
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine

NON_WEIGHT = sorted(n for n, e in EDITORS.items() if e.kind != "weights")
# the memories at block 0 of the 4-block tiny models: every later block runs on what they write
SMALL = {"ike": {"pool": "counterfact-train-sample", "k": 4}, "grace": {"n_iter": 5, "layers": [0]},
         "wise": {"n_iter": 5, "context_templates": [[5, 1]], "irrelevant_pool": "counterfact-train-sample",
                  "layers": [0]}}


def weights(model) -> dict[str, str]:
    return {n: hashlib.sha256(p.detach().cpu().numpy().tobytes()).hexdigest() for n, p in model.named_parameters()}


def hparams(method, bundle):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny models have no shipped GRACE/WISE layer: derived
        return get_editor(method).load_hparams(bundle, overrides=SMALL.get(method))


def test_the_new_editors_declare_their_kind():
    assert {n: EDITORS[n].kind for n in NON_WEIGHT} == {"grace": "memory", "ike": "context", "prompt": "context",
                                                          "retrieval": "context", "wise": "memory"}
    assert all(e.kind == "weights" for n, e in EDITORS.items() if n not in NON_WEIGHT)


# -- retrievers ---------------------------------------------------------------------------------------------------
def hand_bm25(docs: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> list[float]:
    """Okapi BM25 written out term by term (Robertson & Zaragoza 2009 eq. 3.5, Lucene's idf)."""
    n, avgdl = len(docs), sum(len(words(d)) for d in docs) / len(docs)
    out = []
    for d in docs:
        terms = words(d)
        total = 0.0
        for t in words(query):
            df = sum(t in words(x) for x in docs)
            f = terms.count(t)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            total += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(terms) / avgdl))
        out.append(total)
    return out


def test_bm25_matches_a_hand_computation_and_ranks_like_brute_force():
    docs = ["The capital of France is Rome.", "Toko Yasuda plays the piano.", "Paris is the capital of France.",
            "The piano is an instrument."]
    index = BM25(docs)
    query = "capital of France"
    want = hand_bm25(docs, query)
    assert index.scores(query) == pytest.approx(want, rel=1e-12)
    brute = sorted(range(len(docs)), key=lambda i: (-want[i], i))
    assert index.top_k(query, 2) == brute[:2] and index.top_k(query, 10) == brute
    assert index.top_k("piano", 1) == [1]  # the shorter document wins a tie in term frequency


def test_the_hidden_retriever_ranks_like_a_plain_cosine_over_mean_pooled_states(tiny_bundles):
    from editscope.edit.retrievers import HiddenStates, mean_hidden

    bundle = tiny_bundles["llama"]
    facts = ["The capital of France is Rome.", "Toko Yasuda plays the piano.", "Paris is in France.", "Cats purr."]
    query = "Where is Paris?"

    def plain(text):  # one text at a time, HF's own last hidden state (after the final norm), averaged
        ids = bundle.tokenizer(text, return_tensors="pt").input_ids
        with torch.no_grad():
            return bundle.model(ids, output_hidden_states=True).hidden_states[-1][0].double().mean(0)

    vectors = torch.stack([plain(f) for f in facts])
    q = plain(query)
    cos = [float(v @ q / (v.norm() * q.norm())) for v in vectors]
    want = sorted(range(len(facts)), key=lambda i: (-cos[i], i))
    got = HiddenStates(mean_hidden(bundle, facts), lambda texts: mean_hidden(bundle, texts))
    assert got.scores(query) == pytest.approx(cos, abs=1e-5)
    assert got.top_k(query, 4) == want and got.top_k(query, 2) == want[:2]


# -- the context layout -------------------------------------------------------------------------------------------
def test_ike_demonstrations_follow_the_hand_written_layout():
    """The three nearest pool records by a hand BM25 over the pool's facts, the record asking the edit's own prompt
    left out (the sample holds the edited fact's twin), typed copy, update, retain by rank and laid out nearest
    last, then the new fact and the prompt."""
    from editscope.data import load_cases

    request = EditRequest("{}, the", "Toko Yasuda", "piano", "guitar")
    hp = IkeHParams(k=3, mix=[1, 1, 1], pool="counterfact-train-sample")
    pool = [c for c in load_cases("counterfact-train-sample") if c.paraphrase_prompts and c.neighborhood]
    facts = [f"{c.requests[0].text} {c.requests[0].target_new}." for c in pool]
    scores = hand_bm25(facts, "Toko Yasuda, the piano.")
    ranked = [i for i in sorted(range(len(pool)), key=lambda i: (-scores[i], i))
              if pool[i].requests[0].text != "Toko Yasuda, the"][:3]
    assert any(c.requests[0].text == "Toko Yasuda, the" for c in pool)  # the twin is in the pool, and left out
    copy, update, retain = (pool[i] for i in ranked)
    want = [f"New Fact: {facts[ranked[2]]}\nPrompt: {retain.neighborhood[0][0]} {retain.neighborhood[0][1]}\n\n",
            f"New Fact: {facts[ranked[1]]}\nPrompt: {update.paraphrase_prompts[0]} {update.requests[0].target_new}\n\n",
            f"New Fact: {facts[ranked[0]]}\nPrompt: {copy.requests[0].text} {copy.requests[0].target_new}\n\n"]
    demos = choose([request], hp)
    assert list(demos) == want
    text = render("", demos, [fact_text(request)]) + "Toko Yasuda is incredible at"
    assert text == "".join(want) + "New Fact: Toko Yasuda, the piano.\nPrompt: Toko Yasuda is incredible at"


def test_ike_refuses_more_demonstrations_than_its_pool_holds():
    with pytest.raises(EditscopeError, match=r"ike: k = 1000 demonstrations asked, the pool counterfact-train-sample "
                                             r"holds \d+ usable records"):
        choose([EditRequest("{} is in", "Rome", "Italy")], IkeHParams(k=1000, pool="counterfact-train-sample"))


@pytest.mark.parametrize("method", ["prompt", "retrieval", "ike"])
def test_a_context_edit_scores_the_same_text_with_the_context_in_front(tiny_bundles, request_a, request_b, method):
    """Teacher-forced scores under the edit equal the unedited model's scores of the concatenated text; every base
    weight is bit-equal while it is in force and after."""
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    before = weights(bundle.model)
    editor = get_editor(method)
    state = editor.new_state()
    first = editor.apply(bundle, request_a, hparams(method, bundle), state, engine=engine)
    second = editor.apply(bundle, request_b, hparams(method, bundle), state, engine=engine)
    assert weights(bundle.model) == before and bundle.applied == (second,) and second.superseded is first
    prompt = request_b.text
    context = second.prefix(prompt)
    if method == "retrieval":  # k = 1: the fact BM25 ranks first for this prompt is its own
        assert context.endswith(f"New Fact: {fact_text(request_b)}\nPrompt: ")
        assert fact_text(request_a) not in context
    else:
        assert fact_text(request_a) in context and fact_text(request_b) in context
    got = engine.score([(prompt, request_b.target_new)])[0].token_logprobs
    second.revert(bundle)  # the first edit is back in force
    assert bundle.applied == (first,)
    first.revert(bundle)
    assert not bundle.applied and not bundle.contexts and weights(bundle.model) == before
    want = engine.score([(context + prompt, request_b.target_new)])[0].token_logprobs
    assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def test_a_context_edit_refuses_perturbed_prompt_embeddings(tiny_bundles, request_a):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    with _applied(bundle, "prompt", request_a, engine):
        ids = engine.encode(request_a.text)
        with pytest.raises(EditscopeError, match=r"context_embeds: a context edit \(prompt\) is in force"):
            engine.next_token_logprobs([request_a.text], context_embeds=[engine.embed(ids)])


class _applied:
    """Apply an edit for a block, revert after."""

    def __init__(self, bundle, method, request, engine):
        self.bundle, self.editor = bundle, get_editor(method)
        self.edit = self.editor.apply(bundle, request, hparams(method, bundle), self.editor.new_state(),
                                      engine=engine)

    def __enter__(self):
        return self.edit

    def __exit__(self, *exc):
        self.edit.revert(self.bundle)


# -- GRACE ----------------------------------------------------------------------------------------------------------
def test_grace_codebook_updates_follow_algorithm_1_by_hand():
    book = GraceCodebook()
    v = torch.zeros(2)
    assert book.place(torch.tensor([0.0, 0.0]), "Rome", 1.0, v) == (0, "new")
    # distance 1.5 <= radius 1.0 + eps_init 1.0, same label: the radius grows to cover it, no new entry
    assert book.place(torch.tensor([1.5, 0.0]), "Rome", 1.0, v) == (0, "expand")
    assert book.radii.tolist() == [1.5]
    # distance 2.0 <= 1.5 + 1.0, another label: split: the old radius d/2 - 1e-5, the new one d/2 (reference code)
    assert book.place(torch.tensor([0.0, 2.0]), "Paris", 1.0, v) == (1, "split")
    assert book.radii.tolist() == [1.0 - 1e-5, 1.0] and book.labels == ("Rome", "Paris")
    # far from every key (distance 10 > 1 + 1): a new entry with the initial radius
    assert book.place(torch.tensor([10.0, 0.0]), "Paris", 1.0, v) == (2, "new")
    assert book.radii.tolist() == [1.0 - 1e-5, 1.0, 1.0] and book.keys.tolist() == [[0, 0], [0, 2], [10, 0]]


def test_nearest_key_equals_a_brute_force_search():
    torch.manual_seed(0)
    keys = torch.randn(300, 16) * 5
    keys[200] = keys[50]  # a tie: the earlier key wins
    queries = torch.cat([torch.randn(20, 16) * 5, keys[[7, 50, 123]]])
    for searched in (keys, SearchKeys.of(keys)):
        dist, index = nearest(queries, searched)
        for q, d, j in zip(queries.tolist(), dist.tolist(), index.tolist(), strict=True):
            brute = [math.dist(q, k) for k in keys.tolist()]
            best = min(range(len(brute)), key=lambda i: (brute[i], i))
            assert j == best and d == pytest.approx(brute[best], abs=1e-9)
        assert index[-3:].tolist() == [7, 50, 123] and dist[-3:].tolist() == [0.0, 0.0, 0.0]


def test_grace_codebook_rows_held_earlier_never_change_when_forks_append():
    # keys 100 apart, radius 1: every placement is a new entry; entry i holds key i and value i
    keys = torch.arange(200, dtype=torch.float32)[:, None] * torch.tensor([100.0, 0.0])
    book = GraceCodebook()
    for i in range(100):  # past the first room of 64 rows: a doubling on the way
        book.place(keys[i], f"y{i}", 1.0, torch.full((3,), float(i)))
    held, _ = book.state_dict()
    snapshot = {name: t.clone() for name, t in held.items()}
    a, b = book.fork(), book.fork()
    a.place(keys[150], "a", 1.0, torch.full((3,), -1.0))
    b.place(keys[160], "b", 1.0, torch.full((3,), -2.0))  # must not write over a's row 100
    book.place(keys[170], "c", 1.0, torch.full((3,), -3.0))
    for name, t in held.items():
        assert torch.equal(t, snapshot[name]), name
    # each codebook is what concatenating its rows one by one gives
    for twin, extra, value, label in ((a, 150, -1.0, "a"), (b, 160, -2.0, "b"), (book, 170, -3.0, "c")):
        assert torch.equal(twin.keys, torch.cat([keys[:100], keys[extra][None]]))
        assert torch.equal(twin.values, torch.cat([torch.arange(100.0)[:, None].expand(100, 3),
                                                   torch.full((1, 3), value)]))
        assert twin.radii.tolist() == [1.0] * 101 and twin.labels[-1] == label
        # the search keys grown row by row (and handed to the codebook's memory) are its keys' in float64
        grown = twin.search_keys()
        assert torch.equal(grown.keys, twin.keys.double())
        assert torch.equal(grown.norms, torch.tensor([sum(x * x for x in k) for k in twin.keys.double().tolist()],
                                                     dtype=torch.float64))
        # the next placement searches the keys it holds: key 150 is new to b and c, an expand on a
        assert twin.place(keys[150] + torch.tensor([0.5, 0.0]), "a", 1.0, torch.zeros(3))[1] == \
            ("expand" if twin is a else "new")


def test_a_memory_refuses_search_keys_of_other_keys():
    keys = torch.randn(4, 8)
    common = dict(method="grace", hparams={}, fingerprint="f", module="m", values=torch.zeros(4, 3),
                  radii=torch.ones(4, dtype=torch.float64), labels=("a", "b", "c", "d"))
    assert MemoryEdit(keys=keys, search_keys=SearchKeys.of(keys), **common).size == 4
    with pytest.raises(EditscopeError, match=r"grace memory: search keys of shape \(3, 8\) for keys of shape \(4, 8\)"):
        MemoryEdit(keys=keys, search_keys=SearchKeys.of(keys[:3]), **common)


def test_grace_refuses_a_radius_that_is_not_positive_and_a_layer_the_model_lacks(tiny_bundles):
    bundle = tiny_bundles["llama"]
    with pytest.raises(EditscopeError, match=r"--set eps_init=0.*key .eps_init.: must be in .*, got 0.0"):
        get_editor("grace").load_hparams(bundle, overrides={"eps_init": 0.0, "layers": [1]})
    with pytest.raises(EditscopeError, match=r"layer 9 out of range 0\.\.3"):
        get_editor("grace").load_hparams(bundle, overrides={"layers": [9]})
    with pytest.raises(EditscopeError, match="key 'retriever': unknown retriever 'tfidf'"):
        get_editor("retrieval").load_hparams(bundle, overrides={"retriever": "tfidf"})


@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_grace_governs_the_answer_and_leaves_other_queries_bit_equal(tiny_bundles, request_a, convention):
    """A prompt whose query is outside every radius gives logits bit-equal to the unedited model's; the edited
    prompt's teacher-forced target equals a hand-installed hook writing the entry's value from the prompt's last token
    on, and the generated answer continues under it."""
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    other = ["A completely different sentence about", "Paris"]
    before_other = engine.next_token_logprobs(other)
    before = weights(bundle.model)
    editor = get_editor("grace")
    hp = hparams("grace", bundle).replace(convention=convention)
    memory = editor.apply(bundle, request_a, hp, editor.new_state(), engine=engine)
    assert isinstance(memory, MemoryEdit) and memory.size == 1 and weights(bundle.model) == before
    assert memory.replacement == {"paper": "answer", "reference": "prompt"}[convention]
    answers = engine.answer([request_a.text], max_new_tokens=4)
    assert torch.equal(engine.next_token_logprobs(other), before_other)
    got = engine.score([(request_a.text, request_a.target_new)])[0].token_logprobs
    memory.revert(bundle)
    ctx, cont = engine.encode_pair(request_a.text, request_a.target_new)
    module = bundle.model.get_submodule(memory.module)
    query = len(ctx) - 1

    span = slice(query, None) if convention == "paper" else slice(0, query)

    def write(_m, _a, out):
        out = out.clone()
        out[:, span] = memory.values[0].to(out)
        return out

    handle = module.register_forward_hook(write)
    try:
        with torch.no_grad():
            logits = bundle.model(torch.tensor([ctx + cont])).logits[0].float()
    finally:
        handle.remove()
    lp = logits.log_softmax(-1)
    want = [float(lp[query + j, t]) for j, t in enumerate(cont)]
    assert got == pytest.approx(want, abs=1e-4)
    # the generated answer: a plain greedy loop over full forwards with the same hook
    ids = list(ctx)
    handle = module.register_forward_hook(write)
    try:
        with torch.no_grad():
            for _ in range(4):
                ids.append(int(bundle.model(torch.tensor([ids])).logits[0, -1].argmax()))
    finally:
        handle.remove()
    assert answers == [bundle.tokenizer.decode(ids[len(ctx):], skip_special_tokens=True).strip()]
    assert weights(bundle.model) == before and not bundle.has_memory


def loop_value(bundle, module, request, start, hp):
    """GRACE's value training written plainly: Adam over full forwards of the model, one request, a hand-installed
    hook writing the value (from the query token on, or before it), stopping before a step once the loss (mean NLL
    per target token) is below ``stop_loss``. (value, per-step losses, steps)."""
    engine = ScoringEngine(bundle)
    ctx, cont = engine.encode_pair(request.text, request.target_new)
    query = len(ctx) - 1
    span = slice(query, None) if hp.where == "answer" else slice(0, query)
    value = start.detach().clone().float().requires_grad_(True)
    optimiser = torch.optim.Adam([value], lr=hp.lr)

    def write(_m, _a, out):
        out = out.clone()
        out[:, span] = value.to(out)
        return out

    losses, steps = [], 0
    handle = module.register_forward_hook(write)
    try:
        for steps in range(1, hp.n_iter + 1):  # noqa: B007
            optimiser.zero_grad()
            lp = bundle.model(torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
            loss = -sum(lp[query + j, t] for j, t in enumerate(cont)) / len(cont)
            losses.append(float(loss.detach()))
            if losses[-1] < hp.stop_loss:
                break
            value.grad = torch.autograd.grad(loss, [value])[0]
            optimiser.step()
    finally:
        handle.remove()
    return value.detach(), losses, steps


def warm_start(engine, module, hp, request):
    with torch.no_grad():  # the projection's own output at the prompt's last token
        key = engine.hidden_states([request.text], hp.layers, kind="mlp_key")[0, 0]
        return module.forward(key[None].to(module.weight.dtype))[0]


@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_grace_value_training_equals_a_loop_of_full_forwards(tiny, request_a, convention):
    """GRACE trains its value running only the blocks from its layer (under ``paper`` only the positions from the
    query token on) and the head at the answer's positions; a plain Adam loop over full forwards of the model, with a
    hand-installed hook writing the value, gives the same losses, step count and value."""
    from editscope.edit.grace import module_path, train_value

    engine = ScoringEngine(tiny)
    hp = hparams("grace", tiny).replace(n_iter=4, lr=0.1, stop_loss=0.0, convention=convention)
    module = tiny.model.get_submodule(module_path(tiny, hp))
    start = warm_start(engine, module, hp, request_a)
    got, got_loss, got_steps = train_value(engine, module, hp.layers[0], request_a, start, hp)
    value, losses, steps = loop_value(tiny, module, request_a, start, hp)
    assert got_steps == steps == hp.n_iter and got_loss == pytest.approx(losses[-1], rel=1e-4, abs=1e-5)
    assert torch.allclose(got, value, atol=1e-4), float((got - value).abs().max())
    assert losses[-1] < losses[0]  # the loop trains: the value moved the answer


@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_grace_trains_a_batch_of_values_as_each_alone(tiny_bundles, request_a, request_b, convention):
    """Several values trained together (one batch, rows leaving it as they stop) equal each trained alone by the
    plain loop: values, final losses and step counts, with rows stopping at different steps."""
    from editscope.edit.grace import module_path, train_values

    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    third = EditRequest("{} works in the field of", "Alan Turing", "cooking", "mathematics")
    requests = [request_a, request_b, third]
    hp = hparams("grace", bundle).replace(n_iter=8, lr=0.2, stop_loss=0.0, convention=convention)
    module = bundle.model.get_submodule(module_path(bundle, hp))
    starts = torch.stack([warm_start(engine, module, hp, r) for r in requests])
    # a stopping loss the first request reaches at its 4th step (midway between its 3rd and 4th losses), the others
    # at their own step (or never)
    first = loop_value(bundle, module, request_a, starts[0], hp)[1]
    hp = hp.replace(stop_loss=(first[2] + first[3]) / 2)
    want = [loop_value(bundle, module, r, s, hp) for r, s in zip(requests, starts, strict=True)]
    assert want[0][2] == 4 and len({w[2] for w in want}) > 1, [w[2] for w in want]
    values, losses, steps = train_values(engine, module, hp.layers[0], requests, starts, hp)
    assert steps == [w[2] for w in want]
    assert losses == pytest.approx([w[1][-1] for w in want], rel=1e-4, abs=1e-5)
    for got, (value, _, _) in zip(values, want, strict=True):
        assert torch.allclose(got, value, atol=1e-4), float((got - value).abs().max())


def test_grace_waves_hold_each_entry_s_requests_in_order():
    from editscope.edit.grace import _waves

    # entries of requests 0..5: entry 0 trained by 0, 2, 4; entry 1 by 1, 5; entry 2 by 3
    assert _waves([0, 1, 0, 2, 0, 1]) == [[0, 1, 3], [2, 5], [4]]
    assert _waves([]) == [] and _waves([3, 4]) == [[0, 1]]


def test_grace_batch_edit_equals_editing_one_request_after_another(tiny_bundles, request_a, request_b):
    """One batch holding an expand (the same fact twice: the second training starts from the first's value) equals
    the codebook that editing the requests one call at a time leaves."""
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    editor = get_editor("grace")
    hp = hparams("grace", bundle).replace(n_iter=5, lr=0.2)
    requests = [request_a, request_b, request_a]
    _, batched = editor.compute_edit(bundle, requests, hp, editor.new_state(), engine=engine)
    one_by_one = editor.new_state()
    for r in requests:
        _, one_by_one = editor.compute_edit(bundle, [r], hp, one_by_one, engine=engine)
    assert batched.labels == one_by_one.labels and batched.size == one_by_one.size < len(requests)
    # a batch's keys come from one forward of its prompts: equal to one forward each to float rounding
    assert torch.allclose(batched.keys, one_by_one.keys, rtol=0, atol=1e-5)
    assert torch.allclose(batched.radii, one_by_one.radii, rtol=0, atol=1e-5)
    assert torch.allclose(batched.values, one_by_one.values, atol=1e-4)


# -- files and kinds through the contract -------------------------------------------------------------------------
@pytest.mark.parametrize("method", NON_WEIGHT)
def test_each_kind_saves_loads_and_reapplies_exactly(tiny_bundles, request_a, method, tmp_path):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    before = weights(bundle.model)
    base_scores = engine.next_token_logprobs([request_a.text])
    editor = get_editor(method)
    edit = editor.apply(bundle, request_a, hparams(method, bundle), editor.new_state(), engine=engine)
    edited = engine.next_token_logprobs([request_a.text])
    assert not torch.equal(edited, base_scores)  # the edit acts on the model
    path = edit.save(tmp_path / "edit.safetensors")
    edit.revert(bundle)
    assert torch.equal(engine.next_token_logprobs([request_a.text]), base_scores)
    loaded = load_intervention(path)
    assert type(loaded) is type(edit) and loaded.kind == editor.kind and loaded.digest == edit.digest
    loaded.apply(bundle)
    assert torch.equal(engine.next_token_logprobs([request_a.text]), edited)
    loaded.revert(bundle)
    assert weights(bundle.model) == before and not bundle.applied
    # a byte changed in the file is refused, naming it
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(EditscopeError, match=str(path)):
        load_intervention(path)


def test_a_context_edit_is_refused_on_another_model(tiny_bundles, request_a):
    edit = get_editor("prompt").compute_patch(tiny_bundles["llama"], request_a)
    assert isinstance(edit, ContextEdit)
    with pytest.raises(EditscopeError, match="was made for model tiny-llama"):
        edit.apply(tiny_bundles["gpt2"])
