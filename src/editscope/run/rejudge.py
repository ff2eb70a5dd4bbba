"""A run's wild answers judged again: the same kept answers under another answer judge or neighbourhood judge.

The wild suite keeps every generated answer in its probes (``pre.wild.prompts``, ``post.wild.prompts``), and its
metrics are a function of those answers alone. :func:`rejudge_run` writes a new run folder whose config names the
other judge(s) and whose rows hold the wild metrics that judge gives on the same answers; every other field of a row
(teacher-forced metrics, edit info, timings) is copied. The new run is a run like any other: ``editscope report``
reads it, its paired gap (wild minus teacher-forced) is under the new judge, and its ``run.json`` records
``rejudged_from`` (the source folder, its config digest and the judges it had). What it cannot do is rejudge rows
without answers: an archive (``results.slim.jsonl.gz``) drops the probes, and a run whose rows hold none is refused.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from editscope.atomic import atomic_write_text, make_dirs
from editscope.errors import EditscopeError
from editscope.lm.engine import CHAT_NOTE
from editscope.run.blocks import load_blocks
from editscope.run.config import NO_EDIT, RunConfig
from editscope.run.plan import base_label
from editscope.run.store import (
    RESULTS,
    ROW_CONFIG_KEY,
    RUN_JSON,
    dumps_run_json,
    read_json,
    read_results,
    write_results,
)
from editscope.run.trial import Trial

WILD = "wild"


def _rejudged_config(config: dict[str, Any], options: dict[str, str], path: Path) -> tuple[dict[str, Any], list]:
    """The config with ``options`` set on every wild suite, and the (block, suite) pairs changed."""
    new = copy.deepcopy(config)
    changed = []
    for block in new.get("blocks", []):
        for suite in block.get("suites", []):
            if suite.get("name") == WILD:
                suite["options"] = {**(suite.get("options") or {}), **options}
                changed.append((block.get("label"), suite["name"]))
    if not changed:
        raise EditscopeError(f"{path}: the run has no wild suite: nothing to rejudge")
    return new, changed


def rejudge_run(run_dir: str | Path, out_dir: str | Path, *, judge: str | None = None,
                locality_judge: str | None = None) -> Path:
    """Write to ``out_dir`` the run of ``run_dir`` with its wild answers judged by ``judge`` and its neighbourhood
    answers by ``locality_judge`` (None: as the run had them). Returns the new run folder."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    options = {k: v for k, v in (("judge", judge), ("locality_judge", locality_judge)) if v is not None}
    if not options:
        raise EditscopeError("rejudge: name a --judge or a --locality-judge")
    if out_dir.resolve() == run_dir.resolve():
        raise EditscopeError(f"{out_dir}: a rejudged run goes to another folder than its source")
    if (out_dir / RESULTS).exists() or (out_dir / RUN_JSON).exists():
        raise EditscopeError(f"{out_dir} already holds a run; use another output directory")
    if not (run_dir / RESULTS).is_file():
        raise EditscopeError(f"{run_dir}: no {RESULTS} (an archive keeps no answers): rerun it to rejudge")
    meta = read_json(run_dir / RUN_JSON)
    source = RunConfig.from_run_json(meta.get("config"), run_dir / RUN_JSON)
    new_dict, _ = _rejudged_config(meta["config"], options, run_dir / RUN_JSON)
    config = RunConfig.from_run_json(new_dict, run_dir / RUN_JSON)  # checks the judges' names, one line each
    blocks = {b.label: b for b in load_blocks(config)}
    rows = []
    for row in read_results(run_dir / RESULTS):
        block = blocks.get(row["dataset"])
        if block is None or WILD not in block.suites:
            rows.append(row)
            continue
        probes = [row["pre"].get(WILD), row["post"].get(WILD)]
        if probes[0] is None or (row["method"] != NO_EDIT and probes[1] is None):
            raise EditscopeError(f"{run_dir / RESULTS}: row {row['dataset']}/{row['case_id']}/{row['method']} "
                                 "keeps no wild answers: rerun it to rejudge")
        case = next((c for c in block.cases if c.case_id == row["case_id"]), None)
        if case is None:
            raise EditscopeError(f"{run_dir / RESULTS}: case {row['case_id']!r} is not in block {block.label!r}")
        trial = Trial(block.label, {WILD: block.suites[WILD]}, None, None)
        post = None if row["method"] == NO_EDIT else row["post"]
        row = copy.deepcopy(row)
        row["metrics"][WILD] = trial.metrics(case, row["pre"], post)[WILD]
        row.setdefault("protocol", {})[WILD] = _protocol(block.suites[WILD].protocol, row["protocol"].get(WILD, {}))
        rows.append(row)
    digest = config.digest(meta.get("runtime") or {})
    rows = [{**r, ROW_CONFIG_KEY: digest} if ROW_CONFIG_KEY in r else r for r in rows]
    make_dirs(out_dir, "output directory")
    write_results(out_dir / RESULTS, rows)
    new_meta = {**meta, "config": config.to_dict(), "config_digest": digest,
                "rejudged_from": {"run": str(run_dir), "config_digest": meta.get("config_digest"),
                                  "judges": _judges(source), "rows": len(rows)}}
    atomic_write_text(out_dir / RUN_JSON, dumps_run_json(new_meta))
    return out_dir


def _protocol(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """The suite's new protocol, wrapped as the row's was when its prompts went through the chat template (as
    :meth:`editscope.run.trial.Trial.protocol` wraps it)."""
    if "chat_template" not in old:
        return dict(new)
    return {**new, "chat_template": old["chat_template"], "note": f"{new.get('note', '')}; {CHAT_NOTE}"}


def _judges(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Each block's wild suite options as the source run had them."""
    options = {b.label: dict(s.options) for b in config.blocks for s in b.suites if s.name == WILD}
    return {label: options[base_label(label)[0]] for label in config.block_labels()
            if base_label(label)[0] in options}


__all__ = ["rejudge_run"]
