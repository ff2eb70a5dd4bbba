"""lm-evaluation-harness on the edited model, in-process (optional: ``pip install 'editscope[lmeval]'``).

:func:`evaluate` runs lm-eval tasks on a model object as it is in memory -- with whatever patches are applied --
through lm-eval's ``HFLM(pretrained=model, tokenizer=tokenizer)``; nothing is written or reloaded. (An edited
model exported with ``editscope patch apply ... --out DIR`` is an ordinary HF folder: ``lm_eval --model hf
--model_args pretrained=DIR`` evaluates it out of process.)

:class:`LmEvalHook` is the run config's ``lm_eval`` key for lifelong runs (``mode: {sequential_batches: ...}``):
the tasks run on the unedited model once (``edits_applied: 0``, method ``none``) and on the edited model at the
chosen checkpoints of every chain, one row per task in ``OUTPUT/lm_eval.jsonl`` tagged with the dataset block,
group, method, round and number of edits applied, holding lm-eval's metrics under lm-eval's names (``acc,none``,
``acc_stderr,none``). Rows already in the file are not computed again on a resume; a row missing from it (a torn
line, a hand edit) is computed again: the runner runs that chain again (:func:`lm_eval_units`).

A task lm-eval cannot evaluate (a broken Jinja template, an answer that is no choice's index, a document without
choices, an empty data file, a NaN answer, more few-shot examples than documents) fails in one line naming the task,
the checkpoint, and the file, record and field (:mod:`editscope.run.lmeval_tasks`): every task is checked before the
first edit, and an error lm-eval raises later is caught at the hook. The run's ``run.json`` then says ``status:
failed`` with the line (``error``), and every row written before stays.

lm_eval is imported inside the functions that need it: importing this module (and the run package) never
imports it, so a run without the key needs no lm-eval.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.finite import strict_dumps
from editscope.jsonl import append_record, read_lines
from editscope.rowdigest import damage, dumps_sealed, required_in, strip
from editscope.run.plan import checkpoint_due

INSTALL = "pip install 'editscope[lmeval]'"
LM_EVAL_FILE = "lm_eval.jsonl"
SPEC_KEYS = {"tasks", "include_path", "checkpoints", "limit", "num_fewshot", "batch_size"}
#: the case index of a runner unit that stands for missing lm_eval rows of a chain (no results row is written for it;
#: its edits_applied makes a chain restart from its first round when the rows are missing before its checkpoint)
LM_EVAL_UNIT = -1


class LmEvalFailed(EditscopeError):
    """A task failed inside lm-evaluation-harness at a checkpoint: one line naming the task, the checkpoint and the
    file, record and field; the run's status becomes ``failed``."""


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
    import torch  # here: the config parser reads this module's spec, and must not load torch

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


def _check_shape(raw: Any, fail: Callable[[str, str], EditscopeError], mode: str) -> None:
    """Refuse a non-mapping, an unknown key, or a mode without lifelong checkpoints."""
    if not isinstance(raw, dict):
        raise fail("lm_eval", f"expected a mapping {{tasks: [...], include_path: DIR, ...}}, got {raw!r}")
    for key in raw:
        if key not in SPEC_KEYS:
            raise fail(f"lm_eval.{key}", f"unknown key (known: {', '.join(sorted(SPEC_KEYS))})")
    if mode != "sequential_batches":
        raise fail("lm_eval", "runs at the checkpoints of a lifelong chain: needs mode {sequential_batches: ...}")


def _parse_tasks(raw: dict[str, Any], fail: Callable[[str, str], EditscopeError]) -> list[str]:
    """The non-empty list of task names, each listed once."""
    tasks = raw.get("tasks")
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise fail("lm_eval.tasks", f"expected a non-empty list of task names, got {tasks!r}")
    for j, task in enumerate(tasks):
        if task in tasks[:j]:
            raise fail(f"lm_eval.tasks[{j}]", f"task {task!r} is listed twice (also tasks[{tasks.index(task)}])")
    return tasks


def _parse_include_path(raw: dict[str, Any], fail: Callable[[str, str], EditscopeError],
                        base_dir: Path | None) -> str | None:
    """The absolute folder of task YAMLs (relative paths are read from ``base_dir``), or None."""
    include = raw.get("include_path")
    if include is None:
        return None
    if not isinstance(include, str) or not include.strip():
        raise fail("lm_eval.include_path", f"expected a folder of task YAMLs, got {include!r}")
    path = Path(include).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_dir():
        raise fail("lm_eval.include_path", f"folder not found: {include}")
    return str(path.resolve())


def _parse_checkpoints(raw: dict[str, Any], fail: Callable[[str, str], EditscopeError]) -> tuple[int, ...] | None:
    """The sorted, distinct edit counts to evaluate at, or None (the mode's schedule)."""
    checkpoints = raw.get("checkpoints")
    if checkpoints is None:
        return None
    if not isinstance(checkpoints, list) or not checkpoints or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in checkpoints):
        raise fail("lm_eval.checkpoints", f"expected a list of edit counts >= 0, got {checkpoints!r}")
    return tuple(sorted(set(checkpoints)))


def _parse_numbers(raw: dict[str, Any], fail: Callable[[str, str], EditscopeError]) -> dict[str, int | None]:
    """``limit``, ``num_fewshot`` and ``batch_size``: each an integer at or above its minimum, or None."""
    numbers: dict[str, int | None] = {}
    for key, minimum in (("limit", 1), ("num_fewshot", 0), ("batch_size", 1)):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            raise fail(f"lm_eval.{key}", f"expected an integer >= {minimum}, got {value!r}")
        numbers[key] = value
    return numbers


def _check_tasks_known(tasks: list[str], include: str | None, fail: Callable[[str, str], EditscopeError]) -> None:
    """Refuse the first task lm-eval does not know, naming its broken YAML where one is the cause."""
    from editscope.run.lmeval_tasks import broken_task_files, names_in

    try:
        missing = unknown_tasks(tasks, include)
    except EditscopeError as exc:  # lm-eval not installed
        raise fail("lm_eval", str(exc).removeprefix("lm_eval: ")) from None
    if not missing:
        return
    i = tasks.index(missing[0])
    broken = broken_task_files(include) if include else []
    for path, reason in broken:  # lm-eval skips a YAML it cannot read: the task is there, but broken
        if names_in(path) == missing[0] or path.stem == missing[0]:
            raise fail(f"lm_eval.tasks[{i}]", f"task {missing[0]!r}: its task YAML {path} is broken: {reason}")
    where = f" (built in, or a task YAML under {include})" if include else " (built in; add include_path for yours)"
    also = f"; broken task YAML under include_path: {broken[0][0]}: {broken[0][1]}" if broken else ""
    raise fail(f"lm_eval.tasks[{i}]", f"unknown lm-eval task {missing[0]!r}{where}{also}")


def parse_spec(raw: Any, fail: Callable[[str, str], EditscopeError], base_dir: Path | None,
               mode: str) -> LmEvalSpec:
    """Validate the ``lm_eval`` key: {tasks: [...], include_path: DIR, checkpoints: [edits...], limit: N,
    num_fewshot: N, batch_size: N}. lm-eval must be installed and every task known (errors name the key)."""
    _check_shape(raw, fail, mode)
    tasks = _parse_tasks(raw, fail)
    include = _parse_include_path(raw, fail, base_dir)
    checkpoints = _parse_checkpoints(raw, fail)
    numbers = _parse_numbers(raw, fail)
    _check_tasks_known(tasks, include, fail)
    return LmEvalSpec(tuple(tasks), include, checkpoints, numbers["limit"], numbers["num_fewshot"],
                      numbers["batch_size"] or 8)


def is_due(spec: LmEvalSpec, every: int | tuple[int, ...], round_: int, before: int, applied: int,
           last: bool) -> bool:
    """Whether the tasks run after round ``round_`` of a chain (edits on the model: ``before`` -> ``applied``;
    ``last``: the chain's last round; ``every``: the mode's checkpoint rounds, used when ``spec`` lists none)."""
    if spec.checkpoints is not None:
        return any(before < c <= applied for c in spec.checkpoints)
    return last or checkpoint_due(every, round_)


def due_points(spec: LmEvalSpec, every: int | tuple[int, ...], batch: int,
               sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(round, edits applied)`` after which the tasks run in a chain whose cases edit ``sizes[i]`` requests each,
    ``batch`` cases a round."""
    chunks = [sizes[s:s + batch] for s in range(0, len(sizes), batch)] if batch > 0 else []
    out, applied = [], 0
    for r, chunk in enumerate(chunks, start=1):
        before, applied = applied, applied + sum(chunk)
        if is_due(spec, every, r, before, applied, r == len(chunks)):
            out.append((r, applied))
    return out


def mark_failed(out_dir: str | Path, message: str) -> None:
    """Set ``run.json``'s status to ``failed`` with ``message`` (``error``) and the time; rows are left as they are."""
    path = Path(out_dir) / "run.json"
    if not path.is_file():
        return
    meta = json.loads(path.read_text()) | {"status": "failed", "error": message,
                                            "finished": datetime.now(UTC).isoformat(timespec="seconds")}
    atomic_write_text(path, strict_dumps(meta, str(path), indent=2, default=str) + "\n")


#: the fields of an ``lm_eval.jsonl`` row (None where the type tuple allows it); ``True``: every row has it
_ROW: dict[str, tuple[tuple[type, ...], bool]] = {
    "dataset": ((str, type(None)), True), "group": ((int, type(None)), True), "method": ((str,), True),
    "edits_applied": ((int,), True), "task": ((str,), True), "metrics": ((dict,), True), "round": ((int,), False),
    "n_samples": ((int, type(None)), False), "limit": ((int, type(None)), False),
    "num_fewshot": ((int, type(None)), False), "chat_template": ((bool,), False), "seconds": ((int, float), False),
    "lm_eval_version": ((str, type(None)), False)}


def check_row(path: Path, line: int, row: Any) -> dict[str, Any]:
    """An ``lm_eval.jsonl`` row as the hook wrote it, or one line naming ``file:line N`` and the field: a row that
    only looks done (its key intact, its metrics not numbers) would never be evaluated again."""
    where = f"{path}:line {line}"
    if not isinstance(row, dict):
        raise EditscopeError(f"{where}: not a JSON object; the file is damaged")
    for name, (kinds, required) in _ROW.items():
        if name not in row:
            if required:
                raise EditscopeError(f"{where}: field {name!r} is missing; the file is damaged")
            continue
        value = row[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise EditscopeError(f"{where}: field {name!r}: expected {' or '.join(k.__name__ for k in kinds)}, got "
                                 f"{type(value).__name__}; the file is damaged")
    for name, value in row["metrics"].items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise EditscopeError(f"{where}: field 'metrics.{name}': expected a number or null, got "
                                 f"{type(value).__name__}; the file is damaged")
    return row


class LmEvalHook:
    """Runs a run's ``lm_eval`` tasks on the model at the chain checkpoints it names; see the module docstring.

    ``every`` is the run's sequential_batches ``checkpoints`` (with the last round, the default schedule when the
    spec lists no edit counts)."""

    def __init__(self, spec: LmEvalSpec, out_dir: str | Path, *, every: int | tuple[int, ...], batch: int = 0,
                 chat_template: bool = False, log: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LM_EVAL_FILE
        self.every = every
        self.batch = batch
        self._checked = False
        self.chat_template = chat_template
        self.log = log
        self._manager = None
        self._done = self._read_done()

    def _read_done(self) -> set[tuple]:
        """The keys of the rows already written; a row its digest does not vouch for (:mod:`editscope.rowdigest`) is
        not done: one warning line names it, and its task is evaluated again."""
        required, done = required_in(self.out_dir), set()
        for line, row in read_lines(self.path, repair=True):
            why = damage(row, required) if isinstance(row, dict) else None
            if why:
                self.log(f"warning: {self.path}:line {line}: {why}; evaluating it again")
                continue
            done.add(self._key(check_row(self.path, line, strip(row))))
        return done

    def _dumps(self, row: dict[str, Any]) -> str:
        """A row as one strict JSON line ending in its digest."""
        return dumps_sealed(strict_dumps(row, str(self.path)))

    @staticmethod
    def _key(row: dict[str, Any]) -> tuple:
        return (row.get("dataset"), row.get("group"), row.get("method"), row.get("edits_applied"), row.get("task"))

    def due(self, round_: int, before: int, applied: int, last: bool) -> bool:
        """Whether the tasks run after round ``round_`` (edits on the model: ``before`` -> ``applied``; ``last``:
        the chain's last round)."""
        return is_due(self.spec, self.every, round_, before, applied, last)

    def missing(self, dataset: str, group: int, method: str, sizes: Sequence[int]) -> set[int]:
        """The edit counts at which the chain (dataset, group, method) still owes rows (``sizes``: the requests of
        each of its cases)."""
        return {applied for _r, applied in due_points(self.spec, self.every, self.batch, sizes)
                if any(self._key({"dataset": dataset, "group": group, "method": method, "edits_applied": applied,
                                  "task": t}) not in self._done for t in self.spec.tasks)}

    def baseline(self, bundle) -> None:
        """Check every task (:func:`~editscope.run.lmeval_tasks.check_task`), then the unedited model's rows
        (``edits_applied: 0``, method ``none``), once per run, before the first edit. A failure here sets run.json's
        status itself (the runner's loop has not started)."""
        try:
            self._check_tasks()
            if self.spec.checkpoints is None or 0 in self.spec.checkpoints:
                self._run(bundle, {"dataset": None, "group": None, "method": "none", "round": 0, "edits_applied": 0})
        except LmEvalFailed as exc:
            mark_failed(self.out_dir, str(exc))
            raise

    def _manager_(self):
        if self._manager is None:
            self._manager = task_manager(self.spec.include_path, self.spec.tasks)
        return self._manager

    def _check_tasks(self) -> None:
        from editscope.run.lmeval_tasks import TaskProblem, check_task

        if self._checked:
            return
        for task in self.spec.tasks:
            try:
                check_task(self._manager_(), task, limit=self.spec.limit, num_fewshot=self.spec.num_fewshot)
            except TaskProblem as exc:
                raise LmEvalFailed(f"lm_eval: task {task!r} cannot be evaluated (checked before the first edit): "
                                   f"{exc}; fix the task and rerun to resume") from None
        self._checked = True

    def checkpoint(self, bundle, *, dataset: str, group: int, method: str, round_: int, before: int,
                   applied: int, last: bool) -> None:
        """Called after every round of a chain; evaluates when :meth:`due`."""
        if self.due(round_, before, applied, last):
            self._run(bundle, {"dataset": dataset, "group": group, "method": method, "round": round_,
                               "edits_applied": applied})

    def _run(self, bundle, tags: dict[str, Any]) -> None:
        """Evaluate the tasks still owed at this checkpoint, one at a time, each row appended as soon as its task
        ends; a task that fails stops the run with :class:`LmEvalFailed` (the rows before it stay)."""
        from editscope.run.lmeval_tasks import describe_failure

        tasks = [t for t in self.spec.tasks if self._key({**tags, "task": t}) not in self._done]
        if not tasks:
            return
        if bundle.applied and tags["edits_applied"] == 0:
            raise EditscopeError("lm_eval: the baseline must run on the unedited model (bug: please report)")
        self._check_tasks()
        manager = self._manager_()
        self.log(f"lm_eval: {', '.join(tasks)} at {tags['edits_applied']} edit(s) ({tags['method']})")
        where = ("the unedited model (0 edits)" if tags["dataset"] is None else
                 f"the checkpoint of {tags['edits_applied']} edit(s) (dataset {tags['dataset']}, group "
                 f"{tags['group']}, method {tags['method']}, round {tags['round']})")
        for task in tasks:
            t0 = time.perf_counter()
            try:
                out = evaluate(bundle.model, bundle.tokenizer, [task], limit=self.spec.limit,
                               num_fewshot=self.spec.num_fewshot, batch_size=self.spec.batch_size,
                               chat_template=self.chat_template, manager=manager)
            except Exception as exc:  # noqa: BLE001 -- whatever lm-eval raised: one line, the run marked failed
                why = describe_failure(exc, manager, task, limit=self.spec.limit, num_fewshot=self.spec.num_fewshot)
                raise LmEvalFailed(f"lm_eval: task {task!r} failed at {where}: {why}; the rows written so far are "
                                   "kept, fix the task and rerun to resume") from exc
            metrics, effective = task_metrics(out, task), (out.get("n-samples") or {}).get(task, {}).get("effective")
            scored = {k: v for k, v in metrics.items() if k != "sample_len"}
            if effective == 0 or not scored:
                raise LmEvalFailed(
                    f"lm_eval: task {task!r} evaluated {effective if effective is not None else 'no'} document(s) "
                    f"and gave no metric at {where} (an unknown metric in its metric_list, or a filter or limit that "
                    "leaves nothing); the rows written so far are kept, fix the task and rerun to resume")
            row = {**tags, "task": task, "metrics": metrics, "n_samples": effective,
                   "limit": self.spec.limit, "num_fewshot": self.spec.num_fewshot,
                   "chat_template": self.chat_template, "seconds": time.perf_counter() - t0,
                   "lm_eval_version": lm_eval_version()}
            append_record(self.path, row, self._dumps)
            self._done.add(self._key(row))


def lm_eval_units(hook: LmEvalHook | None, block: Any, g: int, members: Sequence[int],
                  label: str) -> set[tuple[int, int]]:
    """Runner units ``(LM_EVAL_UNIT, edits_applied)`` for the lm_eval rows chain (block, group ``g``, method
    ``label``) still owes: a chain with any is run again (from its first round when the rows are missing before its
    checkpoint file's round), and writes no results row for them."""
    if hook is None:
        return set()
    return {(LM_EVAL_UNIT, e) for e in hook.missing(block.label, g, label, [len(block.requests[i]) for i in members])}


__all__ = ["INSTALL", "LM_EVAL_FILE", "LM_EVAL_UNIT", "LmEvalFailed", "LmEvalHook", "LmEvalSpec", "due_points",
           "evaluate", "is_due", "lm_eval_units", "lm_eval_version", "mark_failed", "parse_spec", "require_lm_eval",
           "task_manager", "task_metrics", "unknown_tasks"]
