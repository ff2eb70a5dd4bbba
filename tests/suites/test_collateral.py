"""The collateral suite against plain forwards: the probe set is the first facts a plain forward says the model
answers top-1, and Flipped after a real ROME edit is the count of those a plain forward says it no longer
answers (the edited case's own fact left out)."""

from __future__ import annotations

import json

import pytest
import torch

from editscope.data.records import Case, EditRequest
from editscope.edit import get_editor
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.suites import SUITES
from editscope.suites.collateral import CollateralSuite

SUBJECTS = ["Danielle Darrieux", "Thomas Joannes Stieltjes", "Toko Yasuda", "Apple A5", "Edwin of Northumbria"]
TEMPLATES = ["{} works in the field of", "The mother tongue of {} is", "{} was born in"]


def known_fact_file(path, engine) -> list[dict]:
    """CounterFact-format records whose answer is the tiny model's own greedy next word (many are then 'known')."""
    records = []
    for subject in SUBJECTS:
        for template in TEMPLATES:
            prompt = template.format(subject)
            answer = engine.generate([prompt], max_new_tokens=1)[0].strip() or "x"
            records.append({"case_id": len(records), "prompt": prompt, "subject": subject, "target_new": "zebra",
                            "ground_truth": answer, "rephrase_prompt": prompt, "locality_prompt": prompt,
                            "locality_ground_truth": answer, "template": template})
    path.write_text(json.dumps(records))
    return records


def plain(bundle, engine, prompt: str, answer: str) -> tuple[bool, float]:
    """(every answer token is the argmax, summed log-prob) from one plain forward of prompt + " " + answer."""
    ctx = engine.encode(prompt)
    ids = engine.encode(prompt + " " + answer)
    with torch.no_grad():
        logp = bundle.model(torch.tensor([ids], device=bundle.device)).logits[0].double().log_softmax(-1)
    steps = range(len(ctx), len(ids))
    return (all(int(logp[i - 1].argmax()) == ids[i] for i in steps), float(sum(logp[i - 1, ids[i]] for i in steps)))


def test_flipped_equals_plain_forwards_around_a_rome_edit(tiny_bundles, tmp_path, private_home):
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    records = known_fact_file(tmp_path / "facts.json", engine)
    suite = CollateralSuite(facts=9, sources=[str(tmp_path / "facts.json")])
    known = [r for r in records if plain(bundle, engine, r["prompt"], r["ground_truth"])[0]][:9]
    assert len(known) >= 5
    chosen = suite.known(engine)
    assert [(f.prompt, f.answer) for f in chosen.facts] == [(r["prompt"], r["ground_truth"]) for r in known]
    for fact, lp in zip(chosen.facts, chosen.logprobs, strict=True):
        assert lp == pytest.approx(plain(bundle, engine, fact.prompt, fact.answer)[1], abs=1e-4)
    own = known[0]  # edit a fact of the probe set: it is excluded from the case's counts
    request = EditRequest(own["template"], own["subject"], "zebra", own["ground_truth"])
    case = Case("c0", "test", (request,))
    (pre,) = suite.probe_many(engine, [case])
    assert pre == {"n": len(known), "wrong": [], "excluded": [0]}
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle, None, {"v_steps": 8, "v_lr": 1.0})
    patch = editor.apply(bundle, request, hp, editor.new_state(), engine=engine)
    try:
        (post,) = suite.probe_many(engine, [case])
        after = [plain(bundle, engine, r["prompt"], r["ground_truth"])[0] for r in known]
    finally:
        patch.revert(bundle)
    flipped = sum(1 for i, ok in enumerate(after) if i != 0 and not ok)
    assert flipped >= 1  # the edit (same subject as some probe facts) does flip facts on this model
    row = suite.metrics(case, pre, post)
    assert row == {"Flipped": float(flipped), "FlippedShare": flipped / (len(known) - 1)}
    assert sorted(post["wrong"]) == [i for i, ok in enumerate(after) if not ok]
    # the unedited model again: the cached choice, no flips
    assert suite.metrics(case, pre, suite.probe_many(engine, [case])[0])["Flipped"] == 0.0


def test_declared_registered_and_bad_options(tmp_path):
    assert SUITES["collateral"] is CollateralSuite
    assert not CollateralSuite.chooses_edits
    spec = {s.name: s for s in CollateralSuite().metrics_declared}["Flipped"]
    assert spec.higher_is_better is False and spec.pairing == "post_only" and spec.unit == "count"
    with pytest.raises(EditscopeError, match="collateral suite: option facts must be an integer >= 1"):
        CollateralSuite(facts=0)
    with pytest.raises(EditscopeError, match="option sources must be a non-empty list"):
        CollateralSuite(sources="counterfact")
