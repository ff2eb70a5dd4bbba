"""Sequential-editing state: what a method carries from one edit to the next (AlphaEdit's accumulated keys,
PRUNE's accumulated ΔW, UltraEdit's lifelong normaliser), in an object the caller owns (DESIGN.md rule 5). Every
editor declares its state class (:attr:`editscope.edit.registry.Editor.state_class`); stateless editors use
:class:`NoState`.

A state saves and loads itself as named tensors plus JSON-able metadata (:meth:`EditState.state_dict` /
:meth:`EditState.from_state_dict`), so a lifelong chain can be resumed from a safetensors file (no pickle, DESIGN
rule 9)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Self

import torch

from editscope.errors import EditscopeError


class EditState(ABC):
    """State of a sequential editor. ``without_edits()`` is the reset: a state holding no edits, which may
    share expensive read-only parts (AlphaEdit's null-space projectors) with this one.

    An edit never changes the caller's state directly: ``compute`` works on :meth:`fork` and that fork, the
    edit's state update, is :meth:`commit`-ted by :meth:`editscope.edit.registry.Editor.apply` only once the
    patch passed its checks and is applied. So an editor replaces a state's tensors and never writes into them."""

    def fork(self) -> Self:
        """A working copy for one edit: new containers holding the same (never modified in place) tensors, so
        the copy is cheap however large the projectors are, and changing it leaves this state as it is."""
        twin = copy.copy(self)
        for key, value in vars(self).items():
            if isinstance(value, dict):
                setattr(twin, key, dict(value))
        return twin

    def commit(self, update: Self) -> None:
        """Take the contents of ``update`` (a :meth:`fork` of this state that an edit changed)."""
        if type(update) is not type(self):
            raise EditscopeError(f"editor state: cannot commit a {type(update).__name__} to a {type(self).__name__}")
        vars(self).update(vars(update))

    @abstractmethod
    def without_edits(self) -> Self: ...

    @abstractmethod
    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors by name, JSON-able metadata): everything :meth:`from_state_dict` needs to rebuild the state."""

    @classmethod
    @abstractmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], where: str) -> Self:
        """The state :meth:`state_dict` described; a missing or unexpected entry is an error naming ``where``."""


class NoState(EditState):
    """The state of an editor whose edits do not depend on earlier ones."""

    def without_edits(self) -> NoState:
        return NoState()

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {}, {}

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], where: str) -> NoState:
        expect_keys(tensors, set(), where)
        return NoState()


def expect_keys(tensors: Mapping[str, torch.Tensor], wanted: set[str], where: str) -> None:
    """The tensor names of a saved state are exactly ``wanted`` (else a one-line error naming ``where``)."""
    missing, extra = sorted(wanted - set(tensors)), sorted(set(tensors) - wanted)
    if missing or extra:
        raise EditscopeError(f"{where}: editor state: " + "; ".join(
            part for part in (f"missing tensor(s) {missing}" if missing else "",
                              f"unexpected tensor(s) {extra}" if extra else "") if part))


def meta_field(meta: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``meta[key]``, checked to be of JSON type ``kind``."""
    if key not in meta:
        raise EditscopeError(f"{where}: editor state: metadata key {key!r} is missing")
    value = meta[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise EditscopeError(f"{where}: editor state: metadata key {key!r}: expected {kind.__name__}, "
                             f"got {type(value).__name__}")
    return value
