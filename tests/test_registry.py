"""The generic registry behind editors, plug-ins, suites, architecture families, datasets and commands."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from editscope.errors import EditscopeError
from editscope.registry import Registry, UnknownNameError


@dataclass(frozen=True)
class Widget:
    name: str


def widgets() -> Registry[Widget]:
    reg: Registry[Widget] = Registry("widget", expected=Widget, name_of=lambda w: w.name,
                                     describe=lambda w: f"the {w.name} widget")
    reg.register(Widget("a"))
    reg.register(Widget("b"), aliases=("bee", "B"), description="second")
    return reg


def test_mapping_access_names_and_descriptions():
    reg = widgets()
    assert list(reg) == reg.names() == ["a", "b"] and len(reg) == 2
    assert reg["a"] == Widget("a") and reg.get("b") is reg["b"]
    assert "a" in reg and "c" not in reg
    assert dict(reg.items()) == {"a": Widget("a"), "b": Widget("b")}
    assert reg.description("a") == "the a widget" and reg.description("bee") == "second"
    assert reg.get("c", None) is None and reg.get("c", 7) == 7  # a default gives dict behaviour


def test_aliases_resolve_but_are_not_listed():
    reg = widgets()
    assert reg["bee"] is reg["B"] is reg["b"] and "bee" in reg
    assert reg.resolve("bee") == "b" and reg.aliases("b") == ("bee", "B")
    assert list(reg) == ["a", "b"]
    del reg["B"]  # deleting an alias removes only the alias
    assert "B" not in reg and "b" in reg and reg.aliases("b") == ("bee",)
    del reg["b"]  # deleting the name removes its aliases too
    assert "bee" not in reg and list(reg) == ["a"]


def test_collision_is_an_error_naming_kind_and_name():
    reg = widgets()
    with pytest.raises(EditscopeError, match=r"^widget 'a' is already registered$"):
        reg.register(Widget("a"))
    with pytest.raises(EditscopeError, match=r"^widget 'bee' is already registered$"):
        reg.register(Widget("c"), aliases=("bee",))  # an alias is taken like a name
    with pytest.raises(EditscopeError, match=r"^widget 'b' is already registered$"):
        reg.register(Widget("x"), "d", aliases=("b",))
    assert "c" not in reg and "d" not in reg  # a refused registration leaves nothing behind
    same = reg["a"]
    assert reg.register(same) is same  # the very same entry again: a no-op


def test_replace():
    reg = widgets()
    new = Widget("a")
    assert reg.register(new, replace=True) is new and reg["a"] is new and list(reg) == ["a", "b"]
    reg.register(Widget("c"), aliases=("bee",), replace=True)  # takes the alias over
    assert reg["bee"] is reg["c"] and reg.aliases("b") == ("B",)
    reg["a"] = Widget("z")  # item assignment replaces, like a dict (monkeypatch.setitem relies on it)
    assert reg["a"] == Widget("z")


def test_type_check_by_expected_type_and_by_predicate():
    reg = widgets()
    with pytest.raises(EditscopeError, match=r"^widget 'x': expected a Widget, got str$"):
        reg.register("not a widget", "x")  # type: ignore[arg-type]
    with pytest.raises(EditscopeError, match="expected a Widget"):
        reg["y"] = 3  # type: ignore[assignment]
    calls: Registry = Registry("factory", check=callable, check_text="callable")
    calls.register(len, "len")
    with pytest.raises(EditscopeError, match=r"^factory 'n': 3 is not callable$"):
        calls.register(3, "n")
    with pytest.raises(EditscopeError, match="needs a name"):
        calls.register(print)  # no name_of: a name must be given
    with pytest.raises(EditscopeError, match="expected a non-empty string"):
        calls.register(print, "")


def test_unknown_name_lists_the_available_ones_on_one_line():
    reg = widgets()
    with pytest.raises(UnknownNameError, match=r"^unknown widget 'c'; available: a, b$") as info:
        reg.get("c")
    assert isinstance(info.value, KeyError) and str(info.value) == "unknown widget 'c'; available: a, b"
    with pytest.raises(KeyError):
        reg["c"]
    assert reg.pop("c", None) is None  # mapping idioms that catch KeyError keep working
    empty: Registry = Registry("dataset", listed_as="registered")
    with pytest.raises(EditscopeError, match=r"^unknown dataset 'x'; registered: none$"):
        empty.get("x")


def test_decorator_use():
    reg: Registry[type] = Registry("kind", expected=type, name_of=lambda cls: cls.__name__.lower())

    @reg.register
    class Thing:
        pass

    assert reg["thing"] is Thing


def test_the_six_registries_are_registries():
    from editscope.cli import COMMANDS
    from editscope.data import DATASETS
    from editscope.edit.plugins import PLUGINS
    from editscope.edit.registry import EDITORS, get_editor
    from editscope.lm.archs import ARCHS
    from editscope.suites import SUITES

    for reg in (COMMANDS, DATASETS, PLUGINS, EDITORS, ARCHS, SUITES):
        assert isinstance(reg, Registry) and len(reg) > 0
    assert get_editor("rome") is EDITORS["rome"] and "rome" in EDITORS
    with pytest.raises(EditscopeError, match="^edit method 'rome' is already registered$"):
        EDITORS.register(EDITORS["memit"], "rome")
    with pytest.raises(EditscopeError, match="^unknown suite 'nope'; registered: counterfact, "):
        SUITES.get("nope")


def test_registry_imports_nothing_from_editscope_but_errors():
    import ast
    import inspect

    import editscope.registry as module

    tree = ast.parse(inspect.getsource(module))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.startswith("editscope")} == {"editscope.errors"}
