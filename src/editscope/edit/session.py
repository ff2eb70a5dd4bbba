"""An edit session: the one owner of an edited model.

It holds the bundle, one :class:`~editscope.lm.engine.ScoringEngine` on it, one
:class:`~editscope.edit.runtime.EditRuntime` (how edits are computed), and (through the bundle) the stack of
applied patches and the fingerprint of the weights as they are now. Edits go through
:meth:`EditSession.apply` and are undone newest first, so every cache keyed by :attr:`fingerprint` (layer
statistics) sees edited and unedited weights as different models.

The engine computes every score from the weights at call time and holds no editor state. The runtime holds the
context templates editors prefix prompts with, which by ROME/MEMIT's convention are generated once and reused by
later edits (:func:`editscope.edit.context.context_templates`), not scores.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from editscope.data.records import EditRequest
from editscope.edit.hparams import HParams
from editscope.edit.patch import Patch
from editscope.edit.registry import get_editor
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle
from editscope.lm.engine import ScoringEngine


class EditSession:
    """Owns ``bundle``, ``engine`` and ``runtime`` (new ones unless given); see the module docstring.

    Usable as a context manager: every patch still applied is reverted on exit, also on error.
    """

    def __init__(self, bundle: Bundle, engine: ScoringEngine | None = None,
                 runtime: EditRuntime | None = None) -> None:
        if engine is not None and engine.bundle is not bundle:
            raise EditscopeError("the engine belongs to another bundle")
        self.bundle = bundle
        self.engine = engine or ScoringEngine(bundle)
        self.runtime = runtime or EditRuntime.from_settings()

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the weights now (the loaded weights' when no patch is applied)."""
        return self.bundle.fingerprint

    @property
    def base_fingerprint(self) -> str:
        return self.bundle.base_fingerprint

    @property
    def patches(self) -> tuple[Patch, ...]:
        """The applied patches, oldest first."""
        return self.bundle.applied  # type: ignore[return-value]  # only Patch objects record themselves

    def apply(self, method: str, requests: Sequence[EditRequest] | EditRequest, hparams: HParams | None = None,
              state: object | None = None, **kwargs: Any) -> Patch:
        """Compute an edit with ``method`` on the weights as they are now, apply it and return its patch.
        Keyword arguments go to :meth:`~editscope.edit.registry.Editor.apply` (the engine and the runtime are the
        session's)."""
        return get_editor(method).apply(self.bundle, requests, hparams, state, engine=self.engine,
                                        runtime=self.runtime, **kwargs)

    def revert(self) -> Patch:
        """Undo the newest applied patch (bit-exact) and return it."""
        if not self.bundle.applied:
            raise EditscopeError("no patch is applied")
        patch = self.bundle.applied[-1]
        patch.revert(self.bundle)
        return patch  # type: ignore[return-value]

    def revert_all(self) -> list[Patch]:
        """Undo every applied patch, newest first; returns them in the order they were reverted."""
        return [self.revert() for _ in range(len(self.bundle.applied))]

    @contextmanager
    def edited(self, method: str, requests: Sequence[EditRequest] | EditRequest, hparams: HParams | None = None,
               state: object | None = None, **kwargs: Any) -> Iterator[Patch]:
        """Apply an edit for the duration of the block; reverted on exit, also on error."""
        patch = self.apply(method, requests, hparams, state, **kwargs)
        try:
            yield patch
        finally:
            patch.revert(self.bundle)

    def __enter__(self) -> EditSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert_all()
