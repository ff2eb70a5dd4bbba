"""One registry mechanism for everything that is looked up by name: editors, plug-ins, suites, architecture
families, datasets and CLI commands.

A :class:`Registry` maps names to entries of one kind, checks the type of what is registered, refuses a name
that is taken (``edit method 'rome' is already registered``) unless ``replace=True``, resolves aliases, keeps a
one-line description per entry and names the known entries when a lookup fails (``unknown edit method 'romee';
available: rome, memit, ...``). It is a mutable mapping, so ``REG[name]``, ``name in REG``, ``list(REG)``,
``REG.items()`` and ``monkeypatch.setitem(REG, ...)`` behave as on a dict; the one difference is that
``REG.get(name)`` without a default raises that error instead of returning None (pass a default, as in
``REG.get(name, None)``, for dict behaviour). Iteration yields canonical names only, in registration order;
an alias is ``in`` the registry and resolves to its entry.

This module sits at the bottom of the import order: every package may import it, and it imports nothing from
editscope except :mod:`editscope.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

from editscope.errors import EditscopeError

T = TypeVar("T")

_MISSING: Any = object()


class UnknownNameError(EditscopeError, KeyError):
    """A lookup of a name no entry (or alias) has; a :class:`KeyError` too, so mapping idioms keep working."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class Registry(MutableMapping[str, T], Generic[T]):
    """Name -> entry of one ``kind`` (the word errors use: ``"edit method"``, ``"plug-in"``, ``"suite"``).

    ``expected``: the type every entry must have; ``check``: a predicate every entry must pass (with
    ``check_text`` saying what it requires); ``name_of``: how :meth:`register` names an entry when no ``name``
    is given; ``describe``: the default one-line description of an entry; ``listed_as``: the word before the
    list of names in the unknown-name error (``available``, or ``registered``)."""

    def __init__(self, kind: str, *, expected: type | tuple[type, ...] | None = None,
                 check: Callable[[Any], bool] | None = None, check_text: str = "",
                 name_of: Callable[[T], str] | None = None, describe: Callable[[T], str] | None = None,
                 listed_as: str = "available") -> None:
        self.kind = kind
        self._expected = expected
        self._check = check
        self._check_text = check_text
        self._name_of = name_of
        self._describe = describe
        self._listed_as = listed_as
        self._entries: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}
        self._aliases: dict[str, str] = {}  # alias -> canonical name

    # -- registration ----------------------------------------------------------------------------------------
    def register(self, entry: T, name: str | None = None, *, aliases: Iterable[str] = (), replace: bool = False,
                 description: str | None = None) -> T:
        """Add ``entry`` under ``name`` (default: ``name_of(entry)``) and ``aliases``; returns ``entry``, so
        ``X = REG.register(X)`` and ``@REG.register`` both work. A taken name or alias is an error unless
        ``replace`` (registering the very same entry again under the same name is a no-op)."""
        name = self._entry_name(entry, name)
        self._check_name(name)
        self._check_entry(name, entry)
        aliases = tuple(aliases)
        for alias in aliases:
            self._check_name(alias)
        if not replace:
            if self._entries.get(name, _MISSING) is entry and set(aliases) <= set(self.aliases(name)):
                return entry
            self._check_free((name, *aliases))
        if len(set(aliases) | {name}) != len(aliases) + 1:
            raise EditscopeError(f"{self.kind} {name!r}: aliases repeat a name ({', '.join(aliases)})")
        self._release(name, aliases)
        self._entries[name] = entry
        self._descriptions[name] = description if description is not None else \
            (self._describe(entry) if self._describe else "")
        self._aliases.update(dict.fromkeys(aliases, name))
        return entry

    def _entry_name(self, entry: T, name: str | None) -> str:
        """``name``, or the one ``name_of`` gives the entry."""
        if name is not None:
            return name
        if self._name_of is None:
            raise EditscopeError(f"{self.kind}: register(entry, name=...) needs a name")
        return self._name_of(entry)

    def _check_free(self, names: Iterable[str]) -> None:
        """Refuse a name or alias an entry already holds."""
        for taken in names:
            if taken in self._entries or taken in self._aliases:
                raise EditscopeError(f"{self.kind} {taken!r} is already registered")

    def _release(self, name: str, aliases: tuple[str, ...]) -> None:
        """With ``replace``: whatever held ``name`` as an alias, or an alias as a name, gives it up."""
        for taken in (name, *aliases):
            if taken in self._aliases:
                del self._aliases[taken]
            elif taken in self._entries and taken != name:
                del self[taken]

    def _check_name(self, name: Any) -> None:
        if not isinstance(name, str) or not name.strip():
            raise EditscopeError(f"{self.kind} name {name!r}: expected a non-empty string")

    def _check_entry(self, name: str, entry: Any) -> None:
        if self._expected is not None and not isinstance(entry, self._expected):
            want = " or ".join(t.__name__ for t in (self._expected if isinstance(self._expected, tuple)
                                                    else (self._expected,)))
            raise EditscopeError(f"{self.kind} {name!r}: expected a {want}, got {type(entry).__name__}")
        if self._check is not None and not self._check(entry):
            raise EditscopeError(f"{self.kind} {name!r}: {entry!r} is not {self._check_text or 'accepted'}")

    # -- lookup ----------------------------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """The canonical name of ``name`` (itself or the name an alias stands for); the unknown-name error."""
        if name in self._entries:
            return name
        if name in self._aliases:
            return self._aliases[name]
        listed = ", ".join(self._entries) or "none"
        raise UnknownNameError(f"unknown {self.kind} {name!r}; {self._listed_as}: {listed}")

    def get(self, name: str, default: Any = _MISSING) -> Any:  # type: ignore[override]
        """The entry of ``name`` (or alias); without ``default`` an unknown name raises naming the known ones."""
        try:
            return self[name]
        except UnknownNameError:
            if default is _MISSING:
                raise
            return default

    def __getitem__(self, name: str) -> T:
        return self._entries[self.resolve(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._aliases

    def __setitem__(self, name: str, entry: T) -> None:
        """Dict-style assignment: registers ``entry`` under ``name``, replacing what held it."""
        self.register(entry, name, replace=True)

    def __delitem__(self, name: str) -> None:
        canonical = self.resolve(name)
        if canonical != name:  # deleting an alias removes the alias only
            del self._aliases[name]
            return
        for alias in self.aliases(name):
            del self._aliases[alias]
        del self._entries[name], self._descriptions[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The canonical names, in registration order."""
        return list(self._entries)

    def aliases(self, name: str) -> tuple[str, ...]:
        """The aliases of the entry named ``name``."""
        canonical = self.resolve(name)
        return tuple(a for a, n in self._aliases.items() if n == canonical)

    def description(self, name: str) -> str:
        """The one-line description of ``name`` (or alias); "" when none was given."""
        return self._descriptions[self.resolve(name)]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries) or 'empty'})"


__all__ = ["Registry", "UnknownNameError"]
