"""A quick check of what an edit did to the rest of the model, for edits whose hyperparameters nobody chose.

Hyperparameters derived from the architecture (no shipped file: :class:`~editscope.edit.hparams.
DerivedHParamsWarning`) can write the fact and break the model around it. Before the edit the check finds, among the
first ``scan`` records of a CounterFact pool, the facts the model knows (its top-1 next token after the prompt is
the first token of the true object) and greedily continues a few neutral prompts; after the edit it counts the known
facts whose top-1 token changed and the continuations that turned degenerate (fewer than half of their tokens
distinct, where before they were not). Seconds of work on SmolLM2; one line for the user, pointing to ``tune``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from editscope.lm.engine import ScoringEngine

POOL = "counterfact-train-sample"
SCAN = 32
PROMPTS = ("The history of the city begins", "In the morning, the team", "Scientists have found that")
NEW_TOKENS = 24
DISTINCT = 0.5  # a continuation with fewer distinct tokens than this share of its tokens is degenerate


def distinct_share(tokens: list[int]) -> float:
    """The share of distinct tokens in ``tokens`` (1.0 for none)."""
    return len(set(tokens)) / len(tokens) if tokens else 1.0


@functools.lru_cache(maxsize=2)
def _facts(pool: str, scan: int) -> tuple[tuple[str, str], ...]:
    from editscope.data import load_cases

    return tuple((c.requests[0].text, c.requests[0].target_true) for c in load_cases(pool, limit=scan)
                 if c.requests and c.requests[0].target_true)


@dataclass
class QuickCheck:
    """Before-and-after measurements (see the module docstring). Call :meth:`before` on the unedited model and
    :meth:`after` with the edit applied."""

    pool: str = POOL
    scan: int = SCAN
    known: list[tuple[str, int]] = field(default_factory=list)  # (prompt, the true object's first token)
    flipped: int = 0
    degenerate_before: list[bool] = field(default_factory=list)
    degenerate_after: list[bool] = field(default_factory=list)

    def before(self, engine: ScoringEngine) -> None:
        facts = _facts(self.pool, self.scan)
        firsts = [engine.encode_pair(prompt, answer)[1][0] for prompt, answer in facts]
        top = self._top1(engine, [p for p, _ in facts])
        self.known = [(p, t) for (p, _), t, got in zip(facts, firsts, top, strict=True) if got == t]
        self.degenerate_before = self._degenerate(engine)

    def after(self, engine: ScoringEngine) -> None:
        top = self._top1(engine, [p for p, _ in self.known]) if self.known else []
        self.flipped = sum(got != t for (_, t), got in zip(self.known, top, strict=True))
        self.degenerate_after = self._degenerate(engine)

    @staticmethod
    def _top1(engine: ScoringEngine, prompts: list[str]) -> list[int]:
        return [int(i) for i in engine.next_token_logprobs(prompts).argmax(-1)] if prompts else []

    @staticmethod
    def _degenerate(engine: ScoringEngine) -> list[bool]:
        texts = engine.generate(list(PROMPTS), max_new_tokens=NEW_TOKENS)
        return [distinct_share(list(engine.tokenizer(t, add_special_tokens=False)["input_ids"])) < DISTINCT
                for t in texts]

    @property
    def turned_degenerate(self) -> int:
        return sum(a and not b for a, b in zip(self.degenerate_after, self.degenerate_before, strict=True))

    def to_dict(self) -> dict:
        return {"pool": self.pool, "scanned": self.scan, "known_facts": len(self.known), "flipped": self.flipped,
                "generations": len(PROMPTS), "turned_degenerate": self.turned_degenerate}

    def line(self, method: str, model: str) -> str:
        """One line for the user: what the check found, and where to choose hyperparameters."""
        facts = (f"{self.flipped} of the {len(self.known)} known facts among {self.scan} CounterFact records "
                 "changed their top answer" if self.known else
                 f"no known fact among {self.scan} CounterFact records to check")
        return (f"derived hparams: a quick check after the edit: {facts}; {self.turned_degenerate} of {len(PROMPTS)} "
                f"neutral generations turned degenerate. Choose hparams on validation records: editscope tune "
                f"--method {method} --model {model}")

