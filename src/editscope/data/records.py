"""The internal record types every loader produces and every editor and suite consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EditRequest:
    """One fact to write: ``prompt.format(subject)`` should be completed by ``target_new``.

    ``prompt`` is a template holding exactly one ``{}`` where the subject goes. Targets are stored as
    given by the dataset (usually without a leading space); the scoring engine handles the boundary.

    ``correct_answers`` / ``hard_false``: other correct answers of the same question (PEAK's positive list)
    and hard false answers (PEAK's negative list) that the edit should keep / not raise; empty unless the
    dataset has them. Loss-term plug-ins read them (APP, :mod:`editscope.edit.plugins.app`); editors ignore them.
    """

    prompt: str
    subject: str
    target_new: str
    target_true: str | None = None
    correct_answers: tuple[str, ...] = ()
    hard_false: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("correct_answers", "hard_false"):  # tuples keep the request hashable
            raw = getattr(self, name)
            if isinstance(raw, str):
                raise ValueError(f"{name}: expected a sequence of answers, got the string {raw!r}")
            value = tuple(raw)
            if not all(isinstance(a, str) and a.strip() for a in value):
                raise ValueError(f"{name}: every answer must be a non-empty string")
            object.__setattr__(self, name, value)
        if self.prompt.count("{}") != 1:
            raise ValueError(f"prompt template must contain exactly one '{{}}': {self.prompt!r}")
        if not self.subject.strip():
            raise ValueError("subject is empty")
        if not self.target_new.strip():
            raise ValueError("target_new is empty")

    @property
    def text(self) -> str:
        """The prompt with the subject filled in."""
        return self.prompt.replace("{}", self.subject)


@dataclass
class Case:
    """One evaluation case: the edit(s) and everything the suites probe around them.

    ``neighborhood`` holds (prompt, answer) pairs whose answer should not change. ``valid_answers`` is the
    set of correct answers of a 1-to-N question (PEAK's positive list); ``hard_false`` and ``random_false``
    are PEAK's hard and random false answers. ``extra`` keeps dataset fields a suite may want.
    """

    case_id: str
    source: str
    requests: tuple[EditRequest, ...]
    paraphrase_prompts: list[str] = field(default_factory=list)
    neighborhood: list[tuple[str, str]] = field(default_factory=list)
    valid_answers: list[str] = field(default_factory=list)
    hard_false: list[str] = field(default_factory=list)
    random_false: list[str] = field(default_factory=list)
    generation_prompts: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def request(self) -> EditRequest:
        """The single edit of a one-edit case (most datasets); multi-edit cases use ``requests``."""
        if len(self.requests) != 1:
            raise ValueError(f"case {self.case_id} has {len(self.requests)} edit requests, not one")
        return self.requests[0]
