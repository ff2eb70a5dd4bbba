"""``editscope patch info|apply|export|revert``: inspect a patch file, write an edited model folder, undo it.

- ``info PATCH`` prints method, model, fingerprint, requests, hparams and each ΔW's norms.
- ``apply PATCH --model M --out DIR`` loads M (must have the patch's fingerprint), applies the patch and
  writes the edited model as a Hugging Face folder DIR (safetensors), with ``editscope-patch.json``.
- ``export PATCH --model M --out DIR``: the same as ``apply`` (a folder that
  ``AutoModelForCausalLM.from_pretrained``, lm-evaluation-harness or vLLM load).
- ``revert PATCH --model DIR --out DIR2`` loads an edited folder, checks every edited parameter holds
  exactly base + ΔW, restores the base weights stored in the patch (bit-exact) and writes DIR2; the result
  has the original model's fingerprint (checked).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from editscope.commands._device import add_device_arguments
from editscope.commands._trust import add_trust_argument

HELP = "inspect, apply or revert an edit patch"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("patch", help=HELP,
                            description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="describe a patch file")
    info.add_argument("patch")
    info.add_argument("--json", action="store_true")
    add_trust_argument(info, "the patch file")
    info.set_defaults(func=run_info)
    for name, helptext in (("apply", "write an edited model folder"), ("revert", "undo a patch on an edited folder")):
        # 'export': an alias of 'apply --out' under the name users of lm-evaluation-harness/vLLM look for
        p = actions.add_parser(name, help=helptext, aliases=["export"] if name == "apply" else [])
        p.add_argument("patch")
        p.add_argument("--model", required=True, help="registry name or local HF folder")
        add_device_arguments(p)
        p.add_argument("--out", required=True, help="output folder (must not exist)")
        add_trust_argument(p, "the patch file; recorded in the folder's editscope-patch.json")
        p.set_defaults(func=run_apply if name == "apply" else run_revert)


def run_info(args: argparse.Namespace) -> int:
    from editscope.edit.intervention import load_intervention
    from editscope.finite import strict_dumps

    patch = load_intervention(args.patch, trust_unverified=args.trust_unverified)
    if patch.kind != "weights":
        return _stored_info(args, patch, strict_dumps)
    return _patch_info(args, patch)


def _stored_info(args: argparse.Namespace, edit, strict_dumps) -> int:
    """A memory or context edit: what it holds (no ΔW: it writes no weight)."""
    data = {"kind": edit.kind, "method": edit.method, "model": edit.model_name, "fingerprint": edit.fingerprint,
            "requests": edit.requests, "hparams": edit.hparams, "holds": edit.fields() | {
                name: list(t.shape) for name, t in edit.tensors().items()}}
    if args.json:
        print(strict_dumps(data, "patch info --json", indent=1))
        return 0
    print(f"kind         {edit.kind} edit (no weight is written)\nmethod       {edit.method}\n"
          f"model        {edit.model_name} (fingerprint {edit.fingerprint})")
    for r in edit.requests:
        print(f"request      {r['prompt'].replace('{}', r['subject'])!r} -> {r['target_new']!r}")
    print(f"hparams      {strict_dumps(edit.hparams, 'patch info: hparams', sort_keys=True)}")
    print(edit.describe())
    return 0


def _patch_info(args: argparse.Namespace, patch) -> int:
    from editscope.finite import require_finite, strict_dumps

    params = {name: {"shape": list(d.shape), "fro_norm": float(d.double().norm()),
                     "max_abs": float(d.abs().max()), "nonzero": int((d != 0).sum())}
              for name, d in sorted(patch.deltas.items())}
    data = {"method": patch.method, "model": patch.model_name, "fingerprint": patch.fingerprint,
            "requests": patch.requests, "hparams": patch.hparams, "parameters": params,
            "has_base_weights": bool(patch.bases)}
    require_finite(params, f"{args.patch}")  # Patch.load refuses non-finite ΔW; this is the printer's backstop
    if args.json:
        print(strict_dumps(data, "patch info --json", indent=1))
        return 0
    print(f"method       {patch.method}\nmodel        {patch.model_name} (fingerprint {patch.fingerprint})")
    for r in patch.requests:
        print(f"request      {r['prompt'].replace('{}', r['subject'])!r} -> {r['target_new']!r}")
    print(f"hparams      {strict_dumps(patch.hparams, 'patch info: hparams', sort_keys=True)}")
    for name, p in params.items():
        print(f"ΔW {name}  shape {p['shape']}  ‖ΔW‖_F {p['fro_norm']:.4g}  max|Δ| {p['max_abs']:.4g}  "
              f"nonzero {p['nonzero']}")
    return 0


def _write(bundle, out: str, note: dict) -> None:
    from editscope.atomic import new_dir

    def build(tmp: Path) -> None:
        bundle.model.save_pretrained(tmp)
        bundle.tokenizer.save_pretrained(tmp)
        (tmp / "editscope-patch.json").write_text(json.dumps(note, indent=1))

    new_dir(out, build)


def _load(args: argparse.Namespace):
    """The patch of ``args.patch`` and, when it was used unverified (``--trust-unverified`` on a file without a
    content digest), the note's record of that."""
    from editscope.edit.intervention import load_intervention
    from editscope.errors import EditscopeError
    from editscope.integrity import trusting

    with trusting(args.trust_unverified) as used:
        patch = load_intervention(args.patch)
    if patch.kind != "weights":
        raise EditscopeError(f"{args.patch}: a {patch.kind} edit ({patch.method}) writes no weight, so no edited model "
                             "folder can hold it; apply it in a run or with the Python API (edit.apply(bundle))")
    return patch, ({"unverified_files": used} if used else {})


def run_apply(args: argparse.Namespace) -> int:
    from editscope.lm import load

    patch, trusted = _load(args)
    bundle = load(args.model, device=args.device, dtype=args.dtype)
    patch.apply(bundle)
    _write(bundle, args.out, {"applied": str(args.patch), "method": patch.method, "base_model": bundle.name,
                              "base_fingerprint": bundle.base_fingerprint, "requests": patch.requests} | trusted)
    print(f"wrote edited model to {args.out}")
    return 0


def run_revert(args: argparse.Namespace) -> int:
    from editscope.errors import EditscopeError
    from editscope.lm import load
    from editscope.lm.loading import fingerprint_model

    patch, trusted = _load(args)
    if not patch.bases:
        raise EditscopeError(f"{args.patch}: holds no base weights (saved without them); revert needs the original "
                             "model")
    bundle = load(args.model, device=args.device, dtype=args.dtype)
    patch.revert_from_bases(bundle)
    fingerprint = fingerprint_model(bundle.model)
    if fingerprint != patch.fingerprint:
        raise EditscopeError(f"reverted weights have fingerprint {fingerprint}, not the patch's base "
                             f"{patch.fingerprint} (the folder holds other changes too)")
    _write(bundle, args.out, {"reverted": str(args.patch), "fingerprint": fingerprint} | trusted)
    print(f"wrote reverted model to {args.out} (fingerprint {fingerprint}, equal to the original)")
    return 0
