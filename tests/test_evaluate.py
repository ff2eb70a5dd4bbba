"""``editscope.edit_and_evaluate``: EasyEdit's argument names, one call that edits and returns both protocols'
metrics. Values are checked against scores computed directly with the engine after the same edit made by hand."""

from __future__ import annotations

import pytest
import torch

import editscope
from editscope.data.records import EditRequest
from editscope.edit import EditRuntime, get_editor
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine

PROMPTS = ["Danielle Darrieux is a citizen of", "The mother tongue of {} is"]
SUBJECTS = ["Danielle Darrieux", "Thomas Joannes Stieltjes"]
NEW, TRUE = ["Japan", "English"], ["France", "Dutch"]
LOCALITY = {"neighborhood": {"prompt": ["Paris is the capital of", "Berlin is the capital of"],
                             "ground_truth": ["France", "Germany"]}}
PORTABILITY = {"one_hop": {"prompt": ["Danielle Darrieux speaks", "Thomas Joannes Stieltjes writes in"],
                           "ground_truth": ["Japanese", "English"]}}


def _weights(bundle) -> list[torch.Tensor]:
    return [p.detach().clone() for p in bundle.model.parameters()]


def test_metrics_equal_direct_scores_after_the_same_edit(tiny_bundles):
    bundle = tiny_bundles["llama"]
    hp = get_editor("rome").load_hparams(bundle).replace(v_steps=5)
    before = _weights(bundle)
    result = editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS, subject=SUBJECTS, target_new=NEW,
                                         ground_truth=TRUE, rephrase_prompts=["{} holds a passport of", None],
                                         locality_inputs=LOCALITY, portability_inputs=PORTABILITY, hparams=hp,
                                         wild_tokens=6)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(bundle), strict=True))  # restored (keep=False)
    assert len(result.metrics) == 2 and not any(p.applied for p in result.patches)

    # request 0 by hand: the same edit on the same model, then the engine's own scores
    engine = ScoringEngine(bundle)
    request = EditRequest("{} is a citizen of", SUBJECTS[0], NEW[0], TRUE[0])
    pre_new, pre_true = engine.score([(request.text, NEW[0]), (request.text, TRUE[0])])
    pre_loc = engine.score([("Paris is the capital of", "France")])[0]
    wild_prompts = [request.text, "Danielle Darrieux holds a passport of", *LOCALITY["neighborhood"]["prompt"][:1]]
    # few tokens: a random model's greedy text is full of near-ties, which batch shapes may flip after many tokens
    pre_answers = engine.answer(wild_prompts, max_new_tokens=6)
    patch = get_editor("rome").apply(bundle, request, hp, runtime=EditRuntime())
    try:
        post_answers = engine.answer(wild_prompts, max_new_tokens=6)
        new, true = engine.score([(request.text, NEW[0]), (request.text, TRUE[0])])
        para_new, para_true = engine.score([("Danielle Darrieux holds a passport of", w) for w in (NEW[0], TRUE[0])])
        port = engine.score([("Danielle Darrieux speaks", "Japanese")])[0]
        loc = engine.score([("Paris is the capital of", "France")])[0]
        loc_new = engine.score([("Paris is the capital of", NEW[0])])[0]
    finally:
        patch.revert(bundle)
    got = result.metrics[0]
    assert got["paper"]["ES"] == float(new.mean > true.mean) and got["paper"]["ES_pre"] == float(
        pre_new.mean > pre_true.mean)
    assert got["paper"]["PS"] == float(para_new.mean > para_true.mean)
    assert got["paper"]["NS"] == float(loc.mean > loc_new.mean)
    assert got["easyedit"]["Edit_Succ"] == pytest.approx(sum(new.token_is_argmax) / len(new.token_is_argmax))
    assert got["easyedit"]["Portability"] == pytest.approx(sum(port.token_is_argmax) / len(port.token_is_argmax))
    unchanged = [a == b for a, b in zip(pre_loc.token_argmax, loc.token_argmax, strict=True)]
    assert got["easyedit"]["Locality"] == pytest.approx(sum(unchanged) / len(unchanged))
    assert [(a["pre"], a["post"]) for a in got["wild_answers"]] == list(zip(pre_answers, post_answers, strict=True))
    assert got["wild"]["Efficacy"] == float(post_answers[0].lower() == NEW[0].lower())
    assert got["wild"]["Locality"] == float(post_answers[2].lower() == pre_answers[2].lower())
    assert "Rephrase" not in result.metrics[1]["easyedit"]  # request 1 has no rephrase prompt
    assert result.protocols["paper"]["name"] == "paper" and "token" in result.protocols["easyedit"]["note"]
    summary = result.summary()
    assert summary["paper"]["ES"] == pytest.approx((got["paper"]["ES"] + result.metrics[1]["paper"]["ES"]) / 2)


def test_plain_prompt_equals_template_and_keep_leaves_edits_applied(tiny_bundles):
    bundle = tiny_bundles["llama"]
    hp = get_editor("rome").load_hparams(bundle).replace(v_steps=3)
    plain = editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS[0], subject=SUBJECTS[0], target_new=NEW[0],
                                        hparams=hp)
    template = editscope.edit_and_evaluate(bundle, "rome", prompts="{} is a citizen of", subject=SUBJECTS[0],
                                           target_new=NEW[0], hparams=hp)
    assert plain.metrics[0]["easyedit"] == template.metrics[0]["easyedit"] and "paper" not in plain.metrics[0]
    before = _weights(bundle)
    kept = editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS, subject=SUBJECTS, target_new=NEW, hparams=hp,
                                       keep=True)
    try:
        assert all(p.applied for p in kept.patches) and len(kept.session.patches) == 2
        assert not all(torch.equal(a, b) for a, b in zip(before, _weights(bundle), strict=True))
    finally:
        kept.session.revert_all()
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(bundle), strict=True))


def test_keep_probes_each_request_right_after_its_own_edit(tiny_bundles):
    """keep=True: request i is scored on the model holding edits 0..i (not the last edit too), each edit made on the
    model the earlier ones left; checked against the same two ROME edits made by hand, scored after each."""
    bundle = tiny_bundles["llama"]
    hp = get_editor("rome").load_hparams(bundle).replace(v_steps=4)
    requests = [EditRequest("{} is a citizen of", SUBJECTS[0], NEW[0], TRUE[0]),
                EditRequest("The mother tongue of {} is", SUBJECTS[1], NEW[1], TRUE[1])]
    engine, runtime, patches, want = ScoringEngine(bundle), EditRuntime(), [], []
    try:
        for r in requests:
            patches.append(get_editor("rome").apply(bundle, r, hp, runtime=runtime, engine=engine))
            new, true = engine.score([(r.text, r.target_new), (r.text, r.target_true)])
            want.append((float(new.mean > true.mean), sum(new.token_is_argmax) / len(new.token_is_argmax)))
    finally:
        for patch in reversed(patches):
            patch.revert(bundle)
    kept = editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS, subject=SUBJECTS, target_new=NEW,
                                       ground_truth=TRUE, hparams=hp, keep=True, wild=False, progress=False)
    try:
        got = [(m["paper"]["ES"], m["easyedit"]["Edit_Succ"]) for m in kept.metrics]
    finally:
        kept.session.revert_all()
    assert got == [(a, pytest.approx(b)) for a, b in want]


def test_bad_input_is_a_one_line_error_naming_the_field(tiny_bundles):
    bundle = tiny_bundles["llama"]
    with pytest.raises(EditscopeError, match=r"prompts\[0\]: the subject 'Marie Curie' does not occur"):
        editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS[0], subject="Marie Curie", target_new="Japan")
    with pytest.raises(EditscopeError, match=r"target_new: 1 entries for 2 prompts"):
        editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS, subject=SUBJECTS, target_new=["Japan"])
    with pytest.raises(EditscopeError, match=r"locality_inputs\['x'\]: no entry 1"):
        editscope.edit_and_evaluate(bundle, "rome", prompts=PROMPTS, subject=SUBJECTS, target_new=NEW,
                                    locality_inputs={"x": {"prompt": ["a"], "ground_truth": ["b"]}})
