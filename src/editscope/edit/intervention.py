"""What an edit leaves on a model: an intervention of one of three kinds, behind one contract.

- ``weights``: a weight delta, :class:`~editscope.edit.patch.Patch` (ΔW per parameter; ROME, MEMIT, ... UltraEdit);
- ``memory``: a module memory, :class:`~editscope.edit.memory.MemoryEdit` (a layer's output governed by a store
  beside the weights, installed as a forward hook; GRACE's codebook) or
  :class:`~editscope.edit.side_memory.SideMemoryEdit` (side copies of a layer's weight and a router; WISE);
- ``context``: text before every prompt, :class:`~editscope.edit.context_edit.ContextEdit` (a stated fact, retrieved
  facts, demonstrations; PROMPT, IKE, retrieval).

Every kind applies to a :class:`~editscope.lm.bundle.Bundle` and reverts exactly (a memory or context edit leaves
every base weight bit-equal), is recorded on it (so :attr:`Bundle.fingerprint` names the edited model), saves to
and loads from a sealed safetensors file, and is named in its rows: a memory or context edit's rows carry
``edit_info.kind`` (a row without it is a weight edit, as every row written before these kinds existed). The trial, the
runner, the lifelong chain, the card and ``editscope edit`` handle an intervention through this contract alone.

A memory or context editor carries everything it has written in its sequential state (the store), so each edit's
intervention holds the whole store after it and *supersedes* the one of the same method in force: applying it takes
the older one off the bundle, reverting it puts the older one back. In a lifelong chain the superseded one is let go
(:meth:`release_superseded`), so memory stays one store however many rounds there are.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from safetensors import safe_open

from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle

KINDS: tuple[str, ...] = ("weights", "memory", "context")
"""The kinds an edit can be, in the order docs and tables list them."""


@runtime_checkable
class Intervention(Protocol):
    """The contract every kind keeps (see the module docstring)."""

    kind: str
    method: str
    hparams: dict[str, Any]
    requests: list[dict[str, Any]]
    info: dict[str, Any]
    #: pre-edit checksum of every parameter the edit writes (empty for a memory or context edit)
    checksums: dict[str, str]

    @property
    def digest(self) -> str: ...

    @property
    def applied(self) -> bool: ...

    def apply(self, target: Bundle, *, check: bool = True) -> None: ...

    def revert(self, target: Bundle) -> None: ...

    def save(self, path: str | Path) -> Path: ...


def in_force(bundle: Bundle, method: str) -> Any | None:
    """The newest memory or context edit of ``method`` applied to ``bundle`` (None: none): the one a new edit of
    that method supersedes."""
    for entry in reversed(bundle.applied):
        if getattr(entry, "kind", "weights") != "weights" and entry.method == method:
            return entry
    return None


def file_format(path: str | Path) -> str:
    """The ``format`` a saved intervention's metadata names (one line naming the file when it cannot be read)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types
        raise EditscopeError(f"{path}: not a readable edit file ({exc})") from None
    return str(meta.get("format", ""))


def load_intervention(path: str | Path, *, trust_unverified: bool | None = None) -> Any:
    """Any saved edit — a patch, a memory edit or a context edit — read back by the ``format`` in its metadata,
    checked as each kind checks its files."""
    from editscope.edit import context_edit, memory, patch, side_memory

    loaders = {patch.FORMAT: patch.Patch.load, context_edit.FORMAT: context_edit.ContextEdit.load,
               memory.FORMAT: memory.MemoryEdit.load, side_memory.FORMAT: side_memory.SideMemoryEdit.load}
    if Path(path).is_dir():
        raise EditscopeError(f"{path}: is a folder, not a patch file")
    if not Path(path).is_file():
        raise EditscopeError(f"patch file not found: {path}")
    fmt = file_format(path)
    if fmt not in loaders:  # an older patch without a format key is read (and refused) by Patch.load
        return patch.Patch.load(path, trust_unverified=trust_unverified)
    return loaders[fmt](path, trust_unverified=trust_unverified)


def dumps(value: Any) -> str:
    """JSON for file metadata: sorted keys, so a file's content digest does not depend on dict order."""
    return json.dumps(value, sort_keys=True)


@dataclass(eq=False, kw_only=True)
class StoredEdit(ABC):
    """What memory and context edits share: the fields every edit file holds, recorded on the bundle, superseding
    the edit of the same method in force, saved as a sealed safetensors file (metadata :meth:`fields` plus
    :meth:`tensors`).

    A subclass (a keyword-only dataclass adding its own fields) sets ``kind`` and ``FORMAT`` and implements
    :meth:`_attach` / :meth:`_detach` (install and remove what acts on the model: a context provider, a forward
    hook), :meth:`fields`, :meth:`tensors` and ``load``. Base weights are never written."""

    kind: ClassVar[str] = ""
    FORMAT: ClassVar[str] = ""

    method: str
    hparams: dict[str, Any]
    fingerprint: str
    model_name: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    #: pre-edit checksums of written parameters: none (the Intervention contract's field)
    checksums: dict[str, str] = field(default_factory=dict)
    #: the edit of the same method this one replaced when applied (put back when this one is reverted)
    superseded: StoredEdit | None = field(default=None, repr=False)
    _target: Bundle | None = field(default=None, repr=False)

    # -- what a bundle needs (AppliedPatch) ----------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return []  # no parameter is written

    def original(self, name: str, current: Any) -> Any:
        raise EditscopeError(f"{self.method}: a {self.kind} edit writes no parameter ({name})")

    def release(self) -> None:
        """Nothing to hand over: a memory or context edit holds no ΔW (a chain never folds one)."""
        return None

    @property
    def applied(self) -> bool:
        return self._target is not None

    @property
    def digest(self) -> str:
        """Content digest of what the edit puts on the model (method, hparams, its fields and tensors; not its
        timings), as :func:`editscope.integrity.seal` computes one."""
        from editscope.integrity import seal

        content = {"method": self.method, "hparams": dumps(self.hparams), "fields": dumps(self.fields())}
        return json.loads(seal(content, self.tensors())["content_digest"])["digest"]

    def apply(self, target: Bundle, *, check: bool = True) -> None:
        """Put the edit in force on ``target`` (taking off the one it supersedes). With ``check`` the bundle must
        hold the loaded weights this edit was made for."""
        if self.applied:
            raise EditscopeError(f"{self.method} edit is already applied; revert it first")
        if check and target.base_fingerprint != self.fingerprint:
            raise EditscopeError(f"{self.method} edit was made for model {self.model_name or '?'} with fingerprint "
                                 f"{self.fingerprint}, not {target.name} with fingerprint {target.base_fingerprint}")
        previous = self.superseded
        if previous is not None and previous.applied:
            previous._take_off(target)
        self._put_on(target)

    def revert(self, target: Bundle) -> None:
        """Take the edit off ``target`` exactly (and put back the one it superseded)."""
        if not self.applied:
            raise EditscopeError(f"{self.method} edit is not applied")
        self._take_off(target)
        if self.superseded is not None and not self.superseded.applied:
            self.superseded._put_on(target)

    def release_superseded(self) -> None:
        """Let go of the edit this one replaced (a lifelong chain keeps one store, not one per round)."""
        self.superseded = None

    def _put_on(self, target: Bundle) -> None:
        self._attach(target)
        self._target = target
        target.record_apply(self)

    def _take_off(self, target: Bundle) -> None:
        target.record_revert(self)
        self._detach(target)
        self._target = None

    @abstractmethod
    def _attach(self, target: Bundle) -> None:
        """Install what acts on the model (a context provider, a forward hook)."""

    @abstractmethod
    def _detach(self, target: Bundle) -> None:
        """Remove what acts on the model (a context provider, a forward hook)."""

    # -- files ------------------------------------------------------------------------------------------
    @abstractmethod
    def fields(self) -> dict[str, Any]:
        """The kind's own JSON fields (besides method, hparams, fingerprint, model, requests, info)."""

    @abstractmethod
    def tensors(self) -> dict[str, Any]:
        """The kind's tensors (saved with the file, covered by its digest)."""

    def describe(self) -> str:
        """What the edit holds, in one line for ``editscope patch info`` (a 13-column label, then the text)."""
        return f"holds        {', '.join(f'{k} {list(v.shape)}' for k, v in self.tensors().items())}"

    def _metadata(self) -> dict[str, str]:
        return {"format": self.FORMAT, "kind": self.kind, "method": self.method, "hparams": dumps(self.hparams),
                "fingerprint": self.fingerprint, "model_name": self.model_name, "requests": dumps(self.requests),
                "info": json.dumps({k: v for k, v in self.info.items() if k != "vectors"}, sort_keys=True,
                                   default=str),
                "fields": dumps(self.fields())}

    def save(self, path: str | Path) -> Path:
        """One sealed safetensors file (atomic: temp file + rename)."""
        from safetensors.torch import save_file

        from editscope.atomic import atomic_write
        from editscope.integrity import seal

        tensors = {k: v.detach().contiguous().cpu() for k, v in self.tensors().items()}
        metadata = seal(self._metadata(), tensors)
        return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    @classmethod
    def read(cls, path: str | Path, trust_unverified: bool | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the common fields and ``fields``, tensors) of a file :meth:`save` wrote, checked: the content digest
        first, then each field's JSON type; one line naming the file and the key otherwise."""
        from editscope.integrity import verify

        path = Path(path)
        if not path.is_file():
            raise EditscopeError(f"{cls.kind} edit file not found: {path}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open API)
        except Exception as exc:  # safetensors raises its own error types
            raise EditscopeError(f"{path}: not a readable {cls.kind} edit ({exc})") from None
        if meta.get("format") != cls.FORMAT:
            raise EditscopeError(f"{path}: not an editscope {cls.kind} edit (metadata format={meta.get('format')!r})")
        verify(path, meta, tensors, what=f"{cls.kind} edit", hint="save the edit again", trust=trust_unverified)
        out: dict[str, Any] = {}
        for key, kind in (("method", str), ("fingerprint", str), ("model_name", str), ("hparams", dict),
                          ("requests", list), ("info", dict), ("fields", dict)):
            if key not in meta:
                raise EditscopeError(f"{path}: {cls.kind} edit metadata: key {key!r} is missing")
            try:
                value = meta[key] if kind is str else json.loads(meta[key])
            except ValueError as exc:
                raise EditscopeError(f"{path}: {cls.kind} edit metadata: key {key!r}: not valid JSON ({exc})") from None
            if not isinstance(value, kind):
                raise EditscopeError(f"{path}: {cls.kind} edit metadata: key {key!r}: expected {kind.__name__}, got "
                                     f"{type(value).__name__}")
            out[key] = value
        return out, tensors
