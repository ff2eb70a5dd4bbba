"""The rows a run is planned to write, and how many of them its files hold.

A run's plan is its config cut into the groups of its shard (:func:`~editscope.run.blocks.load_blocks`,
:func:`~editscope.run.blocks.assign_groups`) and, per group and method, the rows the runner writes (one per case
after the group's last edit, plus the checkpoint rows of ``sequential_batches``: the runner's own unit list); with an
``lm_eval`` key also one ``lm_eval.jsonl`` row per task for the unedited model and at every chain checkpoint the hook
is due (:func:`~editscope.run.lmeval.due_points`). Nothing is loaded but the config's cases (no model).

Every reader that could take a run for finished counts its files against the plan: a resume recomputes what is
missing (the runner), a ``models`` rerun resumes a model whose rows are fewer than planned even where its
``run.json`` says complete (:mod:`editscope.run.models`), ``merge`` marks a merged run ``incomplete`` with the count
of missing rows and the torn line of a shard (:mod:`editscope.run.merge`), and the report prints ``n of N rows``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from editscope.errors import EditscopeError
from editscope.jsonl import read_lines, torn_line
from editscope.rowdigest import damage, required_in
from editscope.run.blocks import assign_groups, load_blocks
from editscope.run.config import NO_EDIT, RunConfig
from editscope.run.lmeval import LM_EVAL_FILE, due_points
from editscope.run.plan import Unit, reprobe_seed
from editscope.run.store import RESULTS, read_sound_results, row_key, unit_key
from editscope.run.suites import SuiteFactory

RowKey = tuple[str, str, str]
#: an lm_eval.jsonl row: (dataset, group, method, edits applied, task); the unedited model's has dataset None
LmEvalKey = tuple[Any, Any, str, int, str]


@dataclass(frozen=True)
class Plan:
    """The keys of every row a run (one shard of it) writes, in the runner's order."""

    rows: tuple[RowKey, ...]
    lm_eval: tuple[LmEvalKey, ...] = ()
    #: the most edits any chain of the config applies (``sequential_batches``; 0 otherwise)
    longest_chain: int = 0


def plan_run(config: RunConfig, *, limit: int | None = None, shard: tuple[int, int] = (0, 1),
             suite_factories: Mapping[str, SuiteFactory] | None = None) -> Plan:
    """The :class:`Plan` of ``config`` run with ``limit`` and ``shard`` (loads the cases, validated, and the suites;
    an unknown suite or dataset is the loader's :class:`~editscope.errors.EditscopeError`)."""
    mode = config.mode
    blocks = load_blocks(config, limit=limit, suite_factories=suite_factories)
    longest = longest_chain(config, blocks)
    assign_groups(blocks, config.mode.group_size, shard)
    labels = [m.label for m in config.methods]

    def units(b: Any, g: int, members: list[int]) -> list[Unit]:  # the runner's units of a group
        return mode.units(members, lambda i: len(b.requests[i]), reprobe_seed(config.seed, b.label, g))

    rows = tuple(unit_key(b.label, b.cases[i].case_id, label, e) for b in blocks for g, members in b.groups
                 for label in labels for i, e in units(b, g, members))
    lm: list[LmEvalKey] = []
    spec = config.lm_eval
    if spec is not None:
        if spec.checkpoints is None or 0 in spec.checkpoints:
            lm += [(None, None, NO_EDIT, 0, t) for t in spec.tasks]
        for b in blocks:
            for g, members in b.groups:
                points = due_points(spec, mode.checkpoints, mode.batch, [len(b.requests[i]) for i in members])
                lm += [(b.label, g, label, applied, t) for label in labels for _r, applied in points
                       for t in spec.tasks]
    return Plan(rows, tuple(lm), longest)


def longest_chain(config: RunConfig, blocks: Sequence[Any]) -> int:
    """The most edits any chain of ``config`` applies over ``blocks`` (their cases' requests, before sharding;
    0 outside ``sequential_batches``)."""
    if config.mode.chain_schedule is None:
        return 0
    size = config.mode.group_size
    return max((sum(len(r) for r in b.requests[s:s + size]) for b in blocks for s in range(0, len(b.cases), size)),
               default=0)


def check_reach(config: RunConfig, blocks: Sequence[Any]) -> None:
    """Every ``lm_eval.checkpoints`` count is reached by some chain over ``blocks``: one line naming the first that
    is not. Checked when a run starts, not when the config is parsed (it reads the cases)."""
    spec = config.lm_eval
    if spec is None or not spec.checkpoints:
        return
    longest = longest_chain(config, blocks)
    unreached = sorted((edits, i) for i, edits in enumerate(spec.checkpoints) if edits > longest)
    if unreached:
        edits, i = unreached[0]
        raise EditscopeError(f"{config.where}: key 'lm_eval.checkpoints[{i}]': {edits} edits: no chain reaches it "
                                 f"(the longest applies {longest} edits: batch {config.mode.batch} x rounds "
                                 f"{config.mode.rounds} cases and their requests)")


def lm_eval_key(row: Mapping[str, Any]) -> LmEvalKey:
    return (row.get("dataset"), row.get("group"), row.get("method"), row.get("edits_applied"), row.get("task"))


def lm_eval_missing_text(planned: int, missing: Sequence[LmEvalKey]) -> str:
    """``N of M planned lm_eval.jsonl rows (K missing, the first: task T at ...)`` for a non-empty ``missing``."""
    d, g, method, applied, task = missing[0]
    at = "the unedited model" if d is None else f"{applied} edit(s) (dataset {d}, group {g}, method {method})"
    return (f"{planned - len(missing)} of {planned} planned {LM_EVAL_FILE} rows ({len(missing)} missing, the "
            f"first: task {task} at {at})")


@dataclass(frozen=True)
class RowCount:
    """A run directory's files counted against its :class:`Plan`."""

    planned: int
    present: int  # planned rows the results file holds
    missing: tuple[RowKey, ...]
    lm_eval_planned: int = 0
    lm_eval_missing: tuple[LmEvalKey, ...] = ()
    torn: str | None = None  # ``results.jsonl:line N`` when its last line is torn (a killed write)
    #: one line per row its digest does not vouch for (counted as missing)
    damaged: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.missing and not self.lm_eval_missing and self.torn is None and not self.damaged

    def line(self, where: str | Path) -> str:
        """One line saying what is missing (empty when nothing is)."""
        if self.complete:
            return ""
        parts = []
        if self.missing:
            d, case, method = self.missing[0]
            parts.append(f"{self.present} of {self.planned} planned rows ({len(self.missing)} missing, the first: "
                         f"dataset {d}, case {case}, method {method})")
        if self.lm_eval_missing:
            parts.append(lm_eval_missing_text(self.lm_eval_planned, self.lm_eval_missing))
        if self.torn:
            parts.append(f"{self.torn}: a torn last line (a killed write), not counted")
        if self.damaged:
            parts.append(f"{self.damaged[0]}, not counted" + (f" ({len(self.damaged)} such rows)"
                                                              if len(self.damaged) > 1 else ""))
        return f"{where}: " + "; ".join(parts)


def count_rows(run_dir: str | Path, plan: Plan) -> RowCount:
    """Count ``run_dir``'s ``results.jsonl`` (and ``lm_eval.jsonl``) against ``plan``; the files are only read."""
    run_dir = Path(run_dir)
    rows, damaged = read_sound_results(run_dir / RESULTS)
    have = {row_key(r) for r in rows}
    missing = tuple(k for k in plan.rows if k not in have)
    required = required_in(run_dir)
    lm_have = {lm_eval_key(r) for _, r in read_lines(run_dir / LM_EVAL_FILE)
               if isinstance(r, dict) and not damage(r, required)}
    lm_missing = tuple(k for k in plan.lm_eval if k not in lm_have)
    torn = torn_line(run_dir / RESULTS)
    return RowCount(len(plan.rows), len(plan.rows) - len(missing), missing, len(plan.lm_eval), lm_missing,
                    f"{run_dir / RESULTS}:line {torn}" if torn else None, tuple(damaged))


def planned_count(meta: Mapping[str, Any], suite_factories: Mapping[str, SuiteFactory] | None = None) -> int | None:
    """The number of results rows the run of ``meta`` (its ``run.json``) plans: its ``planned_rows``, else counted
    from its config; None when neither can be had (a dataset or suite that is not here)."""
    from editscope.errors import EditscopeError

    if isinstance(meta.get("planned_rows"), int):
        return int(meta["planned_rows"])
    try:
        config = RunConfig.from_dict(dict(meta["config"]))
        shard = tuple(meta.get("shard") or (0, 1))
        return len(plan_run(config, limit=meta.get("limit"), shard=(int(shard[0]), int(shard[1])),
                            suite_factories=suite_factories).rows)
    except (EditscopeError, KeyError, TypeError, ValueError):
        return None


def rows_text(n: int, planned: int | None) -> str:
    """``n`` rows as the report prints them: ``3 of 4 planned (1 missing: resume the run)`` when short."""
    if planned is None or n >= planned:
        return str(n)
    return f"{n} of {planned} planned ({planned - n} missing: resume the run to compute them)"


__all__ = ["LmEvalKey", "Plan", "RowCount", "RowKey", "count_rows", "lm_eval_key", "lm_eval_missing_text", "plan_run",
           "planned_count", "rows_text"]
