"""The judge model of the wild suite (``judge: model:NAME``): its verdict against a plain HF forward of the fixed
prompt, its one-line errors, and a run whose wild metrics equal the judge applied by hand, on a fresh unedited copy
of the model, to the answers the rows stored (the model under edit never judges itself)."""

from __future__ import annotations

import pytest
import torch

from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.metrics.answers import JUDGES, judge_answer
from editscope.run import Runner, parse_config, read_results
from editscope.suites.model_judge import ModelJudge, ensure_model_judge
from editscope.suites.wild import WildSuite

NAME = "model:tiny-llama"


@pytest.fixture
def registered():
    yield
    for name in [n for n in JUDGES if n.startswith(("model:", "mirage:"))]:
        del JUDGES[name]


def _plain_logprob(bundle, context: str, continuation: str) -> float:
    """Sum of log P(continuation tokens | context) from one plain forward (the continuation's tokens are those of
    the joint encoding past the context's own)."""
    tok, model = bundle.tokenizer, bundle.model
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    ids = tok(context + continuation, add_special_tokens=False)["input_ids"]
    assert ids[:len(ctx)] == ctx
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    return float(sum(logits[p - 1, ids[p]] for p in range(len(ctx), len(ids))))


def test_the_verdict_is_the_yes_no_comparison_of_a_plain_forward(tiny_bundles):
    bundle = tiny_bundles["llama"]
    judge = ModelJudge("tiny-llama", scorer=ScoringEngine(bundle))
    for prediction in ("Paris", "the city of Rome", "Japan", "no idea"):
        question, golds = "What is the capital of France?", ["Paris", "Paris, France"]
        yes, no = judge.verdict_logprobs(question, prediction, golds)
        context = judge.prompt(question, prediction, golds)
        assert "Predicted answer: " + prediction in context and "Paris; Paris, France" in context
        assert yes == pytest.approx(_plain_logprob(bundle, context, " yes"), abs=1e-4)
        assert no == pytest.approx(_plain_logprob(bundle, context, " no"), abs=1e-4)
        verdict = judge(question, prediction, golds)
        assert verdict == (1.0 if yes > no else 0.0)
    assert judge("Q?", "   ", ["Paris"]) == 0.0  # an empty answer is wrong without asking


def test_the_mirage_rubric_is_the_letter_comparison_of_a_plain_forward(tiny_bundles):
    bundle = tiny_bundles["llama"]
    judge = ModelJudge("tiny-llama", prompt="mirage", scorer=ScoringEngine(bundle))
    assert judge.name == "mirage:tiny-llama"
    question, golds = "Question: What is the capital of France?\nAnswer:", ["Paris"]
    for prediction in ("Paris", "Paris, the capital", "Lyon"):
        context = judge.prompt(question, prediction, golds)
        assert "A) CORRECT" in context and "Gold answer: Paris" in context and context.endswith("Grade (A, B or C):")
        # GPT-2's tokenizer has no chat template: the prompt is plain and the letters follow it with a space
        letters = {c: _plain_logprob(bundle, context, " " + c) for c in ("A", "B", "C")}
        got = judge.choice_logprobs(question, prediction, golds)
        assert got == pytest.approx(letters, abs=1e-4)
        assert judge(question, prediction, golds) == float(letters["A"] > max(letters["B"], letters["C"]))
    with pytest.raises(EditscopeError, match="judge prompt 'simpleqa': not one of model, mirage"):
        ModelJudge("tiny-llama", prompt="simpleqa")


def test_model_judges_are_named_and_checked(registered):
    with pytest.raises(EditscopeError, match="name a model after"):
        ensure_model_judge("model:  ")
    with pytest.raises(EditscopeError, match="unknown model '/no/such/model'"):
        WildSuite(judge="model:/no/such/model")
    suite = WildSuite(judge=NAME)
    assert NAME in JUDGES and JUDGES[NAME].binary
    assert f"judged by {NAME} (judge prompt v1)" in suite.protocol["note"]
    assert "judge prompt" not in WildSuite().protocol["note"]
    mirage = WildSuite(judge="mirage:tiny-llama")
    assert "mirage:tiny-llama" in JUDGES and "(judge prompt mirage v1)" in mirage.protocol["note"]
    with pytest.raises(EditscopeError, match="name a model after 'mirage:'"):
        ensure_model_judge("mirage:")


def test_a_run_judged_by_a_model(tmp_path, tiny_bundles, registered):
    bundle = tiny_bundles["llama"]
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "output": str(tmp_path),
        "methods": [{"name": "rome", "overrides": {"v_steps": 3}}],
        "dataset": "counterfact", "slice": {"offset": 0, "limit": 2},
        "suites": [{"name": "wild", "options": {"max_new_tokens": 4, "judge": NAME}}]})
    Runner(config, out_dir=tmp_path, bundle=bundle, progress=False, log=lambda _m: None).run()
    rows = read_results(tmp_path / "results.jsonl")
    fresh = ModelJudge("tiny-llama", scorer=ScoringEngine(load("tiny-llama")))  # an unedited copy
    for row in rows:
        assert NAME in row["protocol"]["wild"]["note"]
        for when in ("pre", "post"):
            prompts = row[when]["wild"]["prompts"]
            rewrite = next(p for p in prompts if p["role"] == "rewrite")
            want = judge_answer(fresh, rewrite["prompt"], rewrite["answer"], rewrite["gold"])
            assert row["metrics"]["wild"][f"Efficacy_{when}"] == want


def test_a_judge_is_not_the_model_under_edit(tiny_bundles, registered):
    """The registered judge loads its own copy: editing the run's bundle does not move its verdicts."""
    ensure_model_judge(NAME)
    judge = JUDGES[NAME]
    before = judge.verdict_logprobs("Who?", "Ann", ["Ann"])
    bundle = tiny_bundles["llama"]
    param = next(bundle.model.parameters())
    saved = param.detach().clone()
    try:
        with torch.no_grad():
            param.add_(1.0)
        assert judge.verdict_logprobs("Who?", "Ann", ["Ann"]) == before
    finally:
        with torch.no_grad():
            param.copy_(saved)
