"""``chat_template: true`` in a run: the runner's engine wraps prompts (the rows' probes are the chat engine's
scores, not the plain ones), and the choice is recorded in every row's protocol, run.json and the config digest; a
tokenizer without a template is refused in one line before any work."""

from __future__ import annotations

import json

import pytest

from editscope.errors import EditscopeError
from editscope.lm.engine import ChatFormat, ScoringEngine
from editscope.lm.tiny import build_tiny
from editscope.run import Runner, parse_config, read_results

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def config(tmp_path, **extra):
    return parse_config({"model": "tiny-llama", "output": str(tmp_path / "run"), "methods": [
        {"name": "rome", "overrides": {"v_steps": 2}}], "dataset": "counterfact", "slice": {"limit": 2},
        "suites": ["counterfact"], **extra})


def test_chat_run_scores_wrapped_prompts_and_records_it(tmp_path):
    bundle = build_tiny("llama", seed=5)
    bundle.tokenizer.chat_template = CHATML
    cfg = config(tmp_path, chat_template=True)
    assert cfg.digest() != config(tmp_path).digest()  # part of what is computed
    assert "chat_template" not in config(tmp_path).to_dict()  # configs without it keep their digest
    Runner(cfg, bundle=bundle, progress=False, log=lambda _m: None).run()
    rows = read_results(tmp_path / "run" / "results.jsonl")
    digest = ChatFormat.of(bundle.tokenizer).digest
    chat, plain = ScoringEngine(bundle, chat_template=True), ScoringEngine(bundle)
    for row in rows:
        assert row["protocol"]["counterfact"]["chat_template"] == digest
        assert "chat template" in row["protocol"]["counterfact"]["note"]
        probe = row["pre"]["counterfact"]["prompts"][0]
        cand = probe["candidates"][0]
        want = chat.score([(probe["prompt"], cand["text"])])[0]
        assert cand["logprob_sum"] == pytest.approx(want.sum, abs=1e-4)
        assert abs(cand["logprob_sum"] - plain.score([(probe["prompt"], cand["text"])])[0].sum) > 1e-3
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["prompt_format"]["chat_template"] == digest and meta["config"]["chat_template"] is True


def test_tokenizer_without_template_is_refused_before_work(tiny_bundles, tmp_path):
    with pytest.raises(EditscopeError, match="has no chat template") as err:
        Runner(config(tmp_path, chat_template=True), bundle=tiny_bundles["gpt2"], progress=False,
               log=lambda _m: None).run()
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_chat_template_key_must_be_a_bool(tmp_path):
    with pytest.raises(EditscopeError, match="key 'chat_template': expected true or false"):
        config(tmp_path, chat_template="yes")


def test_the_card_of_a_chat_run_replays_its_prompt_format(tmp_path):
    """The edit card of a ``chat_template: true`` run wraps prompts as the run did, so its metrics are the row's;
    a model whose tokenizer lost the template is refused in one line (its numbers would silently differ)."""
    from editscope.run.inspect import compute_card, job_from_run
    from tests.suites.test_collateral import known_fact_file

    bundle = build_tiny("llama", seed=5)
    bundle.tokenizer.chat_template = CHATML
    Runner(config(tmp_path, chat_template=True), bundle=bundle, progress=False, log=lambda _m: None).run()
    row = read_results(tmp_path / "run" / "results.jsonl")[1]  # group 1: the runner's per-group seeds matter
    facts = [str(tmp_path / "facts.json")]  # facts the tiny model knows, for the card's collateral scan
    known_fact_file(tmp_path / "facts.json", ScoringEngine(bundle, chat_template=True))
    job = job_from_run(tmp_path / "run", row["case_id"], bundle=bundle, collateral_facts=12,
                       collateral_sources=facts)
    card = compute_card(job, generate_tokens=0, progress=False)
    assert card["suites"]["counterfact"]["metrics"] == row["metrics"]["counterfact"]
    assert card["suites"]["counterfact"]["protocol"] == row["protocol"]["counterfact"]
    bundle.tokenizer.chat_template = None
    with pytest.raises(EditscopeError, match="chat template|prompt format") as err:
        compute_card(job_from_run(tmp_path / "run", row["case_id"], bundle=bundle, collateral_facts=12,
                                  collateral_sources=facts), generate_tokens=0, progress=False)
    assert "\n" not in str(err.value)
