"""A judge model for evaluation in the wild: a local causal LM decides whether a generated answer is right.

The Mirage paper (Yang et al., ACL 2025) judges the whole generated answer with an LLM; editscope's default judge is
SQuAD exact match (:data:`editscope.metrics.answers.JUDGES`), and this module adds the model-based alternative
without any network service. A wild suite names it as ``judge: model:NAME`` (NAME: a registry name such as
``smollm2-135m``, a local folder, or a cached hub id), e.g.
``{name: wild, options: {context: qa, judge: "model:smollm2-135m"}}``.

The judge reads one fixed prompt (:data:`JUDGE_PROMPT`: the question, the accepted answers and the prediction, then
"Is the predicted answer correct? Answer yes or no.") and says *correct* when log P(" yes") > log P(" no") for the
next tokens (a teacher-forced comparison, so the verdict is deterministic and costs one forward of the prompt). An
empty prediction is judged wrong without asking. The judge loads its own copy of the model on first use: the model
under edit never judges its own answers, even when both are the same checkpoint. Its name, and so the model, is in
the wild suite's protocol note and each row; the prompt is fixed by :data:`JUDGE_VERSION` (in the name's note).

How good a judge a 135M model is, is another question: the point is the interface, so that any larger local model a
user has can be dropped in with one option.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from editscope.errors import EditscopeError
from editscope.metrics.answers import JUDGES

PREFIX = "model:"
JUDGE_VERSION = 1
JUDGE_PROMPT = ("Decide whether a predicted answer to a question is correct, given the accepted answers.\n"
                "Question: {question}\nAccepted answers: {golds}\nPredicted answer: {prediction}\n"
                "Is the predicted answer correct? Answer yes or no.\nAnswer:")
YES, NO = " yes", " no"


class ModelJudge:
    """A binary :class:`~editscope.metrics.answers.Judge` backed by a causal LM (see the module docstring).

    ``model``: what :func:`editscope.lm.loading.load` accepts; ``scorer``: an already built
    :class:`~editscope.lm.scorer.Scorer` to use instead of loading one (tests, or a judge shared across runs)."""

    binary = True

    def __init__(self, model: str, *, scorer: Any = None) -> None:
        self.model = model
        self.name = f"{PREFIX}{model}"
        self._scorer = scorer

    def scorer(self) -> Any:
        """The judge's own scoring engine, loaded on first use."""
        if self._scorer is None:
            from editscope.lm.engine import ScoringEngine
            from editscope.lm.loading import load

            self._scorer = ScoringEngine(load(self.model))
        return self._scorer

    @staticmethod
    def prompt(question: str, prediction: str, golds: Sequence[str]) -> str:
        """The fixed judge prompt for one answer."""
        return JUDGE_PROMPT.format(question=question.strip(), golds="; ".join(g.strip() for g in golds),
                                   prediction=prediction.strip())

    def verdict_logprobs(self, question: str, prediction: str, golds: Sequence[str]) -> tuple[float, float]:
        """(log P(" yes"), log P(" no")) after the judge prompt."""
        context = self.prompt(question, prediction, golds)
        yes, no = self.scorer().score([(context, YES), (context, NO)])
        return float(yes.token_logprobs.sum()), float(no.token_logprobs.sum())

    def __call__(self, question: str, prediction: str, golds: Sequence[str]) -> float:
        if not prediction.strip():
            return 0.0
        yes, no = self.verdict_logprobs(question, prediction, golds)
        return 1.0 if yes > no else 0.0


def ensure_model_judge(name: str) -> None:
    """Register the judge ``model:NAME`` on first mention (no model is loaded until it judges); a model that cannot
    be found is a one-line error now, before any edit."""
    if not name.startswith(PREFIX) or name in JUDGES:
        return
    model = name[len(PREFIX):].strip()
    if not model:
        raise EditscopeError(f"judge {name!r}: name a model after {PREFIX!r} (a registry name or a local folder)")
    if not model.startswith("tiny-"):
        from editscope.lm.loading import check_available

        check_available(model)
    JUDGES.register(ModelJudge(model), description=f"the model {model} asked a fixed yes/no question "
                                                   f"(editscope judge prompt v{JUDGE_VERSION})")


__all__ = ["JUDGE_PROMPT", "JUDGE_VERSION", "PREFIX", "ModelJudge", "ensure_model_judge"]
