"""Validation cases no shipped experiment reports on (DESIGN rule 13: hyperparameters are chosen on validation
cases and reported on others), computed from the shipped configs so it stays true when a config is added.

Reserved per dataset: every record position of every shipped experiment config's ``slice:`` (offset .. offset +
limit - 1; a block without a limit reserves the rest of the file), and the general suite's known-fact pool (the
last ``fact_pool`` records of its ``fact_dataset``, probed by every run that measures general ability). The
validation slice is the first ``n`` free positions after the last reserved position below the pool, so it is
contiguous (one ``slice:`` of a run config)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from editscope.errors import EditscopeError


@dataclass(frozen=True)
class Reserved:
    """Position intervals ``[start, stop)`` of one dataset, each with the config that reserves it."""

    dataset: str
    intervals: tuple[tuple[int, int, str], ...]


def shipped_experiment_configs() -> list[Path]:
    from editscope.paths import configs_dir

    return sorted((configs_dir() / "experiments").glob("*.yaml"))


def reserved_positions(dataset: str, n_records: int, configs: Iterable[Path] | None = None) -> Reserved:
    """The positions of ``dataset`` (a registered name) the shipped configs report on, and the general suite's
    fact pool (see the module docstring)."""
    from editscope.run import load_config
    from editscope.suites.general import GeneralAbilitySuite

    intervals: list[tuple[int, int, str]] = []
    for path in configs if configs is not None else shipped_experiment_configs():
        config = load_config(path)
        for block in config.blocks:
            names = {block.dataset, Path(block.dataset).name}
            pool_of = [s for s in block.suites if s.name == "general"]
            for suite in pool_of:
                general = GeneralAbilitySuite(**suite.options)
                if general.fact_dataset == dataset:
                    intervals.append((max(0, n_records - general.fact_pool), n_records,
                                      f"{path.name} (general suite's fact pool)"))
            if dataset in names:
                stop = n_records if block.limit is None else min(n_records, block.offset + block.limit)
                intervals.append((block.offset, stop, path.name))
    default = GeneralAbilitySuite()
    if default.fact_dataset == dataset:  # any run may add the general suite: its default pool is never validation
        intervals.append((max(0, n_records - default.fact_pool), n_records, "general suite's default fact pool"))
    return Reserved(dataset, tuple(sorted(intervals)))


def free_start(reserved: Reserved, n_records: int, n: int) -> int:
    """The first position of a contiguous run of ``n`` free positions, searched from the end of the reserved
    prefix onwards; an error naming the dataset when there is none."""
    taken = sorted((a, b) for a, b, _ in reserved.intervals if b > a)
    start = 0
    for a, b in taken:
        if a - start >= n:
            break
        start = max(start, b)
    if start + n > n_records or any(a < start + n and b > start for a, b in taken):
        raise EditscopeError(f"validation slice: {reserved.dataset} has no {n} consecutive records that no shipped "
                             f"experiment config reports on ({n_records} records; reserved: "
                             f"{', '.join(f'{a}-{b - 1} ({w})' for a, b, w in reserved.intervals)}); "
                             "ask for fewer cases (--max-cases)")
    return start


def validation_slice(dataset: str, n: int, configs: Iterable[Path] | None = None) -> dict:
    """``{"dataset", "offset", "limit", "reserved"}``: ``n`` records of ``dataset`` no shipped config reports on."""
    from editscope.data import load_cases

    n_records = len(load_cases(dataset))
    reserved = reserved_positions(dataset, n_records, configs)
    offset = free_start(reserved, n_records, n)
    return {"dataset": dataset, "offset": offset, "limit": n, "records": n_records,
            "reserved": [{"from": a, "to": b - 1, "by": w} for a, b, w in reserved.intervals]}


__all__ = ["Reserved", "free_start", "reserved_positions", "shipped_experiment_configs", "validation_slice"]
