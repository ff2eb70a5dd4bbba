"""``--plugin-module``: whatever a module raises while it is imported is one line naming the module and the
exception; names that are not module names are refused before anything is imported."""

from __future__ import annotations

import sys

import pytest

from editscope.cli import main
from editscope.edit.plugins import import_plugin_modules
from editscope.errors import EditscopeError

BODIES = {
    "raises_value_error": "raise ValueError('bad setting in the plug-in')\n",
    "has_a_syntax_error": "def broken(:\n    pass\n",
    "recurses_forever": "def f():\n    return f()\nf()\n",
    "imports_a_missing_module": "import no_such_dependency_xyz\n",
}


@pytest.fixture
def modules(tmp_path, monkeypatch):
    for name, body in BODIES.items():
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in BODIES:
        sys.modules.pop(name, None)


@pytest.mark.parametrize(("module", "kind"), [
    ("raises_value_error", "ValueError: bad setting in the plug-in"),
    ("has_a_syntax_error", "SyntaxError"),
    ("recurses_forever", "RecursionError"),
    ("imports_a_missing_module", "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
])
def test_any_exception_on_import_is_one_line(modules, module, kind):
    with pytest.raises(EditscopeError, match=f"plug-in module '{module}' cannot be imported: {kind}"):
        import_plugin_modules([module])


@pytest.mark.parametrize("name", ["", "../x", "x.py", "my plugins", "a..b", ".x"])
def test_names_that_are_not_module_names_are_refused_up_front(modules, name):
    with pytest.raises(EditscopeError, match="not a Python module name"):
        import_plugin_modules(["raises_value_error", name])  # refused before the first is imported
    assert "raises_value_error" not in sys.modules


def test_the_command_line_says_it_in_one_line(modules, capsys):
    assert main(["--plugin-module", "raises_value_error", "models"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ValueError: bad setting in the plug-in" in err[0] and "Traceback" not in err[0]
    assert main(["--plugin-module", "", "models"]) != 0
    assert "not a Python module name" in capsys.readouterr().err
