"""``editscope run CONFIG --executor ray --workers N [--address ADDR]``: whole groups of cases on Ray actors.

The driver is an ordinary :class:`~editscope.run.runner.Runner` with a :class:`RayExecutor` (the
:class:`~editscope.run.runner.Executor` that runs its tasks): the runner checks the plan, holds the output directory's
lock, warms the layer statistics (cached on disk, so actors on the same machine read them), finds the rows still
to do (resume) and appends every row with the usual writer. Only where the tasks run differs: each task —
one group, so a sequential chain stays on one actor — goes to an idle one of N actors; each actor loads the model,
statistics and hparams once (its own :class:`~editscope.run.worker.GroupWorker`) and returns the group's rows, which
the driver appends in group order as groups complete. Rows equal the in-process run's (per-group seeds are derived
from the config, not from the order groups run in or the actor that runs them).

A worker that dies (killed, out of memory, its node lost) costs only its group in flight: the group goes back to
the front of the queue for a surviving worker, at most :data:`MAX_ATTEMPTS` times per group. When no worker is
left (or a group has lost its worker that many times) the driver writes every group that finished, then stops with
:class:`WorkersLostError` (one line with the command that resumes; exit status 2). A killed driver loses at most
the groups in flight; a rerun resumes from results.jsonl like an in-process run.

Requires ``pip install editscope[ray]``.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from editscope.errors import EditscopeError
from editscope.integrity import note_unverified, trusted, trusting
from editscope.run.blocks import Block
from editscope.run.config import RunConfig
from editscope.run.runner import Runner, Task
from editscope.run.store import RESULTS
from editscope.run.worker import GroupWorker, Work

#: how long a local raylet waits for its helper agents' port files: Ray's default aborts the node when a loaded
#: machine starts the agents' Python slower than that (ray-project/ray#65983; measured here: 40 s at load 12 on 2
#: cores, "The current node timed out during startup")
AGENT_TIMEOUT_MS = 180_000

#: how many times one group may be started on a worker that then dies before the run stops (a group that takes
#: its worker down every time, e.g. out of memory, must not take down all of them)
MAX_ATTEMPTS = 3


class WorkersLostError(EditscopeError):
    """The Ray run cannot go on: no worker is left (or one group lost its worker :data:`MAX_ATTEMPTS` times). The
    rows of every finished group are written; the message holds the command that resumes."""



def _ray():
    try:
        import ray  # noqa: PLC0415 (optional dependency)
    except ImportError:
        raise EditscopeError("--executor ray needs Ray: pip install 'editscope[ray]'") from None
    return ray


class _GroupWorker:
    """One actor: a :class:`~editscope.run.worker.GroupWorker` on its own copy of the model, executing whole groups
    (the driver's Runner keeps the plan, the lock and the results file).

    ``trust`` is the driver's ``--trust-unverified`` (:func:`editscope.integrity.trusted`): the actor is another
    process, which the driver's trust context does not reach, and it reads the files a group continues from (chain
    checkpoints). What it accepts unverified goes back with the rows, for the driver's run.json."""

    def __init__(self, config, out_dir: str, limit: int | None, threads: int, suite_factories,
                 trust: bool = False) -> None:
        import torch

        torch.set_num_threads(threads)
        self.trust = trust
        # The driver's output directory: the actor writes only the patches of ``save_patches`` there (the driver
        # holds the lock and appends the rows); on a cluster it must be a path every node shares.
        self.worker = GroupWorker(config, out_dir=out_dir, limit=limit, progress=False, log=lambda _msg: None,
                                  suite_factories=suite_factories)
        with trusting(trust) as used:
            self.work = self.worker.prepare()
        self.pending = list(used)  # accepted unverified while preparing: reported with the first group's rows

    def fingerprint(self) -> str:
        return self.worker.bundle.fingerprint

    def run_group(self, b: int, g: int, members: list[int], todo: dict[str, set]) -> dict[str, Any]:
        """The group's rows, and the files accepted unverified since the last call."""
        with trusting(self.trust) as used:
            rows = list(self.worker.group_rows(self.work, b, g, members, todo))
        unverified, self.pending = [*self.pending, *used], []
        return {"rows": rows, "unverified": unverified}


@dataclass
class _Progress:
    """The scheduler's book-keeping: tasks queued, started, finished out of order, and written in order."""

    queue: deque
    attempts: list[int]
    running: dict[Any, tuple[int, int]] = field(default_factory=dict)  # object ref -> (task, worker)
    finished: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    next_out: int = 0  # rows are yielded in task order: tasks before next_out are written
    fatal: str | None = None  # why the run cannot go on

    def done(self, t: int, rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Record task ``t``'s rows; yield those of every task now next in order."""
        self.finished[t] = rows
        while self.next_out in self.finished:
            yield from self.finished.pop(self.next_out)
            self.next_out += 1

    def flush(self) -> Iterator[dict[str, Any]]:
        """The rows of the tasks finished out of order (written when the run stops: nothing finished is lost)."""
        for f in sorted(self.finished):
            yield from self.finished[f]


class RayExecutor:
    """Runs a :class:`Runner`'s tasks on ``workers`` Ray actors (see the module docstring).

    ``rerun`` is the command a :class:`WorkersLostError` tells the user to run (the CLI passes its own command
    line). ``on_dispatch(actor, task_index)`` is called after a group is handed to an actor (tests kill the actor
    from it to simulate a lost worker); a class attribute too, so a test can set it (as a staticmethod) for a run
    the CLI starts.
    """

    on_dispatch: Callable[[Any, int], None] | None = None

    def __init__(self, *, workers: int = 2, address: str | None = None, threads_per_worker: int = 1,
                 rerun: str | None = None, on_dispatch: Callable[[Any, int], None] | None = None) -> None:
        if workers < 1:
            raise EditscopeError("--workers must be >= 1")
        self.workers, self.address, self.threads, self.rerun = workers, address, threads_per_worker, rerun
        if on_dispatch is not None:
            self.on_dispatch = on_dispatch

    def check(self, config: RunConfig) -> None:
        if config.lm_eval is not None:
            raise EditscopeError("lm_eval: the config's lm_eval checkpoints run in-process only; leave out "
                                 "--executor ray")

    def torch_threads(self) -> int:
        return self.threads  # each actor's (the driver computes no rows)

    def run(self, runner: Runner, work: Work, tasks: list[Task]) -> Iterator[dict[str, Any]]:
        if not tasks:
            return
        ray = _ray()
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers * self.threads, include_dashboard=False, log_to_driver=False,
                         _system_config={"agent_register_timeout_ms": AGENT_TIMEOUT_MS})
        # The actors run on the driver's device type: "auto" resolved in an actor without a GPU would be the CPU.
        device = runner.bundle.device.type
        config = dataclasses.replace(runner.config, device=device)
        remote = ray.remote(num_cpus=self.threads, num_gpus=1 if device == "cuda" else 0)(_GroupWorker)
        started = [remote.remote(config, str(runner.out_dir.resolve()), runner.limit, self.threads,
                                 runner.suite_factories, trusted())
                   for _ in range(min(self.workers, len(tasks)))]
        try:
            yield from self._schedule(runner, ray, work.blocks, tasks, started)
        finally:
            for actor in started:
                ray.kill(actor)

    def _schedule(self, runner: Runner, ray, blocks: list[Block], tasks: list[Task], started: list
                  ) -> Iterator[dict[str, Any]]:
        """Hand each task to an idle actor; a task whose actor died goes back to the front of the queue for a
        surviving actor (at most :data:`MAX_ATTEMPTS` tries per group). Rows come out in task order, as the
        in-process run writes them; when the run cannot go on, the groups finished out of order are written too
        (nothing finished is lost), then :class:`WorkersLostError` says how to resume."""
        idle = self._ready(runner, ray, started)
        p = _Progress(deque(range(len(tasks))), [0] * len(tasks))
        while p.next_out < len(tasks):
            self._dispatch(p, idle, started, tasks)
            if not p.running:
                p.fatal = p.fatal or "no Ray worker is left"
                break
            (ref,), _ = ray.wait(list(p.running), num_returns=1)
            t, k = p.running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:
                self._lost(runner, ray, p, _group_name(blocks, tasks[t]), t, (k, started[k]),
                           len(idle) + len(p.running))
                continue
            except ray.exceptions.RayTaskError as exc:  # the group itself failed: as in-process, one line if ours
                yield from p.flush()  # groups that finished after the failing one are kept all the same
                if isinstance(exc.cause, EditscopeError):
                    raise exc.cause from None
                raise
            note_unverified(result["unverified"])  # run.json records them as for an in-process run
            idle.append(k)
            yield from p.done(t, result["rows"])
        if p.fatal is None:
            return
        yield from p.flush()  # finished out of order: written now, so a rerun does not redo them
        done = p.next_out + len(p.finished)
        raise WorkersLostError(f"{p.fatal} ({len(started) - len(idle)} of {len(started)} died); {done} of "
                               f"{len(tasks)} groups finished, their rows are in {runner.out_dir / RESULTS}; "
                               f"rerun to resume: {self.rerun or self._default_rerun(runner)}")

    def _ready(self, runner: Runner, ray, started: list) -> list[int]:
        """The actors that started, each checked to hold the driver's weights (or rows would mix models)."""
        idle = []
        for k, actor in enumerate(started):
            try:
                fingerprint = ray.get(actor.fingerprint.remote())
            except ray.exceptions.RayActorError as exc:
                if exc.actor_init_failed:  # its __init__ raised: not a lost worker, and a retry would fail again
                    raise EditscopeError(f"a Ray worker could not start: {_last_line(str(exc))}") from None
                runner.log(f"Ray worker {k} died while starting")
                continue
            if fingerprint != runner.bundle.fingerprint:
                raise EditscopeError(f"a Ray worker loaded {runner.config.model} with fingerprint {fingerprint}, "
                                     f"the driver {runner.bundle.fingerprint}")
            idle.append(k)
        return idle

    def _dispatch(self, p: _Progress, idle: list[int], started: list, tasks: list[Task]) -> None:
        """Hand queued tasks to idle actors (none once the run cannot go on)."""
        while p.fatal is None and idle and p.queue:
            t, k = p.queue.popleft(), idle.pop(0)
            p.attempts[t] += 1
            p.running[started[k].run_group.remote(*tasks[t])] = (t, k)
            if self.on_dispatch is not None:
                self.on_dispatch(started[k], t)

    def _lost(self, runner: Runner, ray, p: _Progress, where: str, t: int, worker: tuple[int, Any],
              left: int) -> None:
        """Task ``t``'s actor died: the task goes back to the front of the queue, unless it lost its worker
        :data:`MAX_ATTEMPTS` times."""
        k, actor = worker
        ray.kill(actor)  # an unavailable actor may come back: make sure it does not
        if p.attempts[t] >= MAX_ATTEMPTS:
            p.fatal = p.fatal or f"{where} lost its Ray worker {p.attempts[t]} times"
            return
        runner.log(f"Ray worker {k} died running {where}; the group goes to another worker "
                   f"({left} left)")
        p.queue.appendleft(t)

    def _default_rerun(self, runner: Runner) -> str:
        return shlex.join(["editscope", "run", "CONFIG", "--executor", "ray", "--workers", str(self.workers),
                           "--output", str(runner.out_dir)])


def _group_name(blocks: list[Block], task) -> str:
    b, g, members, _ = task
    block = blocks[b]
    return (f"dataset {block.label} group {g} (cases {block.cases[members[0]].case_id}.."
            f"{block.cases[members[-1]].case_id})")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
