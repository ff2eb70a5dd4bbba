"""The general suite (PPL, NTA, KnownFacts, GE of the whole model) against computations written out here: a plain
HF forward per paragraph, greedy generation, and a fact file whose answers the tiny model gives by construction."""

from __future__ import annotations

import json
import math

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.metrics.generation import generation_entropy
from editscope.suites.collateral import CollateralSuite
from editscope.suites.general import GeneralAbilitySuite
from editscope.suites.known_facts import FactPool

SUBJECTS = ["Danielle Darrieux", "Thomas Joannes Stieltjes", "Toko Yasuda", "Autonomous University of Madrid",
            "Apple A5", "Edwin of Northumbria"]


@pytest.fixture
def fact_file(tmp_path, tiny_bundles):
    """CounterFact-format records whose ground truth is the tiny model's own greedy next word: 'known' facts."""
    engine = ScoringEngine(tiny_bundles["llama"])
    records = []
    for i, subject in enumerate(SUBJECTS):
        prompt = f"{subject} works in the field of"
        answer = engine.generate([prompt], max_new_tokens=1)[0].strip() or "x"
        records.append({"case_id": i, "prompt": prompt, "subject": subject, "target_new": "zebra",
                        "ground_truth": answer, "rephrase_prompt": prompt, "locality_prompt": prompt,
                        "locality_ground_truth": answer})
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(records))
    return path


def _naive_text(bundle, engine, paragraphs):
    """Sum of token NLLs, token count and argmax hits of each paragraph scored from the start token."""
    nll = tokens = hits = 0
    for text in paragraphs:
        ids = [engine.start_id] + engine.encode(text)
        with torch.no_grad():
            logp = bundle.model(torch.tensor([ids], device=bundle.device)).logits[0, :-1].double().log_softmax(-1)
        target = torch.tensor(ids[1:], device=bundle.device)
        nll -= float(logp[torch.arange(len(target), device=bundle.device), target].sum())
        hits += int((logp.argmax(-1) == target).sum())
        tokens += len(target)
    return nll, tokens, hits


def _top1(bundle, engine, prompt: str, answer: str) -> bool:
    """Every answer token is the argmax of a plain forward of prompt + " " + answer."""
    ctx = engine.encode(prompt)
    ids = engine.encode(prompt + " " + answer)
    with torch.no_grad():
        pred = bundle.model(torch.tensor([ids], device=bundle.device)).logits[0].argmax(-1)
    return all(int(pred[i - 1]) == ids[i] for i in range(len(ctx), len(ids)))


def test_metrics_equal_a_plain_forward_and_hold_under_an_edit(tiny_bundles, fact_file):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    suite = GeneralAbilitySuite(text_tokens=300, row_tokens=80, facts=4, fact_pool=6, fact_dataset=str(fact_file),
                                generation_prompts=3, generation_tokens=8)
    from editscope.data import load_cases

    case = load_cases("counterfact", limit=1)[0]
    pre = suite.probe_many(engine, [case, case])
    assert pre[0] is pre[1]  # one measurement per model, shared by the cases
    assert suite.probe_many(engine, [case])[0] is pre[0]  # the same weights: reused, not recomputed
    nll, tokens, hits = _naive_text(bundle, engine, suite.text_slice(engine))
    assert 300 <= tokens <= 300 + 80
    assert pre[0]["text"]["tokens"] == tokens and pre[0]["text"]["argmax"] == hits
    assert pre[0]["text"]["nll_sum"] == pytest.approx(nll, rel=1e-4)
    known = [(r["prompt"], r["ground_truth"]) for r in json.loads(fact_file.read_text())
             if _top1(bundle, engine, r["prompt"], r["ground_truth"])]
    assert len(known) >= 2 and suite.known_facts(engine) == known[:4]  # the first (at most) 4 the model answers
    assert pre[0]["generation"] == engine.generate(suite.prompts(engine), max_new_tokens=8)

    patch = get_editor("rome").apply(bundle, EditRequest("{} works in the field of", SUBJECTS[0], "zebra"),
                                     get_editor("rome").load_hparams(bundle).replace(v_steps=5))
    try:
        post = suite.probe_many(engine, [case])[0]
        nll_post, _, hits_post = _naive_text(bundle, engine, suite.text_slice(engine))
    finally:
        patch.revert(bundle)
    row = suite.checked_metrics(case, pre[0], post)
    assert row["PPL_pre"] == pytest.approx(math.exp(nll / tokens), rel=1e-4)
    assert row["PPL_post"] == pytest.approx(math.exp(nll_post / tokens), rel=1e-4) and row["PPL_post"] != row["PPL_pre"]
    assert row["NTA_pre"] == hits / tokens and row["NTA_post"] == hits_post / tokens
    assert row["KnownFacts_pre"] == 1.0 and row["KnownFacts_post"] <= 1.0
    assert row["GE_pre"] == pytest.approx(generation_entropy(pre[0]["generation"]))


def test_probe_set_is_chosen_on_the_unedited_model_only(tiny_bundles, fact_file):
    bundle = tiny_bundles["llama"]
    suite = GeneralAbilitySuite(fact_dataset=str(fact_file), fact_pool=6)
    patch = get_editor("rome").apply(bundle, EditRequest("{} works in the field of", SUBJECTS[0], "zebra"),
                                     get_editor("rome").load_hparams(bundle).replace(v_steps=2))
    try:
        with pytest.raises(EditscopeError, match="chosen on the unedited model"):
            suite.known_facts(ScoringEngine(bundle))
    finally:
        patch.revert(bundle)
    chosen = suite.known_facts(ScoringEngine(bundle))
    assert chosen  # the fixture's facts are the tiny model's own answers
    # once chosen on the unedited model, another suite asking after an edit (its run took its pre-edit probes from
    # another run) reads that set back: the unedited model's, not one chosen on the edited weights
    patch.apply(bundle)
    try:
        again = GeneralAbilitySuite(fact_dataset=str(fact_file), fact_pool=6).known_facts(ScoringEngine(bundle))
    finally:
        patch.revert(bundle)
    assert again == chosen
    with pytest.raises(EditscopeError, match="text_tokens must be an integer >= 1"):
        GeneralAbilitySuite(text_tokens=0)


def test_a_fact_the_file_repeats_is_never_in_the_probe_set(tiny_bundles, fact_file, tmp_path):
    """CounterFact repeats some facts verbatim: a repeated prompt could be edited by a run of other records, so the
    probe set leaves it out."""
    records = json.loads(fact_file.read_text())
    engine = ScoringEngine(tiny_bundles["llama"])
    known = GeneralAbilitySuite(fact_dataset=str(fact_file), fact_pool=len(records), facts=50).known_facts(engine)
    first = next(r for r in records if (r["prompt"], r["ground_truth"]) in known)  # a fact the model knows
    path = tmp_path / "facts-dup.json"
    path.write_text(json.dumps(records + [dict(first, case_id=len(records))]))  # repeated at the end (the pool)
    chosen = GeneralAbilitySuite(fact_dataset=str(path), fact_pool=len(records) + 1, facts=50).known_facts(engine)
    assert chosen == [f for f in known if f[0] != first["prompt"]]


def test_one_fact_pool_policy_for_every_known_fact_set(tmp_path):
    """Both suites' sets come from a FactPool: the last ``tail`` records of each source, in source order, that have a
    true answer and a prompt no other record of the sources repeats (written out here record by record)."""
    def record(i, subject, truth):
        return {"case_id": i, "prompt": f"{subject} lives in", "subject": subject, "target_new": "Mars",
                "ground_truth": truth, "rephrase_prompt": f"{subject} lives in", "locality_prompt": "x",
                "locality_ground_truth": "y"}

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([record(0, "Ann", "Oslo"), record(1, "Bob", "Rome"), record(2, "Cid", "Lima")]))
    b.write_text(json.dumps([record(0, "Eve", "Kyiv"), record(1, "Bob", "Rome")]))  # Bob again, in another file
    got = [(f.prompt, f.answer, f.source) for f in FactPool((str(a), str(b))).facts()]
    assert got == [("Ann lives in", "Oslo", f"{a}:0"), ("Cid lives in", "Lima", f"{a}:2"),
                   ("Eve lives in", "Kyiv", f"{b}:0")]
    tail = [(f.prompt, f.source) for f in FactPool((str(a), str(b)), tail=1).facts()]
    assert tail == [("Cid lives in", f"{a}:2")]  # b's last record repeats Bob of a
    assert CollateralSuite(sources=(str(a), str(b))).pool == FactPool((str(a), str(b)))
    general = GeneralAbilitySuite(fact_dataset=str(a), fact_pool=2)
    assert general.pool == FactPool((str(a),), tail=2)
    assert [f.prompt for f in general.pool.facts()] == ["Bob lives in", "Cid lives in"]  # unique within its file


def test_a_long_scan_reports_inside_its_chunk(tiny_bundles, monkeypatch, tmp_path):
    """Choosing a known-fact set calls ``progress`` inside a chunk too (every PROGRESS_EVERY seconds; here always),
    with the scanned count rising to the pool's size, and chooses the same facts as a scan without progress."""
    from editscope.suites import known_facts as kf

    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "a"))
    monkeypatch.setattr(kf, "PROGRESS_EVERY", 0.0)
    engine = ScoringEngine(tiny_bundles["llama"], token_budget=64)  # several batches in one chunk
    pool = [kf.Fact(f"{s} works in the field of", " physics") for s in SUBJECTS] * 3
    pool = [kf.Fact(f"{f.prompt} {i}", f.answer) for i, f in enumerate(pool)]
    seen: list[tuple[int, int, int]] = []
    chosen = kf.choose_known(engine, pool, len(pool), "test rule", who="test", progress=lambda *a: seen.append(a))
    assert len(seen) >= 3 and [s for s, _, _ in seen] == sorted(s for s, _, _ in seen)
    assert seen[-1][:2] == (len(pool), len(pool)) and all(total == len(pool) for _, total, _ in seen)
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "b"))  # no cache: chosen again, silently
    quiet = kf.choose_known(engine, pool, len(pool), "test rule", who="test")
    assert quiet.facts == chosen.facts and quiet.logprobs == chosen.logprobs



def test_a_fresh_cache_reads_a_shipped_set_instead_of_scanning(tiny_bundles, monkeypatch, tmp_path):
    """Where the home cache has no set, one shipped under the same key (fingerprint and rule) is read and the pool
    is never scanned; under another key the scan runs; a set in the cache comes before a shipped one."""
    from editscope.suites import known_facts as kf

    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    engine = ScoringEngine(tiny_bundles["llama"])
    key = kf.set_key(engine.base_fingerprint, "test rule")
    ship = {"rule": "test rule", "facts": [["Ann lives in", "Oslo"]], "meta": [["Ann", "P1", "a:0", -1.5]],
            "pool": 9, "known_in_pool": 1, "scanned": 9}
    monkeypatch.setattr(kf, "shipped_set", lambda k: ship if k == key else None)

    def never() -> list:
        raise AssertionError("the pool was scanned")

    got = kf.choose_known(engine, never, 5, "test rule", who="test")
    assert [(f.prompt, f.answer, f.source) for f in got.facts] == [("Ann lives in", "Oslo", "a:0")]
    assert got.logprobs == [-1.5] and (got.scanned, got.pool) == (9, 9)
    scanned = kf.choose_known(engine, [kf.Fact("Bob lives in", "Rome")], 5, "other rule", who="test")
    assert scanned.pool == 1 and scanned.scanned == 1  # no shipped set under this key: scanned
    (tmp_path / "known_facts").mkdir(exist_ok=True)
    cached = dict(ship, facts=[["Cid lives in", "Lima"]], meta=[["Cid", "P1", "a:2", -0.5]])
    (tmp_path / "known_facts" / f"{key}.json").write_text(json.dumps(cached))
    assert [f.prompt for f in kf.choose_known(engine, never, 5, "test rule", who="test").facts] == ["Cid lives in"]


@pytest.mark.slow
def test_the_shipped_known_set_of_smollm2_is_the_one_a_scan_chooses(smollm2):
    """The set shipped for SmolLM2's default pool (read instead of a ~1 min scan on a fresh cache) is the set a scan
    chooses: found under the key of the model's fingerprint and the default rule, every fact answered top-1 (each
    answer token the argmax of a plain forward) with the recorded log-prob, in pool order, and none of a sample of
    the pool's other facts answered top-1."""
    from editscope.suites.known_facts import set_key, shipped_set

    engine = ScoringEngine(smollm2)
    suite = GeneralAbilitySuite()
    rule = suite.pool.rule(engine, suite.facts)
    shipped = shipped_set(set_key(engine.base_fingerprint, rule))
    assert shipped is not None, "no shipped set under SmolLM2's fingerprint and the default rule: re-copy the cache"
    assert shipped["rule"] == rule
    facts = suite.pool.facts()
    chosen = [tuple(f) for f in shipped["facts"]]
    assert shipped["pool"] == len(facts) and len(chosen) < suite.facts and shipped["scanned"] == len(facts)
    for (prompt, answer), meta in zip(chosen[::10], shipped["meta"][::10], strict=True):
        assert _top1(smollm2, engine, prompt, answer), prompt
        ctx, cont = engine.encode_pair(prompt, answer)
        with torch.no_grad():
            lp = smollm2.model(torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
        assert sum(float(lp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)) == pytest.approx(meta[3], abs=1e-3)
    assert all(all(s.token_is_argmax) for s in engine.score(chosen))
    order = {(f.prompt, f.answer): i for i, f in enumerate(facts)}
    assert [order[c] for c in chosen] == sorted(order[c] for c in chosen)
    others = [(f.prompt, f.answer) for f in facts if (f.prompt, f.answer) not in set(chosen)][::20]
    assert len(others) > 100 and not any(all(s.token_is_argmax) for s in engine.score(others))
