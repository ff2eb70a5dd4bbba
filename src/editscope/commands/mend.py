"""``editscope mend train``: train MEND's editor networks for a model on the zsRE training sample (resumable) and
cache them under EDITSCOPE_HOME, keyed by the model's fingerprint, with a snapshot at every checkpointed step;
``--method mend`` then uses the one at its hparams' ``steps``."""

from __future__ import annotations

import argparse

from editscope.commands._device import add_device_arguments

HELP = "train MEND's editor networks (Mitchell et al. 2022)"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("mend", help=HELP,
                            description="Train MEND's editor networks for a model (see 'editscope mend train -h').")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser(
        "train", help="train (or resume training) the editor for a model",
        description="Train MEND on the shared zsRE sample (rephrase: generalisation loss, loc: locality KL) on CPU, "
        "with a progress bar; checkpoints (safetensors) resume automatically; a snapshot of the editor at every "
        "checkpointed step lets an edit (and 'editscope tune') use any of them as 'steps'; writes loss_curve.png "
        "beside them.")
    train.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    add_device_arguments(train)
    train.add_argument("--steps", type=int, default=None, help="total training steps (default: the hparams' steps)")
    train.add_argument("--hparams", help="hparams YAML (default: configs/hparams/mend/<model>.yaml)")
    train.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                       help="override hparams (repeatable)")
    train.add_argument("--restart", action="store_true", help="ignore an existing checkpoint and start over")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--json", action="store_true", help="print the result as JSON")
    train.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from editscope.edit import get_editor, parse_overrides
    from editscope.edit.mend.core import saved_steps
    from editscope.edit.mend.train import train
    from editscope.lm import load

    editor = get_editor("mend")
    bundle = load(args.model, device=args.device, dtype=args.dtype)
    hp = editor.load_hparams(bundle, args.hparams, parse_overrides(args.set))
    result = train(bundle, hp, steps=args.steps, progress=not args.no_progress, resume=not args.restart,
                   log=lambda msg: print(msg, flush=True))
    last = result.history[-min(len(result.history), 25):]
    mean = {k: sum(h[k] for h in last) / len(last) for k in ("loss", "edit", "loc", "pre")} if last else {}
    out = {"model": bundle.name, "checkpoint": str(result.checkpoint), "snapshot": str(result.snapshot),
           "saved_steps": saved_steps(result.checkpoint.parent), "steps": result.steps,
           "seconds": result.seconds, "final_mean_of_last_25": mean,
           "loss_curve": str(result.curve) if result.curve else None}
    if args.json:
        from editscope.finite import strict_dumps

        print(strict_dumps(out, "mend train --json", indent=1))
    else:
        print(f"MEND editor for {bundle.name}: {result.steps} steps, {result.seconds:.1f} s of training")
        if mean:
            print(f"last {len(last)} steps: L_e {mean['edit']:.3f} (NLL before the edit {mean['pre']:.3f}), "
                  f"L_loc {mean['loc']:.4f}")
        print(f"checkpoint: {result.checkpoint}")
        print(f"editor after {args.steps or hp.steps} steps: {result.snapshot} (saved steps: "
              f"{', '.join(map(str, out['saved_steps']))})")
        if result.curve:
            print(f"loss curve: {result.curve}")
    return 0
