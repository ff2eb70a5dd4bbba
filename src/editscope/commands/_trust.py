"""``--trust-unverified``, shared by the commands that read back a file editscope wrote earlier (a chain checkpoint, a
patch, a statistics export, tune state, a reproduction archive): see :mod:`editscope.integrity`."""

from __future__ import annotations

import argparse

TRUST_HELP = ("use files written by an earlier editscope (no content digest) unverified instead of refusing them; "
              "each file so used is recorded with the output")


def add_trust_argument(parser: argparse.ArgumentParser, what: str = "") -> None:
    parser.add_argument("--trust-unverified", action="store_true",
                        help=TRUST_HELP + (f" ({what})" if what else ""))
