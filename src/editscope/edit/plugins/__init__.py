"""Loss-term plug-ins: extra terms added to the objective of every editor that optimises (DESIGN.md rule 6).

A plug-in is a :class:`PluginSpec` — a name, a display label, a hyperparameter dataclass (validated like an
editor's: an unknown key or a wrong type is an :class:`EditscopeError` naming the key) and a factory
``make(hp) -> ObjectiveTerm`` — registered in :data:`PLUGINS` with :func:`register_plugin`. APP and EVK-Align
are the shipped ones; tests and users register their own (``editscope edit --plugin-module MODULE``
imports a module that calls :func:`register_plugin`).

Attach plug-ins with ``editor.apply(..., plugins=[("name", {key: value}), spec, ...])``, with ``plugins:`` in a
run config's method entry, or with ``editscope edit --plugin NAME[:key=value,...]``. Each attached plug-in is a
:class:`Plugin` (spec + validated hparams); its term is made fresh for every edit. The key ``from`` (:data:`FROM_KEY`)
starts the values from those ``editscope tune`` chose: ``--plugin evk_align:from=OUT/tuned.yaml`` takes the plug-in's
values from that file's ``provenance.plugins``, and any other key given beside it overrides them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from editscope.edit.hparams import PROVENANCE_KEY, Params, parse_key_value, read_hparams_file
from editscope.edit.objective import ObjectiveTerm
from editscope.errors import EditscopeError
from editscope.registry import Registry

#: the plug-in value naming a tuned hparams file to start from (see the module docstring)
FROM_KEY = "from"


def tuned_values(path: str | Path, name: str, where: str) -> dict[str, Any]:
    """The values of plug-in ``name`` recorded in the ``provenance.plugins`` of ``path`` (an ``editscope tune``
    output, ``tuned.yaml``); a one-line error naming the file when it cannot be read as YAML or records none."""
    path = Path(path)
    if not path.is_file():
        raise EditscopeError(f"{where}: key {FROM_KEY!r}: file not found: {path}")
    try:
        provenance = read_hparams_file(path).get(PROVENANCE_KEY)
    except EditscopeError as exc:  # a YAML error says so (it is not a file that merely lacks the values)
        raise EditscopeError(f"{where}: key {FROM_KEY!r}: {exc}") from None
    entries = provenance.get("plugins") if isinstance(provenance, dict) else None
    found = [e for e in entries if isinstance(e, dict) and e.get("name") == name] if isinstance(entries, list) else []
    if not found:
        raise EditscopeError(f"{where}: key {FROM_KEY!r}: {path} records no values of plug-in {name!r} (expected "
                             "a tuned.yaml of editscope tune with that plug-in attached: provenance.plugins)")
    return {k: v for k, v in found[0].items() if k != "name"}


@dataclass
class PluginHParams(Params):
    """Base of a plug-in's hyperparameters (subclass it as a dataclass with typed fields)."""


@dataclass(frozen=True)
class PluginSpec:
    """What a plug-in is: ``make(hp)`` returns the loss term for one edit."""

    name: str
    label: str
    hparams_class: type[PluginHParams]
    make: Callable[[Any], ObjectiveTerm]
    doc: str = ""

    def attach(self, values: Mapping[str, Any] | None = None, where: str | None = None) -> Plugin:
        """This plug-in with hparams ``values`` (defaults for missing keys; ``from``: a tuned file's values
        first, :func:`tuned_values`), validated."""
        where = where or f"<plug-in {self.name}>"
        values = dict(values or {})
        if FROM_KEY in values:
            values = {**tuned_values(str(values.pop(FROM_KEY)), self.name, where), **values}
        return Plugin(self, self.hparams_class.from_dict(values, where))


@dataclass(frozen=True)
class Plugin:
    """An attached plug-in: its spec and validated hyperparameters."""

    spec: PluginSpec
    hparams: PluginHParams = field(compare=True)

    @property
    def name(self) -> str:
        return self.spec.name

    def term(self) -> ObjectiveTerm:
        term = self.spec.make(self.hparams)
        if not isinstance(term, ObjectiveTerm):
            raise EditscopeError(f"plug-in {self.name}: make() returned {type(term).__name__}, which lacks the "
                                 "ObjectiveTerm interface (name, setup(ctx), __call__(step))")
        return term

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., **hparams}`` (what result rows and patches record)."""
        return {"name": self.name, **self.hparams.to_dict()}


#: name -> spec of every known plug-in
PLUGINS: Registry[PluginSpec] = Registry("plug-in", expected=PluginSpec, name_of=lambda s: s.name,
                                         describe=lambda s: s.doc)

#: what :func:`attach` accepts per plug-in
PluginLike = Plugin | PluginSpec | tuple[str, Mapping[str, Any]] | str


def register_plugin(spec: PluginSpec, *, aliases: Sequence[str] = (), replace: bool = False) -> PluginSpec:
    """Add ``spec`` to :data:`PLUGINS` (a name already taken is an error unless ``replace``)."""
    if not spec.name or not spec.name.replace("_", "").replace("-", "").isalnum():
        raise EditscopeError(f"plug-in name {spec.name!r}: use letters, digits, '-' and '_'")
    return PLUGINS.register(spec, aliases=aliases, replace=replace)


def get_plugin(name: str) -> PluginSpec:
    """The plug-in named ``name`` (an error listing the available ones when unknown)."""
    return PLUGINS.get(name)


def attach(items: Sequence[PluginLike], where: str = "plugins") -> list[Plugin]:
    """Validated :class:`Plugin` objects from names, (name, hparams) pairs, specs or plugins."""
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Plugin):
            out.append(item)
        elif isinstance(item, PluginSpec):
            out.append(item.attach())
        elif isinstance(item, str):
            out.append(get_plugin(item).attach(None, f"{where}[{i}]"))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            out.append(get_plugin(item[0]).attach(item[1], f"{where}[{i}] ({item[0]})"))
        else:
            raise EditscopeError(f"{where}[{i}]: expected a plug-in name, (name, hparams), PluginSpec or Plugin, "
                                 f"got {item!r}")
    names = [p.name for p in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise EditscopeError(f"{where}: plug-in {dup!r} attached twice")
    return out


def parse_plugin_arg(text: str) -> tuple[str, dict[str, Any]]:
    """``"NAME[:key=value,...]"`` (values YAML-typed) -> (name, hparams)."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise EditscopeError(f"--plugin {text!r}: expected NAME[:key=value,...]")
    items = filter(None, (x.strip() for x in rest.split(",")))
    return name, dict(parse_key_value(item, f"--plugin {text!r}") for item in items)


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def import_plugin_modules(modules: Sequence[str]) -> None:
    """Import user modules that register plug-ins (``--plugin-module``). A name that is not a dotted Python module
    name (empty, a path such as ``../x`` or ``x.py``) is refused before anything is imported; whatever a module
    raises while it is imported (an ImportError, a SyntaxError, a ValueError, a RecursionError...) is one line
    naming the module and the exception."""
    for module in modules:
        if not isinstance(module, str) or not _MODULE_NAME.fullmatch(module) or module.endswith(".py"):
            hint = " (give the module's dotted name, e.g. my_plugins.app, and put its folder on PYTHONPATH)"
            raise EditscopeError(f"plug-in module {module!r}: not a Python module name{hint}")
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 -- a user module may raise anything on import: one line naming it
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise EditscopeError(f"plug-in module {module!r} cannot be imported: {type(exc).__name__}"
                                 + (f": {first}" if first else "")) from exc


def combined_label(editor_label: str, plugins: Sequence[Plugin]) -> str:
    """How results name an editor with plug-ins: ``ROME+APP``."""
    return "+".join([editor_label, *(p.spec.label for p in plugins)])


__all__ = ["FROM_KEY", "PLUGINS", "Plugin", "PluginHParams", "PluginLike", "PluginSpec", "attach", "combined_label",
           "get_plugin", "import_plugin_modules", "parse_plugin_arg", "register_plugin", "tuned_values"]

# The shipped plug-ins register themselves on import (after the definitions above, which they use).
from editscope.edit.plugins import app as _app  # noqa: E402,F401
from editscope.edit.plugins import evk_align as _evk_align  # noqa: E402

register_plugin(_evk_align.SPEC)
