"""The ``editscope`` command line. Each subcommand is one module in ``editscope.commands`` exposing ``HELP`` (its
one line in ``editscope --help``) and ``register(subparsers)``; adding a command is one file plus one
``COMMANDS.register(module, name)`` line.

Only the command being run builds its parser: ``register`` reads the registries its choices come from (editors,
locating methods, ...), which imports torch and every editor, so ``editscope --help`` or ``plan --help`` would
otherwise pay seconds for parsers they never use. The other commands appear in the listing by their ``HELP``."""

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
    "editscope.commands.judge_agreement",
    "editscope.commands.rejudge",
):
    COMMANDS.register(_module, _module.rpartition(".")[2].replace("_", "-"))


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


def _command_word(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (the first word that is not a global option or its value), or None."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if not arg.startswith("-"):
            return arg
        takes_value = len(arg) > 2 and "=" not in arg and "--plugin-module".startswith(arg)
        i += 2 if takes_value else 1
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command-line parser. With ``argv``, only the command it names gets its full parser (the others are
    listed by their ``HELP``); without, every command's (for tools that walk the whole interface)."""
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
    chosen = None if argv is None else _command_word(argv)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        if argv is None or name == chosen:
            module.register(sub)
        else:
            sub.add_parser(name, help=module.HELP, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
