"""``merge``: combine the output directories of a sharded run into one (dedupe rows, check that every shard
ran the same config on the same model), ordered as an unsharded run writes them; a lifelong run's ``lm_eval.jsonl``
rows (:mod:`editscope.run.lmeval`) are merged the same way, deduplicated by their key.

The merged rows are counted against the config's plan (:mod:`editscope.run.planned`): the merged run is
``complete`` only when every planned row (results and lm_eval rows) is there (from any shard, or from an unsharded
run stopped partway whose other chains shards ran: the rows of one config are the same whichever process computed
them) and no shard's file ends in a torn line (a killed write, which a reader drops) or holds a row its digest does
not vouch for (:mod:`editscope.rowdigest`: left out like a torn line); where the cases or suites are not to be had,
every shard of 0..n-1 must be there and complete. Otherwise it is ``incomplete``, ``run.json`` holds
``missing_rows`` and ``problems`` (one line each: the torn or damaged ``file:line N``, the missing rows), and
``log`` gets the same lines: resume the shard that lacks them and merge again into the same folder (a merge may
overwrite an incomplete merge)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.finite import strict_dumps
from editscope.jsonl import read_lines, torn_line
from editscope.rowdigest import FORMAT as ROW_FORMAT
from editscope.rowdigest import RUN_FLAG as ROW_RUN_FLAG
from editscope.rowdigest import damage, dumps_sealed, required_in, strip
from editscope.run.config import RunConfig
from editscope.run.lmeval import LM_EVAL_FILE, check_row
from editscope.run.store import (
    MODELS_JSON,
    RESULTS,
    RUN_JSON,
    dumps_run_json,
    read_json,
    read_sound_results,
    row_key,
    run_lock,
    write_results,
)
from editscope.run.suites import SuiteFactory, declared_metrics, recorded_facts
from editscope.run.summary import SummaryRow
from editscope.run.summary_tables import write_summary


def row_order(config: RunConfig):
    """Sort key reproducing the order of an unsharded run: dataset block, group, method, checkpoint (edits
    applied; sequential_batches rows only), case."""
    blocks = {label: i for i, label in enumerate(config.block_labels())}
    methods = {m.label: i for i, m in enumerate(config.methods)}
    return lambda r: (blocks.get(r["dataset"], len(blocks)), r["group"], methods.get(r["method"], len(methods)),
                      r.get("edits_applied", 0), r["index"])


def merge_runs(out_dir: str | Path, shard_dirs: Sequence[str | Path], *,
               suite_factories: Mapping[str, SuiteFactory] | None = None,
               log: Callable[[str], None] | None = None) -> tuple[int, list[SummaryRow]]:
    """Merge ``shard_dirs`` into ``out_dir`` (which must not hold results yet, unless an ``incomplete`` merge).
    Returns (rows, summary); ``log`` gets one line per problem that keeps the merged run from being complete.
    ``suite_factories``: suites that are not registered (to count the planned rows)."""
    with run_lock(out_dir):
        return _merge_locked(Path(out_dir), shard_dirs, suite_factories, log or (lambda _m: None))


def _merge_locked(out_dir: Path, shard_dirs: Sequence[str | Path],
                  suite_factories: Mapping[str, SuiteFactory] | None,
                  log: Callable[[str], None]) -> tuple[int, list[SummaryRow]]:
    metas = _shard_metas(out_dir, shard_dirs)
    first = metas[0]
    config = RunConfig.from_dict(first["config"])
    rows, problems = _gather(shard_dirs)
    merged = sorted(rows.values(), key=row_order(config))
    write_results(out_dir / RESULTS, merged)
    lm_rows = _gather_lm_eval(shard_dirs, problems)
    if lm_rows or (out_dir / LM_EVAL_FILE).exists():
        order = {k: i for i, k in enumerate(_lm_eval_order(config, lm_rows))}
        atomic_write_text(out_dir / LM_EVAL_FILE, "".join(
            dumps_sealed(strict_dumps(lm_rows[k], str(out_dir / LM_EVAL_FILE))) + "\n" for k in order))
    summary = write_summary(out_dir, merged, specs=declared_metrics(first), facts=recorded_facts(first),
                            method_order=[m.label for m in config.methods],
                            dataset_order=config.block_labels())
    shards = sorted({tuple(m.get("shard", [0, 1])) for m in metas})
    n = shards[0][1] if shards else 1
    plan = _planned(config, first.get("limit"), suite_factories)
    planned = None if plan is None else list(plan.rows)
    if planned is None and (len(shards) != n or any(s[1] != n for s in shards)):
        problems.append(f"merge: shards {', '.join(f'{i}/{k}' for i, k in shards)} of {n}: not every shard is here")
    missing = _missing(planned, rows, problems)
    if plan is not None:
        _missing_lm_eval(plan.lm_eval, lm_rows, problems)
    for line in problems:
        log(line)
    # with a plan to count against, the rows decide: a run stopped partway whose remaining chains a shard of
    # another cut computed is complete once every planned row is here; without one, every shard must be complete
    complete = not problems and (planned is not None or all(m.get("status") == "complete" for m in metas))
    meta = {**first, "shard": [0, 1], "merged_from": [str(Path(d).resolve()) for d in shard_dirs],
            "merged_shards": [list(s) for s in shards], "rows": len(merged),
            "torch_threads": list(dict.fromkeys(t for m in metas for t in m.get("torch_threads") or [])),
            "status": "complete" if complete else "incomplete", "problems": problems,
            **({"planned_rows": len(planned), "missing_rows": missing} if planned is not None else {}),
            "started": min(m.get("started") or "" for m in metas),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            ROW_RUN_FLAG: ROW_FORMAT}  # write_results gave every merged row its digest
    meta.pop("error", None)
    atomic_write_text(out_dir / RUN_JSON, dumps_run_json(meta))
    return len(merged), summary


def _shard_metas(out_dir: Path, shard_dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Each shard's ``run.json``, after checking that the shards can be merged into ``out_dir``."""
    if not shard_dirs:
        raise EditscopeError("merge: no shard directories given")
    if (out_dir / RESULTS).exists() and not _incomplete_merge(out_dir):
        raise EditscopeError(f"merge: {out_dir} already holds {RESULTS}; choose an empty output directory")
    for d in shard_dirs:
        if (Path(d) / MODELS_JSON).is_file():  # shards of a models list: one folder per model (editscope.run.models)
            raise EditscopeError(f"merge: {d} holds the runs of a 'models' list: merge each model's folder on its "
                                 f"own (editscope merge OUT/MODEL {d}/MODEL ...)")
    metas = [read_json(Path(d) / RUN_JSON) for d in shard_dirs]
    first = metas[0]
    for d, meta in zip(shard_dirs, metas, strict=True):
        if meta.get("config_digest") != first.get("config_digest"):
            raise EditscopeError(f"merge: {d} ran a different config than {shard_dirs[0]}")
        fp, fp0 = meta.get("model", {}).get("fingerprint"), first.get("model", {}).get("fingerprint")
        if fp != fp0:
            raise EditscopeError(f"merge: {d} ran on a model with fingerprint {fp}, {shard_dirs[0]} on {fp0}")
    return metas


def _gather(shard_dirs: Sequence[str | Path]) -> tuple[dict[tuple[str, str, str], dict[str, Any]], list[str]]:
    """The shards' rows by key (the first of each), and one problem line per row lost: a torn last line (a killed
    write) or a row its digest does not vouch for; neither is merged, the shard's resume computes it again."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    problems = []
    for d in shard_dirs:
        sound, damaged = read_sound_results(Path(d) / RESULTS)
        for row in sound:
            rows.setdefault(row_key(row), row)
        problems += [f"{line}; not merged: resume that shard to compute its row" for line in damaged]
        torn = torn_line(Path(d) / RESULTS)
        if torn:
            problems.append(f"{Path(d) / RESULTS}:line {torn}: a torn last line (a killed write), not merged; "
                            "resume that shard to compute its row")
    return rows, problems


def _gather_lm_eval(shard_dirs: Sequence[str | Path], problems: list[str]) -> dict[tuple, dict[str, Any]]:
    """The shards' ``lm_eval.jsonl`` rows by key (the first of each, without its digest); a row its digest does not
    vouch for, or a torn last line, is left out with a problem line (that shard's resume evaluates it again)."""
    from editscope.run.planned import lm_eval_key

    rows: dict[tuple, dict[str, Any]] = {}
    for d in shard_dirs:
        path, required = Path(d) / LM_EVAL_FILE, required_in(d)
        for line, row in read_lines(path):
            why = damage(row, required) if isinstance(row, dict) else None
            if why:
                problems.append(f"{path}:line {line}: {why}; not merged: resume that shard to evaluate it again")
                continue
            row = check_row(path, line, strip(dict(row)))
            rows.setdefault(lm_eval_key(row), row)
        torn = torn_line(path)
        if torn:
            problems.append(f"{path}:line {torn}: a torn last line (a killed write), not merged; resume that shard "
                            "to evaluate it again")
    return rows


def _lm_eval_order(config: RunConfig, rows: Mapping[tuple, Any]) -> list[tuple]:
    """``rows``' keys in an unsharded run's order: the unedited model's first, then block, group, method, edits."""
    blocks = {label: i for i, label in enumerate(config.block_labels())}
    methods = {m.label: i for i, m in enumerate(config.methods)}
    return sorted(rows, key=lambda k: (k[0] is not None, blocks.get(k[0], len(blocks)), k[1] or 0,
                                       methods.get(k[2], len(methods)), k[3], str(k[4])))


def _missing_lm_eval(planned: Sequence[tuple], rows: Mapping[tuple, Any], problems: list[str]) -> None:
    """One line in ``problems`` when planned ``lm_eval.jsonl`` rows are not in the merge."""
    from editscope.run.planned import lm_eval_missing_text

    missing = [k for k in planned if k not in rows]
    if missing:
        problems.append(f"merge: {lm_eval_missing_text(len(planned), missing)}")


def _missing(planned: list[tuple[str, str, str]] | None, rows: Mapping[tuple[str, str, str], Any],
             problems: list[str]) -> int | None:
    """How many planned rows the merge lacks (None: no plan to count against); a line in ``problems`` if any."""
    if planned is None:
        return None
    missing = sum(1 for k in planned if k not in rows)
    if missing:
        first_missing = next(k for k in planned if k not in rows)
        problems.append(f"merge: {len(planned) - missing} of {len(planned)} planned rows ({missing} missing, the "
                        f"first: dataset {first_missing[0]}, case {first_missing[1]}, method {first_missing[2]})")
    return missing


def _planned(config: RunConfig, limit: int | None, suite_factories: Mapping[str, SuiteFactory] | None):
    """The :class:`~editscope.run.planned.Plan` of an unsharded run of ``config``; None when its cases or suites are
    not to be had here (the merge then counts the shards only)."""
    from editscope.run.planned import plan_run

    try:
        return plan_run(config, limit=limit, suite_factories=suite_factories)
    except EditscopeError:
        return None


def _incomplete_merge(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a merge that was incomplete (merging again may overwrite it)."""
    try:
        meta = read_json(out_dir / RUN_JSON)
    except EditscopeError:
        return False
    return bool(meta.get("merged_from")) and meta.get("status") != "complete"
