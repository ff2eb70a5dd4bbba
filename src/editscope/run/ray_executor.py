"""``editscope run CONFIG --executor ray --workers N [--address ADDR]``: whole groups of cases on Ray actors.

The driver is an ordinary :class:`~editscope.run.runner.Runner`: it checks the plan, holds the output directory's
lock, warms the layer statistics (cached on disk, so actors on the same machine read them), finds the rows still
to do (resume) and appends every row with the usual writer. Only :meth:`Runner._execute` differs: each task —
one group, so a sequential chain stays on one actor — goes to one of N actors (``ray.util.ActorPool``); each actor
loads the model, statistics and hparams once (its own in-process Runner) and returns the group's rows, which the
driver appends as each group completes. A killed driver or worker loses at most the groups in flight; a rerun
resumes from results.jsonl like an in-process run. Rows equal the in-process run's (per-group seeds are derived
from the config, not from the order groups run in).

Requires ``pip install editscope[ray]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from editscope.errors import EditscopeError
from editscope.run.runner import Block, Runner

#: how long a local raylet waits for its helper agents' port files: Ray's default aborts the node when a loaded
#: machine starts the agents' Python slower than that (ray-project/ray#65983; measured here: 40 s at load 12 on 2
#: cores, "The current node timed out during startup")
AGENT_TIMEOUT_MS = 180_000


def _ray():
    try:
        import ray  # noqa: PLC0415 (optional dependency)
    except ImportError:
        raise EditscopeError("--executor ray needs Ray: pip install 'editscope[ray]'") from None
    return ray


class _GroupWorker:
    """One actor: a Runner on its own copy of the model, executing whole groups."""

    def __init__(self, config, out_dir: str, limit: int | None, threads: int, suite_factories) -> None:
        import torch

        from editscope.lm.engine import ScoringEngine

        torch.set_num_threads(threads)
        # The driver's output directory: the actor writes only the patches of ``save_patches`` there (the driver
        # holds the lock and appends the rows); on a cluster it must be a path every node shares.
        self.runner = Runner(config, out_dir=out_dir, limit=limit, progress=False, log=lambda _msg: None,
                             suite_factories=suite_factories)
        self.blocks, self.editors, self.hparams = self.runner._prepare()
        self.engine = ScoringEngine(self.runner.bundle, chat_template=config.chat_template)
        self.runner._prompt_format = self.engine.prompt_format  # rows record it, as the driver's run.json

    def fingerprint(self) -> str:
        return self.runner.bundle.fingerprint

    def run_group(self, b: int, g: int, members: list[int], todo: dict[str, set]) -> list[dict[str, Any]]:
        return list(self.runner._group_rows(self.blocks[b], g, members, todo, self.editors, self.hparams,
                                            self.engine))


class RayRunner(Runner):
    """A :class:`Runner` whose groups run on ``workers`` Ray actors (see the module docstring)."""

    def __init__(self, config, *, workers: int = 2, address: str | None = None, threads_per_worker: int = 1,
                 **kwargs: Any) -> None:
        if workers < 1:
            raise EditscopeError("--workers must be >= 1")
        if config.lm_eval is not None:
            raise EditscopeError("lm_eval: the config's lm_eval checkpoints run in-process only; leave out "
                                 "--executor ray")
        super().__init__(config, **kwargs)
        self.workers, self.address, self.threads = workers, address, threads_per_worker

    def _execute(self, blocks: list[Block], tasks, editors, hparams, engine) -> Iterator[dict[str, Any]]:
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
        device = self.bundle.device.type
        config = dataclasses.replace(self.config, device=device)
        remote = ray.remote(num_cpus=self.threads, num_gpus=1 if device == "cuda" else 0)(_GroupWorker)
        actors = [remote.remote(config, str(self.out_dir.resolve()), self.limit, self.threads, self.suite_factories)
                  for _ in range(min(self.workers, len(tasks)))]
        for actor in actors:  # the same weights as the driver's, or rows would mix models
            fingerprint = ray.get(actor.fingerprint.remote())
            if fingerprint != self.bundle.fingerprint:
                raise EditscopeError(f"a Ray worker loaded {self.config.model} with fingerprint {fingerprint}, "
                                     f"the driver {self.bundle.fingerprint}")
        pool = ray.util.ActorPool(actors)
        try:
            # in task order, each group's rows as soon as it and the groups before it are done
            for rows in pool.map(lambda actor, task: actor.run_group.remote(*task), tasks):
                yield from rows
        finally:
            for actor in actors:
                ray.kill(actor)
