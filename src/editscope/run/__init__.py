"""Experiment runner: config -> (edit -> evaluate -> restore)* -> results store; resume, shards, merge.

The names below are loaded on first use (PEP 562), so importing one module of the package (the results store, the
summary) does not load the runner and the models behind it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from editscope.lazy import lazy_exports

#: public name -> the module that defines it
_WHERE = {
    "RunConfig": "editscope.run.config", "load_config": "editscope.run.config", "parse_config": "editscope.run.config",
    "merge_runs": "editscope.run.merge", "Runner": "editscope.run.runner", "RunResult": "editscope.run.runner",
    "recompute_metrics": "editscope.run.runner", "run": "editscope.run.runner",
    "read_results": "editscope.run.store", "summarize": "editscope.run.summary",
    "write_summary": "editscope.run.summary_tables",
}

if TYPE_CHECKING:
    from editscope.run.config import RunConfig, load_config, parse_config
    from editscope.run.merge import merge_runs
    from editscope.run.runner import Runner, RunResult, recompute_metrics, run
    from editscope.run.store import read_results
    from editscope.run.summary import summarize
    from editscope.run.summary_tables import write_summary


__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = ["RunConfig", "RunResult", "Runner", "load_config", "merge_runs", "parse_config", "read_results",
           "recompute_metrics", "run", "summarize", "write_summary"]
