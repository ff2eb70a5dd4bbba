"""``--forward``/``--vstar-batch``: the edit runtime settings (editscope.edit.runtime) of the commands that edit."""

from __future__ import annotations

import argparse
from typing import Any

FORWARD_NAMES = ("fast", "full", "plain")  # editscope.edit.objective.forward.FORWARDS (no torch import at start-up)


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--forward", choices=FORWARD_NAMES, default=None,
                        help="how the v*/z optimisation runs its forward: fast (only what δ can reach), full (the "
                        "whole model) or plain (the reference code's cost); equal to float rounding; default "
                        "$EDITSCOPE_FORWARD, else fast. Recorded with the results")
    parser.add_argument("--vstar-batch", default=None, metavar="auto|N",
                        help="requests whose v*/z share one batched forward per step (auto: as many as fit); "
                        "default $EDITSCOPE_VSTAR_BATCH, else auto. Recorded with the results")


def runtime_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The runtime settings given on the command line (None: not given)."""
    return {"forward": args.forward, "vstar_batch": args.vstar_batch}
