"""The ``editscope`` command line. Each subcommand is one module in ``editscope.commands`` exposing
``register(subparsers)``; adding a command is one file plus one ``COMMANDS.register(module, name)`` line (the
module is imported only when the parser is built)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from editscope.errors import EditscopeError
from editscope.registry import Registry

COMMANDS: Registry[str] = Registry("command", expected=str)
"""Command name -> the module that adds it (``register(subparsers)``)."""

for _module in (
    "editscope.commands.models",
    "editscope.commands.score",
    "editscope.commands.edit",
    "editscope.commands.patch",
    "editscope.commands.simulate",
    "editscope.commands.run",
    "editscope.commands.merge",
    "editscope.commands.report",
    "editscope.commands.demo",
    "editscope.commands.locate",
    "editscope.commands.bench",
    "editscope.commands.mend",
    "editscope.commands.stats",
    "editscope.commands.configs",
    "editscope.commands.tune",
    "editscope.commands.inspect",
    "editscope.commands.plan",
):
    COMMANDS.register(_module, _module.rpartition(".")[2])


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (``editscope CMD: error: argument --x: ...``, exit code 2): the line
    names the argument; ``--help`` shows the usage. Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _non_utf8_argument(argv: Sequence[str]) -> str | None:
    """The usage error for the first argument that is not valid UTF-8 (Python keeps such bytes as lone surrogates,
    which would reach a tokenizer or a file name), naming the option it belongs to; None when all are text."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = ord(arg[exc.start])
            byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"code point U+{bad:04X}"
            option = next((a.split("=")[0] for a in reversed(argv[:i + 1]) if a.startswith("-")), "")
            what = f"argument {option}" if option.isascii() and option.isprintable() and option else f"argument {i + 1}"
            return f"{what}: not valid UTF-8 text ({byte} at position {exc.start + 1})"
    return None


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))


def _version() -> str:
    """``editscope X (python ..., torch ..., transformers ...)``, read without importing torch."""
    import platform
    from importlib import metadata

    from editscope import __version__

    def dist(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"editscope {__version__} (python {platform.python_version()}, torch {dist('torch')}, "
            f"transformers {dist('transformers')})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="editscope",
        description="Edit the factual knowledge of language models and measure everything an edit does.",
    )
    parser.add_argument("--version", action="version", version=_version(),
                        help="print editscope's version and those of the libraries that shape its numbers")
    parser.add_argument("--plugin-module", dest="global_plugin_modules", action="append", default=[],
                        metavar="MODULE", help="import a Python module before the command (repeatable): what it "
                        "registers (a model family, an editor, a plug-in, a suite, a metric) is known to every "
                        "command (edit, inspect, plan, tune, locate, report); a run config names its own in "
                        "plugin_modules")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if problem := _non_utf8_argument(argv):
        print(f"editscope: error: {problem}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as given (run: the command that resumes)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if args.global_plugin_modules:
            from editscope.edit.plugins import import_plugin_modules

            import_plugin_modules(args.global_plugin_modules)
        return int(args.func(args) or 0)
    except EditscopeError as exc:
        print(f"editscope: error: {_one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # the environment (disk full, permissions, a file in the way) where no check named it
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"editscope: error: {where}{_one_line(exc.strerror or str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("editscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
