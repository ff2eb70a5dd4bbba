"""Sequential-editing state: what a method carries from one edit to the next (AlphaEdit's accumulated keys,
PRUNE's accumulated ΔW), in an object the caller owns (DESIGN.md rule 5). Every editor declares its state class
(:attr:`editscope.edit.registry.Editor.state_class`); stateless editors use :class:`NoState`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class EditState(ABC):
    """State of a sequential editor. ``without_edits()`` is the reset: a state holding no edits, which may
    share expensive read-only parts (AlphaEdit's null-space projectors) with this one."""

    @abstractmethod
    def without_edits(self) -> Self: ...


class NoState(EditState):
    """The state of an editor whose edits do not depend on earlier ones."""

    def without_edits(self) -> NoState:
        return NoState()
