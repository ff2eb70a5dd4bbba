"""``editscope models``: list registry models and prepare (convert and cache) them."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "models",
        help="list models; 'models prepare NAME' converts one once",
        description="List the registry models and whether each is prepared (converted and cached under "
        "$EDITSCOPE_HOME). 'editscope models prepare NAME' converts a model now, with progress output.",
    )
    parser.set_defaults(func=_list)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    prep = actions.add_parser("prepare", help="convert a registry model once and cache it",
                              description="Convert a registry model (GGUF from its wheel) to a cached "
                              "safetensors folder; instant when already prepared.")
    prep.add_argument("name", help="registry name, e.g. smollm2-135m")
    prep.set_defaults(func=_prepare)


def _list(_args: argparse.Namespace) -> int:
    import textwrap

    from editscope.lm.loading import DEFAULT_MODEL_NOTE, GGUF_MODELS, is_prepared
    from editscope.lm.tiny import TINY_FAMILIES

    print(f"{'name':<16} {'status':<12} description")
    for name, entry in GGUF_MODELS.items():
        status = "prepared" if is_prepared(name) else "not prepared"
        print(f"{name:<16} {status:<12} {entry.description}")
    for family in TINY_FAMILIES:
        print(f"{'tiny-' + family:<16} {'built':<12} random-init {family} test model (GPT-2 tokenizer)")
    print("Any local Hugging Face model folder is accepted as --model PATH as well.")
    print(f"\nDefault model: {textwrap.fill(DEFAULT_MODEL_NOTE, 100, subsequent_indent='  ')}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from editscope.lm.loading import prepare

    folder = prepare(args.name, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(folder)
    return 0
