"""Comparing a run's rows made on two devices (tests/run/test_gpu_agreement.py; the comparison itself is tested on
the CPU in tests/run/test_device_rows.py, so a GPU session does not spend its minutes on a bug of the test)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TIMING = ("seconds", "time", "_s")


def numbers(tree, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a row's metrics, keyed by their path (timings left out)."""
    if isinstance(tree, dict):
        out: dict[str, float] = {}
        for key, value in tree.items():
            out |= numbers(value, f"{prefix}/{key}")
        return out
    if isinstance(tree, list):
        return {k: v for i, x in enumerate(tree) for k, v in numbers(x, f"{prefix}[{i}]").items()}
    if isinstance(tree, bool) or not isinstance(tree, (int, float)) or prefix.endswith(TIMING):
        return {}
    return {prefix: float(tree)}


@dataclass
class RowGaps:
    """Pre-edit numbers (keys ending ``_pre``) must agree to ``pre_tol``, relative above 1 (perplexities); the
    post-edit ones are summarised by their normalised gaps ``|b - a| / max(1, |a|)``."""

    pre_misses: list[tuple] = field(default_factory=list)  # (where, a, b) beyond pre_tol
    pre_worst: float = 0.0  # the largest normalised pre-edit gap
    post_gaps: list[float] = field(default_factory=list)
    worst: float = 0.0
    where: str = ""

    @property
    def post_mean(self) -> float:
        return sum(self.post_gaps) / len(self.post_gaps) if self.post_gaps else 0.0


def row_gaps(rows_a: list[dict], rows_b: list[dict], pre_tol: float) -> RowGaps:
    """Every numeric metric of each row pair (same dataset and case, same keys) compared; NaN only against NaN."""
    gaps = RowGaps()
    for a_row, b_row in zip(rows_a, rows_b, strict=True):
        assert (a_row["dataset"], a_row["index"]) == (b_row["dataset"], b_row["index"])
        a, b = numbers(a_row["metrics"]), numbers(b_row["metrics"])
        assert a.keys() == b.keys() and a
        for key, want in a.items():
            got, where = b[key], f"{a_row['dataset']}#{a_row['index']}{key}"
            if math.isnan(want) or math.isnan(got):
                assert math.isnan(want) and math.isnan(got), where
                continue
            gap = abs(got - want) / max(1.0, abs(want))
            if key.endswith("_pre"):
                gaps.pre_worst = max(gaps.pre_worst, gap)
                if gap > pre_tol:
                    gaps.pre_misses.append((where, want, got))
                continue
            gaps.post_gaps.append(gap)
            if gap > gaps.worst:
                gaps.worst, gaps.where = gap, where
    return gaps
