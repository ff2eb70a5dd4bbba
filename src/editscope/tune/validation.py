"""Validation cases no shipped experiment reports on (DESIGN rule 13: hyperparameters are chosen on validation
cases and reported on others), computed from the shipped configs so it stays true when a config is added.

Reserved per dataset: every record position of every shipped experiment config's ``slice:`` (offset .. offset +
limit - 1; a block without a limit reserves the rest of the file), and the general suite's known-fact pool (the
last ``fact_pool`` records of its ``fact_dataset``, probed by every run that measures general ability). A dataset
built from the same records as another (``counterfact-stream`` holds CounterFact's edit and train files) reserves
them too: a record is the same when its case id and filled prompt are, and a block of such a dataset reserves the
records its rows report on (:func:`~editscope.run.planned.plan_run`: the whole slice, or the sampled cases of a
lifelong chain, which edits the others without reporting on them). The validation slice is the first ``n`` free
positions after the last reserved position below the pool, so it is contiguous (one ``slice:`` of a run config)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from editscope.errors import EditscopeError


@dataclass(frozen=True)
class Reserved:
    """Position intervals ``[start, stop)`` of one dataset, each with the config that reserves it."""

    dataset: str
    intervals: tuple[tuple[int, int, str], ...]

    def by_source(self) -> list[dict[str, Any]]:
        """One entry per config (or pool) that reserves positions: the first and last position and how many it
        reserves (a sampled chain's records are scattered, so its span is not all reserved)."""
        taken: dict[str, set[int]] = {}
        for a, b, who in self.intervals:
            taken.setdefault(who, set()).update(range(a, b))
        return [{"from": min(p), "to": max(p), "records": len(p), "by": who} for who, p in taken.items() if p]

    def describe(self) -> str:
        return ", ".join(f"{e['from']}-{e['to']} ({e['by']})" if e["records"] == e["to"] - e["from"] + 1 else
                         f"{e['records']} records in {e['from']}-{e['to']} ({e['by']})" for e in self.by_source())


def shipped_experiment_configs() -> list[Path]:
    from editscope.paths import configs_dir

    return sorted((configs_dir() / "experiments").glob("*.yaml"))


def reserved_positions(dataset: str, cases: Sequence[Any], configs: Iterable[Path] | None = None) -> Reserved:
    """The positions of ``dataset`` (a registered name, whose loaded ``cases`` are given) the shipped configs report
    on, and the general suite's fact pool (see the module docstring). Reads every config and the datasets that share
    records with ``dataset``; a tune asks once, so nothing is memoised."""
    from editscope.run import load_config
    from editscope.suites.general import GeneralAbilitySuite

    n_records = len(cases)
    same = _SameRecords(dataset, cases)
    intervals: list[tuple[int, int, str]] = []
    for path in (shipped_experiment_configs() if configs is None else configs):
        config = load_config(path)
        for block in config.blocks:
            names = {block.dataset, Path(block.dataset).name}
            for suite in (s for s in block.suites if s.name == "general"):
                general = GeneralAbilitySuite(**suite.options)
                who = f"{path.name} (general suite's fact pool)"
                if general.fact_dataset == dataset:
                    intervals.append((max(0, n_records - general.fact_pool), n_records, who))
                else:
                    intervals += same.intervals(general.fact_dataset, lambda theirs, g=general: theirs[-g.fact_pool:],
                                                who)
            if dataset in names:
                stop = n_records if block.limit is None else min(n_records, block.offset + block.limit)
                intervals.append((block.offset, stop, path.name))
            else:
                intervals += same.intervals(block.dataset, lambda theirs, c=config, b=block: _reported(c, b, theirs),
                                            f"{path.name} ({block.dataset}, the records its rows report on)")
    default = GeneralAbilitySuite()
    if default.fact_dataset == dataset:  # any run may add the general suite: its default pool is never validation
        intervals.append((max(0, n_records - default.fact_pool), n_records, "general suite's default fact pool"))
    return Reserved(dataset, tuple(sorted(intervals)))


class _SameRecords:
    """The positions in ``dataset`` of records another dataset shares with it (same case id, same filled prompt; a
    dataset of another format holds other records and is not read)."""

    def __init__(self, dataset: str, cases: Sequence[Any]) -> None:
        self.dataset = dataset
        self._cases = cases
        self._index: dict[tuple[str, str], int] | None = None
        self._shares: dict[str, list[Any] | None] = {}  # other dataset -> its cases, None: it shares no record

    def intervals(self, other: str, reported: Callable[[list[Any]], list[Any]], who: str
                  ) -> list[tuple[int, int, str]]:
        """``[start, stop)`` runs of the positions of ``reported(cases of other)`` in this dataset, or [] when
        ``other`` shares no record with it (then nothing of ``other`` is planned)."""
        cases = self._shared(other)
        if cases is None:
            return []
        assert self._index is not None
        positions = sorted({self._index[k] for c in reported(cases) if (k := _identity(c)) in self._index})
        runs: list[tuple[int, int, str]] = []
        for p in positions:
            if runs and runs[-1][1] == p:
                runs[-1] = (runs[-1][0], p + 1, who)
            else:
                runs.append((p, p + 1, who))
        return runs

    def _shared(self, other: str) -> list[Any] | None:
        """The cases of ``other`` when it shares a record with this dataset, else None (each read once)."""
        from editscope.data import DATASETS, load_cases

        if other not in self._shares:
            self._shares[other] = None
            if (other != self.dataset and other in DATASETS and self.dataset in DATASETS
                    and DATASETS[other].format == DATASETS[self.dataset].format):
                if self._index is None:
                    self._index = {_identity(c): i for i, c in enumerate(self._cases)}
                cases = load_cases(other)
                if any(_identity(c) in self._index for c in cases):
                    self._shares[other] = cases
        return self._shares[other]


def _identity(case: Any) -> tuple[str, str]:
    return (str(case.case_id), case.request.text)


def _reported(config: Any, block: Any, cases: list[Any]) -> list[Any]:
    """Those of ``cases`` (all of ``block``'s dataset) that the rows of ``block``, a block of ``config``, report on."""
    from editscope.run.planned import plan_run

    ids = {case_id for dataset, case_id, _method in plan_run(config).rows if dataset == block.label}
    return [c for c in cases if str(c.case_id) in ids]


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
                             f"{reserved.describe()}); "
                             "ask for fewer cases (--max-cases)")
    return start


def validation_slice(dataset: str, n: int, configs: Iterable[Path] | None = None, *,
                     offset: int | None = None) -> dict:
    """``{"dataset", "offset", "limit", "records", "reserved", "chosen", "overlap"}``: ``n`` records of ``dataset`` no
    shipped config reports on; or, with ``offset``, the ``n`` records from there, ``overlap`` counting those a
    shipped config reports on (per config: a tune that must go where there is no free run says so)."""
    from editscope.data import load_cases

    cases = load_cases(dataset)
    n_records = len(cases)
    reserved = reserved_positions(dataset, cases, configs)
    overlap: list[dict[str, Any]] = []
    if offset is None:
        start, chosen = free_start(reserved, n_records, n), "the first run of free records"
    else:
        if offset < 0 or offset + n > n_records:
            raise EditscopeError(f"validation slice: {dataset} has {n_records} records; records {offset}.."
                                 f"{offset + n - 1} do not fit (--validation-offset, --max-cases)")
        start, chosen = offset, "by hand (--validation-offset)"
        inside = Reserved(dataset, tuple((max(a, offset), min(b, offset + n), w) for a, b, w in reserved.intervals
                                         if a < offset + n and b > offset))
        overlap = [{"by": e["by"], "records": e["records"]} for e in inside.by_source()]
    return {"dataset": dataset, "offset": start, "limit": n, "records": n_records, "reserved": reserved.by_source(),
            "chosen": chosen, "overlap": overlap}


__all__ = ["Reserved", "free_start", "reserved_positions", "shipped_experiment_configs", "validation_slice"]
