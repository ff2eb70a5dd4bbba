"""The Ray driver's bookkeeping when workers die, without a cluster: ``RayExecutor._schedule`` talks to Ray only through
``get``/``wait``/``kill`` and actor handles, so a scripted stand-in for those (a clock, groups that take given times,
workers that die on given tries) drives it through orders a real cluster produces only by chance. The real
cluster, with actors killed for real, is tests/run/test_ray_executor.py."""

from __future__ import annotations

import types

import pytest

from editscope.errors import EditscopeError
from editscope.run import parse_config
from editscope.run.blocks import load_blocks
from editscope.run.ray_executor import MAX_ATTEMPTS, RayExecutor, WorkersLostError
from editscope.run.runner import Runner


class ActorDied(Exception):
    actor_init_failed = False


class TaskFailed(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(f"Traceback (most recent call last):\n  ...\n{cause}")
        self.cause = cause


class Ref:
    def __init__(self, done_at: float, rows=None, dies: bool = False, raises: Exception | None = None) -> None:
        self.done_at, self.rows, self.dies, self.raises = done_at, rows, dies, raises


class FakeRay:
    """Each group takes ``seconds[task]``; the ``n``-th try of task ``t`` kills its worker when ``(t, n)`` is in
    ``deaths``. ``wait`` returns the call that finishes first on the clock."""

    exceptions = types.SimpleNamespace(RayActorError=ActorDied, RayTaskError=TaskFailed)

    def __init__(self, seconds: list[float], deaths: set[tuple[int, int]], fingerprint: str,
                 raises: dict[int, Exception] | None = None) -> None:
        self.seconds, self.deaths, self.fingerprint, self.raises = seconds, deaths, fingerprint, raises or {}
        self.clock, self.tries, self.killed = 0.0, [0] * len(seconds), set()

    def actor(self, k: int):
        fake = self

        class Method:
            def __init__(self, run) -> None:
                self.remote = run

        def run_group(b, g, members, todo):
            fake.tries[g] += 1
            dies = k in fake.killed or (g, fake.tries[g]) in fake.deaths
            rows = {"rows": [{"group": g, "case": i} for i in members], "unverified": []}  # as _GroupActor's
            return Ref(fake.clock + fake.seconds[g], rows, dies, fake.raises.get(g))

        return types.SimpleNamespace(k=k, fingerprint=Method(lambda: Ref(0.0, fake.fingerprint)),
                                     run_group=Method(run_group))

    def wait(self, refs, num_returns: int = 1):
        first = min(refs, key=lambda r: r.done_at)
        self.clock = max(self.clock, first.done_at)
        return [first], [r for r in refs if r is not first]

    def get(self, ref):
        if ref.dies:
            raise ActorDied("The actor died unexpectedly before finishing this task.")
        if ref.raises is not None:
            raise TaskFailed(ref.raises)
        return ref.rows

    def kill(self, actor) -> None:
        self.killed.add(actor.k)


CONFIG = {"model": "tiny-llama", "seed": 0, "output": "unused", "methods": [{"name": "rome"}],
          "dataset": "counterfact", "slice": {"offset": 0, "limit": 6}, "suites": ["counterfact"]}


@pytest.fixture(scope="module")
def blocks():
    return load_blocks(parse_config(CONFIG))


@pytest.fixture()
def setting(tmp_path, tiny_llama, blocks):
    config = parse_config(CONFIG)
    tasks = [(0, g, [g], {"rome": {(g, None)}}) for g in range(6)]
    messages: list[str] = []
    runner = Runner(config, out_dir=tmp_path, bundle=tiny_llama, log=messages.append,
                    executor=RayExecutor(workers=2, rerun="editscope run x.yaml --executor ray"))
    return runner, blocks, tasks, messages


def _drive(runner, fake, blocks, tasks, n_workers, expect=WorkersLostError):
    rows, error = [], None
    actors = [fake.actor(k) for k in range(n_workers)]
    try:
        for row in runner.executor._schedule(runner, fake, blocks, tasks, actors):
            rows.append(row["group"])
    except expect as exc:
        assert type(exc) is expect
        error = str(exc)
    return rows, error


def test_groups_come_out_in_order_and_a_dead_worker_s_group_is_run_again(setting):
    runner, blocks, tasks, messages = setting
    # group 1 is slow and its worker dies; groups 2.. finish first on the other worker and wait for it
    fake = FakeRay([1, 10, 1, 1, 1, 1], {(1, 1)}, runner.bundle.fingerprint)
    rows, error = _drive(runner, fake, blocks, tasks, 2)
    assert error is None and rows == [0, 1, 2, 3, 4, 5]
    assert fake.tries == [1, 2, 1, 1, 1, 1] and fake.killed == {1}
    assert len(messages) == 1 and "Ray worker 1 died running dataset counterfact group 1 " in messages[0]


def test_with_no_worker_left_the_groups_finished_out_of_order_are_kept(setting):
    runner, blocks, tasks, messages = setting
    # worker 0 runs group 0 slowly and dies; worker 1 finishes groups 1-5 meanwhile, then dies on group 0
    fake = FakeRay([10, 1, 1, 1, 1, 1], {(0, 1), (0, 2)}, runner.bundle.fingerprint)
    rows, error = _drive(runner, fake, blocks, tasks, 2)
    assert rows == [1, 2, 3, 4, 5]  # written although group 0 before them never finished
    assert error == (f"no Ray worker is left (2 of 2 died); 5 of 6 groups finished, their rows are in "
                     f"{runner.out_dir / 'results.jsonl'}; rerun to resume: editscope run x.yaml --executor ray")
    assert "\n" not in error


def test_a_group_that_kills_every_worker_it_gets_stops_the_run_after_the_bound(setting):
    runner, blocks, tasks, messages = setting
    deaths = {(2, n) for n in range(1, 10)}
    # five workers: group 2 takes down three of them; group 5 (slow) is still running when the bound is hit
    fake = FakeRay([1, 1, 3, 1, 1, 10], deaths, runner.bundle.fingerprint)
    rows, error = _drive(runner, fake, blocks, tasks, 5)
    assert fake.tries[2] == MAX_ATTEMPTS and len(fake.killed) == MAX_ATTEMPTS
    assert rows == [0, 1, 3, 4, 5]  # the group in flight when the bound was hit finishes and is written
    assert error.startswith(f"dataset counterfact group 2 (cases {blocks[0].cases[2].case_id}.."
                            f"{blocks[0].cases[2].case_id}) lost its Ray worker {MAX_ATTEMPTS} times "
                            f"({MAX_ATTEMPTS} of 5 died); ")


def test_a_group_that_fails_stops_the_run_with_its_own_one_line_error(setting):
    runner, blocks, tasks, messages = setting
    # the editor's error in group 1 (as in-process: no retry, its message as is); groups 2-5 finished before it
    failure = EditscopeError("dataset counterfact: case 1, method rome: the update is not finite")
    fake = FakeRay([1, 10, 1, 1, 1, 1], set(), runner.bundle.fingerprint, raises={1: failure})
    rows, error = _drive(runner, fake, blocks, tasks, 2, expect=EditscopeError)
    assert error == str(failure) and fake.tries[1] == 1 and not fake.killed
    assert rows == [0, 2, 3, 4, 5]
