"""Progress of long steps deep inside editscope, told to whoever listens.

The steps that take seconds to minutes (the v*/z optimiser's steps, an editor's phases, MEND's training) call
:func:`report`; a command or the runner decides where the news goes by installing a listener with
:func:`listening` (a context manager, so a listener never outlives the call that installed it). With no listener
:func:`report` is a context-variable read and nothing else, so library code pays nothing for it, and what it
reports never changes a number.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

Listener = Callable[[str], None]

_LISTENER: ContextVar[Listener | None] = ContextVar("editscope_progress", default=None)


def report(what: str, done: int | None = None, total: int | None = None) -> None:
    """Tell the listener (if any) what is happening: ``what``, and ``done/total`` when counted."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(what if done is None else f"{what} {done}/{total}" if total else f"{what} {done}")


@contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """Send :func:`report` to ``listener`` inside the block (None: to nobody); the previous listener after it."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


class StatusLine:
    """A listener that shows the latest news on a stream, at most once per ``every`` seconds: rewritten in place on
    a terminal, one line per shown update elsewhere (a log file gets a few lines, not one per optimiser step)."""

    def __init__(self, prefix: str = "", stream: TextIO | None = None, every: float = 1.0) -> None:
        self.prefix, self.stream, self.every = prefix, stream or sys.stderr, every
        self._last = -float("inf")
        self._width = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        text = f"{self.prefix}{message}"
        if self._tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End a line rewritten in place (call before printing anything else to the stream)."""
        if self._tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


__all__ = ["Listener", "StatusLine", "listening", "report"]
