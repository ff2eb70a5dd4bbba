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

    ``subject_in_prompt``: False for a question that does not contain its subject (QAEdit's questions need not).
    ``prompt`` is then the question as published, with no ``{}`` slot, and :attr:`text` is ``prompt``; ``subject``
    is kept as the dataset gives it, never invented. Editors that need the subject's position in the prompt
    cannot edit such a request (their template check refuses it).
    """

    prompt: str
    subject: str
    target_new: str
    target_true: str | None = None
    correct_answers: tuple[str, ...] = ()
    hard_false: tuple[str, ...] = ()
    subject_in_prompt: bool = True

    def __post_init__(self) -> None:
        for name in ("correct_answers", "hard_false"):  # tuples keep the request hashable
            raw = getattr(self, name)
            if isinstance(raw, str):
                raise ValueError(f"{name}: expected a sequence of answers, got the string {raw!r}")
            value = tuple(raw)
            if not all(isinstance(a, str) and a.strip() for a in value):
                raise ValueError(f"{name}: every answer must be a non-empty string")
            object.__setattr__(self, name, value)
        if not isinstance(self.subject_in_prompt, bool):
            raise ValueError(f"subject_in_prompt: expected a bool, got {self.subject_in_prompt!r}")
        if not self.subject_in_prompt:
            if "{}" in self.prompt:
                raise ValueError(f"a prompt that does not contain its subject has no '{{}}' slot: {self.prompt!r}")
        elif self.prompt.count("{}") != 1:
            raise ValueError(f"prompt template must contain exactly one '{{}}': {self.prompt!r}")
        if not self.subject.strip():
            raise ValueError("subject is empty")
        if not self.target_new.strip():
            raise ValueError("target_new is empty")

    @property
    def text(self) -> str:
        """The prompt with the subject filled in (the prompt itself when it does not contain its subject)."""
        return self.prompt.replace("{}", self.subject) if self.subject_in_prompt else self.prompt


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
