"""The quick check after an edit with derived hyperparameters, against a hand computation: known facts and their
flips read off plain forwards of the model, degenerate continuations off transformers' own greedy generate; and the
CLI prints it (and records it in --json) only when the hparams were derived."""

from __future__ import annotations

import json

import pytest
import torch

from editscope.cli import main
from editscope.edit.quick_check import DISTINCT, NEW_TOKENS, PROMPTS, QuickCheck, _facts, distinct_share
from editscope.lm.engine import ScoringEngine


def test_distinct_share_by_hand():
    assert distinct_share([5, 5, 5, 5]) == 0.25 and distinct_share([1, 2, 3, 1]) == 0.75 and distinct_share([]) == 1


def _hand(bundle, hook=None):
    """(the top-1 next token after each pool prompt, whether each neutral greedy continuation is degenerate), by
    plain forwards and ``model.generate``."""
    tok, model = bundle.tokenizer, bundle.model
    handle = model.get_submodule("model.layers.10.mlp").register_forward_hook(hook) if hook else None
    try:
        with torch.no_grad():
            top = [int(model(torch.tensor([tok(p)["input_ids"]])).logits[0, -1].argmax()) for p, _ in _facts(
                "counterfact-train-sample", 32)]
            degenerate = []
            for p in PROMPTS:
                ids = torch.tensor([tok(p)["input_ids"]])
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                     do_sample=False, pad_token_id=tok.pad_token_id or 0)
                text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
                degenerate.append(distinct_share(tok(text, add_special_tokens=False)["input_ids"]) < DISTINCT)
    finally:
        if handle is not None:
            handle.remove()
    return top, degenerate


@pytest.mark.slow
def test_quick_check_counts_flipped_facts_and_degenerate_generations_as_by_hand(smollm2):
    engine = ScoringEngine(smollm2)
    check = QuickCheck()
    check.before(engine)
    facts = _facts("counterfact-train-sample", 32)
    firsts = [engine.encode_pair(p, a)[1][0] for p, a in facts]
    top_before, degenerate_before = _hand(smollm2)
    known = [i for i, (t, f) in enumerate(zip(top_before, firsts, strict=True)) if t == f]
    assert [p for p, _ in check.known] == [facts[i][0] for i in known] and len(known) >= 3

    def damage(_m, _a, out):  # a blunt edit: block 10's MLP output scaled up
        return out * 8.0

    handle = smollm2.model.get_submodule("model.layers.10.mlp").register_forward_hook(damage)
    try:
        check.after(engine)
    finally:
        handle.remove()
    top_after, degenerate_after = _hand(smollm2, damage)
    assert check.flipped == sum(top_after[i] != top_before[i] for i in known) and check.flipped >= 1
    assert check.turned_degenerate == sum(a and not b for a, b in zip(degenerate_after, degenerate_before,
                                                                       strict=True))
    assert f"{check.flipped} of the {len(known)} known facts" in check.line("rome", "smollm2-135m")


def test_the_cli_checks_an_edit_only_when_its_hparams_were_derived(capsys):
    base = ["edit", "--model", "tiny-llama", "--prompt", "{} is a citizen of", "--subject", "Danielle Darrieux",
            "--target", "Japan", "--no-progress", "--json"]
    assert main([*base, "--method", "grace", "--set", "n_iter=3"]) == 0  # no shipped GRACE file for tiny-llama
    out, err = capsys.readouterr()
    assert json.loads(out)["quick_check"] == {"pool": "counterfact-train-sample", "scanned": 32, "known_facts": 0,
                                              "flipped": 0, "generations": 3, "turned_degenerate": 0}
    assert "derived hparams: a quick check after the edit" in err and "editscope tune --method grace" in err
    assert main([*base, "--method", "rome"]) == 0  # shipped tiny-llama hparams: nothing to check
    out, err = capsys.readouterr()
    assert "quick_check" not in json.loads(out) and "quick check" not in err
