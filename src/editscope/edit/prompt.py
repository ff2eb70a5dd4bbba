"""PROMPT: the new fact stated before the prompt (EasyEdit's PROMPT baseline, zjunlp/EasyEdit examples/PROMPT.md).

No training, no retrieval: the edit's facts — and in ``sequential`` or lifelong use every fact stated so far — go
before every prompt in EasyEdit's layout (:func:`editscope.edit.context_edit.render`). A context edit: the weights are
never written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from editscope.data.records import EditRequest
from editscope.edit.context_edit import (
    EASYEDIT_INSTRUCTION,
    ContextEdit,
    ContextHParams,
    ContextStore,
    context_edit,
    fact_text,
)
from editscope.lm.bundle import Bundle


@dataclass
class PromptHParams(ContextHParams):
    """``instruction``: the line before the facts (its one knob: EasyEdit's, or none)."""

    method = "prompt"

    TUNABLE: ClassVar[dict[str, tuple]] = {"instruction": (EASYEDIT_INSTRUCTION, "")}


def edit_of(bundle: Bundle, requests: Sequence[EditRequest], hp: PromptHParams, store: ContextStore) -> ContextEdit:
    """The edit stating every fact ``store`` holds."""
    return context_edit("prompt", bundle, requests, hp, store)


def compute(bundle: Bundle, requests: list[EditRequest], hp: PromptHParams, state: ContextStore, **_: object
            ) -> tuple[ContextEdit, dict]:
    state.add([fact_text(r) for r in requests])
    return edit_of(bundle, requests, hp, state), {"facts_stated": len(state.facts)}
