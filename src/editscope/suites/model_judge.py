"""Judge models for evaluation in the wild: a local causal LM decides whether a generated answer is right.

The Mirage paper (Yang et al., ACL 2025) judges the whole generated answer with an LLM (gpt-4o-mini given a
SimpleQA-style grading rubric); editscope adds the model-based judge without any network service. A wild suite names
it as ``judge: PROMPT:NAME``: NAME a registry name such as ``smollm2-135m``, a local folder, or a cached hub id;
PROMPT one of the named judge prompts of :data:`JUDGE_PROMPTS`:

* ``model`` -- "Is the predicted answer correct? Answer yes or no." (editscope's prompt v1); correct when
  log P(" yes") > log P(" no");
* ``mirage`` -- the Mirage paper's grading rubric, in editscope's words: CORRECT when the predicted answer contains
  the gold answer's information and nothing that contradicts it, INCORRECT when it states something else or
  contradicts it, NOT_ATTEMPTED when it gives no answer; the grader answers with a letter, and the answer is correct
  when "A" (CORRECT) is likelier than both "B" and "C".

``mirage`` is shown as the user turn of the judge model's chat template when its tokenizer has one (an instruct
model grades in its own format); ``model`` is shown as plain text. The verdict is a teacher-forced comparison of the
choices' log-probabilities after the prompt, so it is deterministic and costs one forward of the prompt. An empty
prediction is judged wrong without asking. The judge loads its own copy of the model on first use: the model under
edit never judges its own answers, even when both are the same checkpoint. The judge's name (prompt and model) is in
the wild suite's protocol note and each row, with the prompt's version.

How good a judge a model is, is measured against hand labels (``editscope judge-agreement``): a 135M model is a poor
one; the point of the interface is that any larger local model a user has is one option away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from editscope.errors import EditscopeError
from editscope.metrics.answers import JUDGES


@dataclass(frozen=True)
class JudgePrompt:
    """A named judge prompt: its template (``{question}``, ``{golds}``, ``{prediction}``), the continuations the
    judge chooses among, which of them means *correct* (it must be likelier than every other one), and whether the
    prompt is shown as the user turn of the judge model's chat template when its tokenizer has one (``chat``: the
    choices then start the assistant's turn, with no leading space)."""

    name: str
    version: int
    template: str
    choices: tuple[str, ...]
    correct: str
    chat: bool = False


JUDGE_PROMPTS: dict[str, JudgePrompt] = {p.name: p for p in (
    JudgePrompt("model", 1,
                "Decide whether a predicted answer to a question is correct, given the accepted answers.\n"
                "Question: {question}\nAccepted answers: {golds}\nPredicted answer: {prediction}\n"
                "Is the predicted answer correct? Answer yes or no.\nAnswer:", ("yes", "no"), "yes"),
    JudgePrompt("mirage", 1,
                "You grade a predicted answer to a question against the gold answer.\n"
                "A) CORRECT: the predicted answer contains the gold answer's information and nothing that "
                "contradicts it. Extra words are fine.\n"
                "B) INCORRECT: the predicted answer states a different answer, or contradicts the gold answer.\n"
                "C) NOT_ATTEMPTED: the predicted answer gives no answer to the question and contradicts nothing.\n"
                "Question: {question}\nGold answer: {golds}\nPredicted answer: {prediction}\n"
                "Grade (A, B or C):", ("A", "B", "C"), "A", chat=True),
)}
"""The judge prompts by name; a judge is named ``PROMPT:MODEL``. ``mirage`` states the Mirage paper's rubric (Yang
et al., ACL 2025, after SimpleQA's grader) in editscope's words, shortened for small local models, and is shown in
the judge model's chat template (the paper's grader is a chat model). The choices are scored as continuations: after
a plain prompt ending in ":" the engine reads them with a leading space (" yes"), in a chat turn without."""

PREFIX = "model:"
"""The prefix of the yes/no judge (prompt ``model``)."""
JUDGE_VERSION = JUDGE_PROMPTS["model"].version
JUDGE_PROMPT = JUDGE_PROMPTS["model"].template
YES, NO = "yes", "no"


def judge_prompt_of(name: str) -> JudgePrompt | None:
    """The judge prompt a judge name ``PROMPT:MODEL`` asks with (None: not a model judge's name)."""
    head, sep, _ = name.partition(":")
    return JUDGE_PROMPTS.get(head) if sep else None


class ModelJudge:
    """A binary :class:`~editscope.metrics.answers.Judge` backed by a causal LM (see the module docstring).

    ``model``: what :func:`editscope.lm.loading.load` accepts; ``prompt``: a :data:`JUDGE_PROMPTS` name; ``scorer``:
    an already built :class:`~editscope.lm.scorer.Scorer` to use instead of loading one (tests, or a judge shared
    across runs)."""

    binary = True

    def __init__(self, model: str, *, prompt: str = "model", scorer: Any = None) -> None:
        if prompt not in JUDGE_PROMPTS:
            raise EditscopeError(f"judge prompt {prompt!r}: not one of {', '.join(JUDGE_PROMPTS)}")
        self.model, self.style = model, JUDGE_PROMPTS[prompt]
        self.name = f"{prompt}:{model}"
        self._scorer = scorer

    def scorer(self) -> Any:
        """The judge's own scoring engine, loaded on first use."""
        if self._scorer is None:
            from editscope.lm.engine import ScoringEngine
            from editscope.lm.loading import load

            bundle = load(self.model)
            chat = self.style.chat and bool(getattr(bundle.tokenizer, "chat_template", None))
            self._scorer = ScoringEngine(bundle, chat_template=chat)
        return self._scorer

    def prompt(self, question: str, prediction: str, golds: Sequence[str]) -> str:
        """The judge prompt for one answer."""
        return self.style.template.format(question=question.strip(), golds="; ".join(g.strip() for g in golds),
                                          prediction=prediction.strip())

    def choice_logprobs(self, question: str, prediction: str, golds: Sequence[str]) -> dict[str, float]:
        """log P(choice) after the judge prompt, for each of the prompt's choices."""
        context = self.prompt(question, prediction, golds)
        scores = self.scorer().score([(context, c) for c in self.style.choices])
        return {c: float(s.token_logprobs.sum()) for c, s in zip(self.style.choices, scores, strict=True)}

    def verdict_logprobs(self, question: str, prediction: str, golds: Sequence[str]) -> tuple[float, float]:
        """(log P(correct choice), the largest log P of the other choices) after the judge prompt."""
        lp = self.choice_logprobs(question, prediction, golds)
        return lp[self.style.correct], max(v for c, v in lp.items() if c != self.style.correct)

    def __call__(self, question: str, prediction: str, golds: Sequence[str]) -> float:
        if not prediction.strip():
            return 0.0
        correct, other = self.verdict_logprobs(question, prediction, golds)
        return 1.0 if correct > other else 0.0


def ensure_model_judge(name: str) -> None:
    """Register the judge ``PROMPT:MODEL`` (``model:NAME``, ``mirage:NAME``) on first mention (no model is loaded
    until it judges); a model that cannot be found is a one-line error now, before any edit."""
    style = judge_prompt_of(name)
    if style is None or name in JUDGES:
        return
    model = name.partition(":")[2].strip()
    if not model:
        raise EditscopeError(f"judge {name!r}: name a model after {style.name + ':'!r} (a registry name or a local "
                             "folder)")
    if not model.startswith("tiny-"):
        from editscope.lm.loading import check_available

        check_available(model)
    JUDGES.register(ModelJudge(model, prompt=style.name),
                    description=f"the model {model} asked the judge prompt {style.name!r} v{style.version}")


__all__ = ["JUDGE_PROMPT", "JUDGE_PROMPTS", "JUDGE_VERSION", "PREFIX", "JudgePrompt", "ModelJudge",
           "ensure_model_judge", "judge_prompt_of"]
