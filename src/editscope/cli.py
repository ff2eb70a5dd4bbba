"""The ``editscope`` command line. Each subcommand is one module in ``editscope.commands`` exposing
``register(subparsers)``; adding a command is one file plus one ``COMMANDS.register(module, name)`` line (the
module is imported only when the parser is built)."""

from __future__ import annotations

import argparse
import importlib
import sys

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
    "editscope.commands.inspect",
):
    COMMANDS.register(_module, _module.rpartition(".")[2])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="editscope",
        description="Edit the factual knowledge of language models and measure everything an edit does.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as given (run: the command that resumes)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EditscopeError as exc:
        print(f"editscope: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("editscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
