"""``--executor ray``: a local Ray cluster (num_cpus=2) with two actors writes the same rows as the in-process
run (timings aside), in the same order, and a rerun resumes with nothing left to do."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from editscope.run import Runner, parse_config, read_results
from editscope.run.runner import timing_free

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

CONFIG = {"model": "tiny-llama", "seed": 0, "output": "unused", "save_patches": True,
          "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
          "dataset": "counterfact", "slice": {"offset": 0, "limit": 4}, "suites": ["counterfact"]}


def test_ray_rows_equal_in_process(tmp_path, tiny_llama):
    from editscope.run.ray_executor import RayRunner

    config = parse_config(CONFIG)
    # the workers run 1 torch thread each (threads_per_worker); a matmul's rounding depends on the thread count,
    # so the in-process reference runs with 1 thread too, or rows differ in the last bits
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Runner(config, out_dir=tmp_path / "local", bundle=tiny_llama, progress=False).run()
    finally:
        torch.set_num_threads(threads)
    try:
        result = RayRunner(config, workers=2, out_dir=tmp_path / "ray", progress=False).run()
        again = RayRunner(config, workers=2, out_dir=tmp_path / "ray", progress=False).run()
    finally:
        ray.shutdown()
    local = [timing_free(r) for r in read_results(tmp_path / "local" / "results.jsonl")]
    remote = [timing_free(r) for r in read_results(tmp_path / "ray" / "results.jsonl")]
    assert result.written == len(local) == 4 and again.written == 0
    assert remote == local
    # the actors save their patches into the run's folder, as the in-process run does
    saved = {d: sorted(p.relative_to(tmp_path / d) for p in (tmp_path / d / "patches").rglob("*.safetensors"))
             for d in ("local", "ray")}
    assert len(saved["local"]) == 4 and saved["ray"] == saved["local"]
    for rel in saved["local"]:
        here, there = load_file(tmp_path / "local" / rel), load_file(tmp_path / "ray" / rel)
        assert here.keys() == there.keys() and all(torch.equal(here[k], there[k]) for k in here)
