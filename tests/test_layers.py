"""DESIGN "Shape": imports follow the data flow. A package never imports one above it in

    metrics < lm < data, stats < locate < edit < suites < run < tune < report < commands

(``data`` and ``stats`` share a level). Top-level modules (``editscope/errors.py``, ``atomic.py``, ``paths.py``,
``yamlio.py``, ``jsonl.py``, ``plotting.py``, ...) sit below every package and may be imported by any of them.
Every import is checked, also those inside functions (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import editscope

SRC = Path(editscope.__file__).resolve().parent

LEVELS = {"metrics": 0, "lm": 1, "data": 2, "stats": 2, "locate": 3, "edit": 4, "suites": 5, "run": 6,
          "tune": 7, "report": 8, "commands": 9}

EXCEPTIONS: set[tuple[str, str]] = set()
"""(file relative to src/editscope, imported module) pairs allowed to break the order, each with a comment
saying why it cannot move. None today."""


def _module_parts(rel: Path) -> list[str]:
    parts = ["editscope", *rel.with_suffix("").parts]
    return parts[:-1] if rel.name == "__init__.py" else parts


def _imported(tree: ast.AST, rel: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``; relative imports resolved against ``rel``."""
    own = _module_parts(rel)
    package = own if rel.name == "__init__.py" else own[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((node.lineno, module))
            if node.module is None or module in ("editscope",):  # `from editscope import run`: each name counts
                out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return out


def _levels(root: Path) -> dict[str, tuple[int, str]]:
    """Level of every package, and of every top-level module that imports a package (``simulate.py`` imports
    metrics): such a module sits at the highest package it imports, so only packages at or above that level may
    import it. Top-level modules that import no package are below everything (level -1)."""
    levels = {name: (level, name) for name, level in LEVELS.items()}
    for path in sorted(root.glob("*.py")):
        imported = [m.split(".") for _, m in _imported(ast.parse(path.read_text(encoding="utf-8")), Path(path.name))]
        above = [(LEVELS[p[1]], p[1]) for p in imported if p[0] == "editscope" and len(p) > 1 and p[1] in LEVELS]
        levels[path.stem] = max(above, default=(-1, "none"))
    return levels


def layer_violations(root: Path = SRC) -> list[str]:
    found = []
    levels = _levels(root)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if len(rel.parts) < 2 or rel.parts[0] not in LEVELS:
            continue
        own = rel.parts[0]
        for line, module in _imported(ast.parse(path.read_text(encoding="utf-8"), str(path)), rel):
            parts = module.split(".")
            if parts[0] != "editscope" or len(parts) < 2 or parts[1] not in levels:
                continue
            level, via = levels[parts[1]]
            if level > LEVELS[own] and (rel.as_posix(), module) not in EXCEPTIONS:
                why = f"{parts[1]} is above {own}" if parts[1] == via else f"{parts[1]} imports {via}, above {own}"
                found.append(f"src/editscope/{rel.as_posix()}:{line}: {own} imports {module} ({why})")
    return found


def test_no_package_imports_one_above_it():
    violations = layer_violations()
    assert not violations, "imports against the layer order:\n" + "\n".join(violations)


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "metrics"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("def f():\n    from editscope.run.summary import summarize\n")
    (pkg / "rel.py").write_text("from ..report import figures\n")
    (pkg / "ok.py").write_text("import numpy\nfrom editscope.atomic import atomic_write_text\nfrom . import bad\n")
    (pkg / "via.py").write_text("from editscope import tool\n")
    (tmp_path / "atomic.py").write_text("from editscope.errors import EditscopeError\n")
    (tmp_path / "tool.py").write_text("from editscope.suites import base\n")
    violations = layer_violations(tmp_path)
    assert violations == [
        "src/editscope/metrics/bad.py:2: metrics imports editscope.run.summary (run is above metrics)",
        "src/editscope/metrics/rel.py:1: metrics imports editscope.report (report is above metrics)",
        "src/editscope/metrics/via.py:1: metrics imports editscope.tool (tool imports suites, above metrics)",
    ]


def test_every_package_has_a_level():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(LEVELS), f"packages without a level in the layer order: {packages - set(LEVELS)}"


def test_tables_sits_at_the_bottom():
    """``editscope/tables.py`` (the Table model every package renders with) imports the standard library and
    top-level editscope modules that import no package, so that ``run/summary_tables.py`` and anything below it may use
    it."""
    import sys

    levels = _levels(SRC)
    assert levels["tables"][0] == -1
    for _, module in _imported(ast.parse((SRC / "tables.py").read_text(encoding="utf-8")), Path("tables.py")):
        parts = module.split(".")
        if parts[0] == "editscope":
            assert len(parts) == 2 and levels.get(parts[1], (0,))[0] == -1, module
        else:
            assert parts[0] in sys.stdlib_module_names or parts[0] == "__future__", module
