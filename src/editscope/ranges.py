"""Declared intervals for numbers a user gives: hyperparameters (:attr:`editscope.edit.hparams.Params.RANGES`)
and command-line options (:func:`option`, an argparse ``type=``). A value outside its range is refused where it is
read, with one line naming the key or option and the range, instead of overflowing or running for hours later.

One rule holds for every range: a *positive* number (a range written with an open lower bound at 0, ``"(0, 10]"``)
is at least :data:`FLOAT32_TINY`, the smallest normal float32. Below it a step size, norm bound, noise level or
share is a denormal or zero once in float32, so it cannot change a float32 weight and the run would be a silent
no-op; the range's text says so by showing the bound itself: ``"(0, 10]"`` reads ``[1.1754944e-38, 10]``."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from editscope.errors import EditscopeError

#: The smallest positive normal float32 (``torch.finfo(torch.float32).tiny``, 1.17549435e-38) as the 8 digits range
#: texts show; the float32 nearest to it is that number exactly, so every value the bound admits is a normal float32.
FLOAT32_TINY_TEXT = "1.1754944e-38"
FLOAT32_TINY = float(FLOAT32_TINY_TEXT)

_RANGE = re.compile(r"^\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*$")


@dataclass(frozen=True)
class Range:
    """An interval a number must lie in, written as in mathematics: ``"(0, 10]"`` (0 excluded, 10 included),
    ``"[0, inf)"`` (no upper bound). ``Params.RANGES`` declares one per numeric hyperparameter, :func:`option` one
    per numeric command-line option.

    A lower bound that leaves out 0 but lets in a number below :data:`FLOAT32_TINY` (``"(0, hi]"``) becomes the
    closed bound ``[1.1754944e-38, hi]``, in :attr:`lo` and in :attr:`text` alike: a positive knob is refused below
    the smallest value that can change a float32 weight. A lower bound of 0 itself (``"[0, hi]"``: 0 means "off")
    is kept as written."""

    text: str
    lo: float
    hi: float
    lo_open: bool
    hi_open: bool

    @classmethod
    def parse(cls, text: str) -> Range:
        m = _RANGE.match(text)
        if not m:
            raise ValueError(f"range {text!r}: write it as [lo, hi], (lo, hi], [lo, hi) or (lo, hi); inf allowed")
        lo, hi = float(m.group(2)), float(m.group(3))
        if not lo <= hi:
            raise ValueError(f"range {text!r}: lower bound above upper bound")
        opening, lo_text, lo_open = m.group(1), m.group(2), m.group(1) == "("
        if (lo == 0 and lo_open) or 0 < lo < FLOAT32_TINY:  # positive: at least the smallest normal float32
            opening, lo_text, lo, lo_open = "[", FLOAT32_TINY_TEXT, FLOAT32_TINY, False
            if hi < lo:
                raise ValueError(f"range {text!r}: upper bound below {FLOAT32_TINY_TEXT}, the smallest normal float32")
        return cls(f"{opening}{lo_text}, {m.group(3)}{m.group(4)}", lo, hi, lo_open, m.group(4) == ")")

    def why(self, value: object) -> str:
        """The reason a refused ``value`` is refused when the interval alone does not say it (a positive number
        below :data:`FLOAT32_TINY`), as a clause to append to the message; else ``""``."""
        if self.lo == FLOAT32_TINY and isinstance(value, int | float) and 0 < value < self.lo:
            return " (below the smallest normal float32 a value cannot change a float32 weight)"
        return ""

    def __contains__(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def __str__(self) -> str:
        return self.text


def option(kind: type[int] | type[float], text: str) -> Callable[[str], int | float]:
    """An argparse ``type=`` that reads an int or a finite float in the range ``text`` (:class:`Range` notation).
    A bad value is argparse's one-line usage error (exit code 2) naming the option:
    ``argument --k: must be a number in (0, 100], got 'nan'``."""
    rng = Range.parse(text)
    what = "an integer" if kind is int else "a number"

    def parse(raw: str) -> int | float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} in {rng}, got {raw!r}") from None
        if not math.isfinite(value) or value not in rng:
            raise argparse.ArgumentTypeError(f"must be {what} in {rng}, got {raw!r}{rng.why(value)}")
        return value

    parse.__name__ = f"{kind.__name__} in {rng}"
    return parse


def check(name: str, value: object, text: str, kind: type[int] | type[float] = float) -> None:
    """The Python API's twin of :func:`option`: refuse ``value`` unless it is an int (``kind=int``) or a finite
    real number in the range ``text``, with one line naming ``name`` (``run_bench: ks[0]: must be ...``)."""
    rng = Range.parse(text)
    what = "an integer" if kind is int else "a number"
    ok_type = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value not in rng:  # type: ignore[arg-type]
        raise EditscopeError(f"{name}: must be {what} in {rng}, got {value!r}{rng.why(value)}")
