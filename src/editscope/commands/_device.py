"""``--device``/``--dtype`` options shared by the commands that load a model (no torch import at start-up)."""

from __future__ import annotations

import argparse

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # editscope.lm.device.DTYPES


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None,
                        help="cpu | cuda | cuda:N | auto (cuda when available, else cpu); default auto "
                        "(see editscope.lm.device)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default=None,
                        help="model weights' precision (default float32; statistics and solves stay float64/32)")
