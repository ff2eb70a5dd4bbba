"""``merge``: combine the output directories of a sharded run into one (dedupe rows, check that every shard
ran the same config on the same model), ordered as an unsharded run writes them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.finite import strict_dumps
from editscope.run.config import RunConfig
from editscope.run.store import (
    MODELS_JSON,
    RESULTS,
    RUN_JSON,
    read_json,
    read_results,
    row_key,
    run_lock,
    write_results,
)
from editscope.run.suites import declared_metrics
from editscope.run.summary import SummaryRow, write_summary


def row_order(config: RunConfig):
    """Sort key reproducing the order of an unsharded run: dataset block, group, method, checkpoint (edits
    applied; sequential_batches rows only), case."""
    blocks = {b.label: i for i, b in enumerate(config.blocks)}
    methods = {m.label: i for i, m in enumerate(config.methods)}
    return lambda r: (blocks.get(r["dataset"], len(blocks)), r["group"], methods.get(r["method"], len(methods)),
                      r.get("edits_applied", 0), r["index"])


def merge_runs(out_dir: str | Path, shard_dirs: Sequence[str | Path]) -> tuple[int, list[SummaryRow]]:
    """Merge ``shard_dirs`` into ``out_dir`` (which must not hold results yet). Returns (rows, summary)."""
    with run_lock(out_dir):
        return _merge_locked(Path(out_dir), shard_dirs)


def _merge_locked(out_dir: Path, shard_dirs: Sequence[str | Path]) -> tuple[int, list[SummaryRow]]:
    if not shard_dirs:
        raise EditscopeError("merge: no shard directories given")
    if (out_dir / RESULTS).exists():
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
    config = RunConfig.from_dict(first["config"])
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in shard_dirs:
        for row in read_results(Path(d) / RESULTS):
            rows.setdefault(row_key(row), row)
    merged = sorted(rows.values(), key=row_order(config))
    write_results(out_dir / RESULTS, merged)
    summary = write_summary(out_dir, merged, specs=declared_metrics(first),
                            method_order=[m.label for m in config.methods],
                            dataset_order=[b.label for b in config.blocks])
    shards = sorted({tuple(m.get("shard", [0, 1])) for m in metas})
    n = shards[0][1] if shards else 1
    complete = all(m.get("status") == "complete" for m in metas) and len(shards) == n and all(s[1] == n
                                                                                           for s in shards)
    meta = {**first, "shard": [0, 1], "merged_from": [str(Path(d).resolve()) for d in shard_dirs],
            "merged_shards": [list(s) for s in shards], "rows": len(merged),
            "status": "complete" if complete else "partial",
            "started": min(m.get("started") or "" for m in metas),
            "finished": datetime.now(UTC).isoformat(timespec="seconds")}
    atomic_write_text(out_dir / RUN_JSON, strict_dumps(meta, str(out_dir / RUN_JSON), indent=2, default=str) + "\n")
    return len(merged), summary
