"""``--executor ray`` on one local Ray cluster (num_cpus=2, shared by the tests of this module; actors start in
~10 s each here, so the tests are few): two actors write the same rows as the in-process run (timings aside), in
the same order, also when one of them is killed while it runs a group (the group is run again on the other), and a
rerun resumes with nothing left to do; when every worker is killed the CLI stops with one line naming the command
that resumes (exit 2), the finished rows are kept, and that command (without killing) finishes the run with the
in-process run's rows."""

from __future__ import annotations

import shlex

import pytest
import torch
import yaml
from safetensors.torch import load_file

from editscope.cli import main
from editscope.run import Runner, parse_config, read_results
from editscope.run.runner import timing_free
from editscope.run.store import read_json

ray = pytest.importorskip("ray")
# one worker runs the module under pytest-xdist (--dist loadgroup): its cluster and in-process reference are built
# once, and one Ray cluster, not two, shares the cores with the other worker
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

CONFIG = {"model": "tiny-llama", "seed": 0, "output": "unused", "save_patches": True,
          "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
          "dataset": "counterfact", "slice": {"offset": 0, "limit": 4}, "suites": ["counterfact"]}


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (start-up costs 10-20 s); RayExecutor uses it as it is already running."""
    from editscope.run.ray_executor import AGENT_TIMEOUT_MS

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config={"agent_register_timeout_ms": AGENT_TIMEOUT_MS})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory, tiny_llama):
    """The in-process run the Ray runs must equal."""
    out = tmp_path_factory.mktemp("local")
    # the workers run 1 torch thread each (threads_per_worker); a matmul's rounding depends on the thread count,
    # so the in-process reference runs with 1 thread too, or rows differ in the last bits
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Runner(parse_config(CONFIG), out_dir=out, bundle=tiny_llama, progress=False).run()
    finally:
        torch.set_num_threads(threads)
    return out


def _rows(out_dir) -> list[dict]:
    return [timing_free(r) for r in read_results(out_dir / "results.jsonl")]


def test_a_killed_worker_s_group_runs_on_the_other(tmp_path, cluster, local_dir):
    """Rows and saved patches equal the in-process run's, in the same order, although the actor given the first
    group is killed at once; a rerun finds nothing left to do."""
    from editscope.run.ray_executor import RayExecutor
    from editscope.run.runner import Runner

    killed: list[int] = []
    messages: list[str] = []

    def kill_first(actor, task: int) -> None:  # the driver kills the actor it just handed the first group to
        if not killed:
            ray.kill(actor)
            killed.append(task)

    config = parse_config(CONFIG)
    result = Runner(config, out_dir=tmp_path / "ray", progress=False, log=messages.append,
                    executor=RayExecutor(workers=2, on_dispatch=kill_first)).run()
    assert killed == [0]
    retried = [m for m in messages if "died running" in m]
    assert len(retried) == 1 and "group 0 " in retried[0] and "(1 left)" in retried[0], messages
    local = _rows(local_dir)
    assert result.written == len(local) == 4 and _rows(tmp_path / "ray") == local
    assert read_json(tmp_path / "ray" / "run.json")["status"] == "complete"
    again = Runner(config, out_dir=tmp_path / "ray", progress=False, executor=RayExecutor(workers=2)).run()
    assert again.written == 0
    # the actors save their patches into the run's folder, as the in-process run does (the retried group's too)
    saved = {d: sorted(p.relative_to(d) for p in (d / "patches").rglob("*.safetensors"))
             for d in (local_dir, tmp_path / "ray")}
    assert len(saved[local_dir]) == 4 and saved[tmp_path / "ray"] == saved[local_dir]
    for rel in saved[local_dir]:
        here, there = load_file(local_dir / rel), load_file(tmp_path / "ray" / rel)
        assert here.keys() == there.keys() and all(torch.equal(here[k], there[k]) for k in here)


def test_no_worker_left_stops_in_one_line_and_the_rerun_resumes(tmp_path, cluster, local_dir, monkeypatch, capsys):
    from editscope.run.ray_executor import RayExecutor

    out = tmp_path / "out"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(CONFIG | {"output": str(out)}))

    def kill_from_the_third(actor, task: int) -> None:  # groups 0 and 1 finish; every actor given a later one dies
        if task >= 2:
            ray.kill(actor)

    monkeypatch.setattr(RayExecutor, "on_dispatch", staticmethod(kill_from_the_third))
    capsys.readouterr()
    assert main(["run", str(config), "--executor", "ray", "--workers", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("editscope: error: no Ray worker is left (2 of 2 died); 2 of 4 groups finished"), line
    kept = _rows(out)
    local = _rows(local_dir)
    assert kept == local[:2]  # the finished groups' rows are kept
    assert read_json(out / "run.json")["status"] == "interrupted"

    rerun = shlex.split(line.split("rerun to resume: ", 1)[1])
    assert rerun[:3] == ["editscope", "run", str(config)]
    monkeypatch.setattr(RayExecutor, "on_dispatch", None)
    assert main(rerun[1:]) == 0
    assert _rows(out) == local
    assert "2 rows written, 2 already done" in capsys.readouterr().out


def _strip_digest(path) -> None:
    """The checkpoint as an earlier editscope wrote it: the same content without its content digest."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from editscope.integrity import DIGEST_KEY

    with safe_open(str(path), framework="pt") as fh:
        meta = {k: v for k, v in fh.metadata().items() if k != DIGEST_KEY}
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    save_file(tensors, str(path), metadata=meta)


class _Kill(Exception):
    pass


def test_trust_unverified_reaches_the_workers(tmp_path, cluster, tiny_llama, capsys):
    """A memit chain (3 rounds of 2) killed after its round-2 checkpoint, which then loses its digest (an earlier
    editscope's file). Resumed with --executor ray, the worker that continues the chain refuses it in one line
    without --trust-unverified, and uses it with the flag: run.json records the file as an in-process run does,
    and the rows equal an uninterrupted in-process run's."""
    from editscope.run.chain import chain_path

    data = {"model": "tiny-llama", "seed": 0, "mode": {"sequential_batches": {"batch": 2, "rounds": 3,
                                                                             "checkpoints": 1}},
            "methods": [{"name": "memit", "overrides": {"v_steps": 2}}], "dataset": "counterfact",
            "slice": {"limit": 6}, "suites": ["counterfact"]}
    config = parse_config(data)

    def kill(row):  # round 3 edited, the round-2 checkpoint on disk
        if not row["checkpoint"]:
            raise _Kill

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker runs: the same rounding
    try:
        Runner(config, out_dir=tmp_path / "whole", bundle=tiny_llama, progress=False).run()
        with pytest.raises(_Kill):
            Runner(config, out_dir=tmp_path / "out", bundle=tiny_llama, progress=False, on_row=kill).run()
    finally:
        torch.set_num_threads(threads)
    path = chain_path(tmp_path / "out", "counterfact", 0, "memit")
    _strip_digest(path)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data | {"output": str(tmp_path / "out")}))
    args = ["run", str(cfg), "--executor", "ray", "--workers", "1", "--no-progress"]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"editscope: error: {path}: chain checkpoint has no content "
                                                   "digest"), err[-2000:]
    assert main([*args, "--trust-unverified"]) == 0, capsys.readouterr().err[-2000:]
    meta = read_json(tmp_path / "out" / "run.json")
    assert meta["status"] == "complete" and meta["unverified_files"] == [str(path)]
    key = ("case_id", "edits_applied")
    assert sorted(_rows(tmp_path / "out"), key=lambda r: [r[k] for k in key]) == \
        sorted(_rows(tmp_path / "whole"), key=lambda r: [r[k] for k in key])
