"""lm-evaluation-harness on the edited model, in-process (optional: ``pip install 'editscope[lmeval]'``).

:func:`evaluate` runs lm-eval tasks on a model object as it is in memory -- with whatever patches are applied --
through lm-eval's ``HFLM(pretrained=model, tokenizer=tokenizer)``; nothing is written or reloaded. (An edited
model exported with ``editscope patch apply ... --out DIR`` is an ordinary HF folder: ``lm_eval --model hf
--model_args pretrained=DIR`` evaluates it out of process.)

:class:`LmEvalHook` is the run config's ``lm_eval`` key for lifelong runs (``mode: {sequential_batches: ...}``):
the tasks run on the unedited model once (``edits_applied: 0``, method ``none``) and on the edited model at the
chosen checkpoints of every chain, one row per task in ``OUTPUT/lm_eval.jsonl`` tagged with the dataset block,
group, method, round and number of edits applied, holding lm-eval's metrics under lm-eval's names (``acc,none``,
``acc_stderr,none``). Rows already in the file are not computed again on a resume.

lm_eval is imported inside the functions that need it: importing this module (and the run package) never
imports it, so a run without the key needs no lm-eval.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from editscope.errors import EditscopeError
from editscope.jsonl import append_record, read_lines

INSTALL = "pip install 'editscope[lmeval]'"
LM_EVAL_FILE = "lm_eval.jsonl"
SPEC_KEYS = {"tasks", "include_path", "checkpoints", "limit", "num_fewshot", "batch_size"}


def require_lm_eval(where: str = "lm_eval") -> Any:
    """The ``lm_eval`` module, or a one-line error saying how to install it."""
    try:
        import lm_eval
    except ImportError:
        raise EditscopeError(f"{where}: lm-evaluation-harness is not installed ({INSTALL})") from None
    return lm_eval


def lm_eval_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return None


def task_manager(include_path: str | None = None, tasks: Sequence[str] = (), where: str = "lm_eval"):
    """lm-eval's TaskManager: its built-in tasks plus the task YAMLs under ``include_path``; only the latter when
    every name in ``tasks`` is a task defined there (indexing lm-eval's ~15,000 built-in names takes ~10 s)."""
    require_lm_eval(where)
    from lm_eval.tasks import TaskManager

    if include_path and tasks:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if set(tasks) <= set(local.all_subtasks):  # groups and tags may name built-in tasks: full index then
            return local
    return TaskManager(include_path=include_path)


def unknown_tasks(tasks: Sequence[str], include_path: str | None = None, manager=None) -> list[str]:
    """The names in ``tasks`` that are no lm-eval task, group or tag (built in or under ``include_path``)."""
    manager = manager or task_manager(include_path, tasks)
    known = set(manager.all_tasks)
    return [t for t in tasks if t not in known]


def evaluate(model, tokenizer, tasks: Sequence[str], *, include_path: str | None = None, limit: int | None = None,
             num_fewshot: int | None = None, batch_size: int = 8, chat_template: bool = False,
             log_samples: bool = False, manager=None) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on ``model`` as it is now (in-process; patches applied to it are evaluated).

    Returns lm-eval's result dict (``results[task]["acc,none"]``, ...; ``samples`` with ``log_samples``).
    ``chat_template`` is lm-eval's ``apply_chat_template`` (instruct models; editscope's ``--chat-template``).
    Task data must be reachable: local files (``dataset_path: json`` with ``dataset_kwargs: {data_files: ...}``)
    work offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1)."""
    lm_eval = require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    manager = manager or task_manager(include_path, tasks)
    device = str(next(model.parameters()).device)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
    was_training = model.training
    model.eval()
    # lm-eval seeds Python's, NumPy's and torch's global generators: put them back, so an evaluation between two
    # edits of a chain leaves the run's random streams as they were
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                      num_fewshot=num_fewshot, log_samples=log_samples,
                                      apply_chat_template=chat_template)
    finally:
        model.train(was_training)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    if out is None:  # lm-eval returns None on non-zero ranks only
        raise EditscopeError("lm_eval: no results (simple_evaluate returned None)")
    return out


def task_metrics(results: dict[str, Any], task: str) -> dict[str, float | None]:
    """The numeric metrics lm-eval reports for ``task`` under its names (``acc,none``); NaN (e.g. the stderr of
    one sample) becomes None, as in results rows."""
    out: dict[str, float | None] = {}
    for key, value in results["results"].get(task, {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[key] = float(value) if math.isfinite(value) else None
    return out


@dataclass(frozen=True)
class LmEvalSpec:
    """A run config's ``lm_eval`` key (see :func:`parse_spec`)."""

    tasks: tuple[str, ...]
    include_path: str | None = None
    #: numbers of edits applied after which the tasks run; None: 0, the mode's checkpoint rounds and the end
    checkpoints: tuple[int, ...] | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    batch_size: int = 8

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tasks"] = list(self.tasks)
        data["checkpoints"] = None if self.checkpoints is None else list(self.checkpoints)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LmEvalSpec:
        cp = data.get("checkpoints")
        return cls(**{**data, "tasks": tuple(data["tasks"]), "checkpoints": None if cp is None else tuple(cp)})


def parse_spec(raw: Any, fail: Callable[[str, str], EditscopeError], base_dir: Path | None,
               mode: str) -> LmEvalSpec:
    """Validate the ``lm_eval`` key: {tasks: [...], include_path: DIR, checkpoints: [edits...], limit: N,
    num_fewshot: N, batch_size: N}. lm-eval must be installed and every task known (errors name the key)."""
    if not isinstance(raw, dict):
        raise fail("lm_eval", f"expected a mapping {{tasks: [...], include_path: DIR, ...}}, got {raw!r}")
    for key in raw:
        if key not in SPEC_KEYS:
            raise fail(f"lm_eval.{key}", f"unknown key (known: {', '.join(sorted(SPEC_KEYS))})")
    if mode != "sequential_batches":
        raise fail("lm_eval", "runs at the checkpoints of a lifelong chain: needs mode {sequential_batches: ...}")
    tasks = raw.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise fail("lm_eval.tasks", f"expected a non-empty list of task names, got {tasks!r}")
    include = raw.get("include_path")
    if include is not None:
        if not isinstance(include, str) or not include.strip():
            raise fail("lm_eval.include_path", f"expected a folder of task YAMLs, got {include!r}")
        path = Path(include).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_dir():
            raise fail("lm_eval.include_path", f"folder not found: {include}")
        include = str(path.resolve())
    checkpoints = raw.get("checkpoints")
    if checkpoints is not None:
        if not isinstance(checkpoints, list) or not checkpoints or any(
                isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in checkpoints):
            raise fail("lm_eval.checkpoints", f"expected a list of edit counts >= 0, got {checkpoints!r}")
        checkpoints = tuple(sorted(set(checkpoints)))
    numbers = {}
    for key, minimum in (("limit", 1), ("num_fewshot", 0), ("batch_size", 1)):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise fail(f"lm_eval.{key}", f"expected an integer >= {minimum}, got {value!r}")
        numbers[key] = value
    try:
        missing = unknown_tasks(tasks, include)
    except EditscopeError as exc:  # lm-eval not installed
        raise fail("lm_eval", str(exc).removeprefix("lm_eval: ")) from None
    if missing:
        where = f" (built in, or a task YAML under {include})" if include else " (built in; add include_path for yours)"
        i = tasks.index(missing[0])
        raise fail(f"lm_eval.tasks[{i}]", f"unknown lm-eval task {missing[0]!r}{where}")
    return LmEvalSpec(tuple(tasks), include, checkpoints, numbers["limit"], numbers["num_fewshot"],
                      numbers["batch_size"] or 8)


class LmEvalHook:
    """Runs a run's ``lm_eval`` tasks on the model at the chain checkpoints it names; see the module docstring.

    ``every`` is the run's sequential_batches ``checkpoints`` (with the last round, the default schedule when the
    spec lists no edit counts)."""

    def __init__(self, spec: LmEvalSpec, out_dir: str | Path, *, every: int, chat_template: bool = False,
                 log: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.path = Path(out_dir) / LM_EVAL_FILE
        self.every = every
        self.chat_template = chat_template
        self.log = log
        self._manager = None
        self._done = {self._key(row) for _, row in read_lines(self.path, repair=True) if isinstance(row, dict)}

    @staticmethod
    def _key(row: dict[str, Any]) -> tuple:
        return (row.get("dataset"), row.get("group"), row.get("method"), row.get("edits_applied"), row.get("task"))

    def due(self, round_: int, before: int, applied: int, last: bool) -> bool:
        """Whether the tasks run after round ``round_`` (edits on the model: ``before`` -> ``applied``; ``last``:
        the chain's last round)."""
        if self.spec.checkpoints is not None:
            return any(before < c <= applied for c in self.spec.checkpoints)
        return last or bool(self.every and round_ % self.every == 0)

    def baseline(self, bundle) -> None:
        """The unedited model's rows (``edits_applied: 0``, method ``none``), once per run."""
        if self.spec.checkpoints is None or 0 in self.spec.checkpoints:
            self._run(bundle, {"dataset": None, "group": None, "method": "none", "round": 0, "edits_applied": 0})

    def checkpoint(self, bundle, *, dataset: str, group: int, method: str, round_: int, before: int,
                   applied: int, last: bool) -> None:
        """Called after every round of a chain; evaluates when :meth:`due`."""
        if self.due(round_, before, applied, last):
            self._run(bundle, {"dataset": dataset, "group": group, "method": method, "round": round_,
                               "edits_applied": applied})

    def _run(self, bundle, tags: dict[str, Any]) -> None:
        tasks = [t for t in self.spec.tasks if self._key({**tags, "task": t}) not in self._done]
        if not tasks:
            return
        if bundle.applied and tags["edits_applied"] == 0:
            raise EditscopeError("lm_eval: the baseline must run on the unedited model (bug: please report)")
        if self._manager is None:
            self._manager = task_manager(self.spec.include_path, self.spec.tasks)
        self.log(f"lm_eval: {', '.join(tasks)} at {tags['edits_applied']} edit(s) ({tags['method']})")
        t0 = time.perf_counter()
        out = evaluate(bundle.model, bundle.tokenizer, tasks, limit=self.spec.limit,
                       num_fewshot=self.spec.num_fewshot, batch_size=self.spec.batch_size,
                       chat_template=self.chat_template, manager=self._manager)
        seconds = time.perf_counter() - t0
        for task in tasks:
            row = {**tags, "task": task, "metrics": task_metrics(out, task),
                   "n_samples": (out.get("n-samples") or {}).get(task, {}).get("effective"),
                   "limit": self.spec.limit, "num_fewshot": self.spec.num_fewshot,
                   "chat_template": self.chat_template, "seconds": seconds / len(tasks),
                   "lm_eval_version": lm_eval_version()}
            append_record(self.path, row)
            self._done.add(self._key(row))


__all__ = ["INSTALL", "LM_EVAL_FILE", "LmEvalHook", "LmEvalSpec", "evaluate", "lm_eval_version", "parse_spec",
           "require_lm_eval", "task_manager", "task_metrics", "unknown_tasks"]
