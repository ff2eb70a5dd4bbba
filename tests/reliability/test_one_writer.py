"""One writer per run directory: an OS lock held by run/resume/merge, and results files
with duplicate (dataset, case, method) keys refused unless repaired."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config, read_results
from editscope.run.store import run_lock
from tests.run.helpers import SUITES, base_config

CLI = [sys.executable, "-m", "editscope.cli"]


def _runner(out: Path, bundle, **kw) -> Runner:
    cfg = parse_config(base_config(methods=[{"name": "rome", "overrides": {"v_steps": 2}}],
                                   slice={"offset": 0, "limit": 2}), suites=SUITES)
    return Runner(cfg, out_dir=out, bundle=bundle, suite_factories=SUITES, progress=False,
                  log=lambda _m: None, **kw)


def test_second_writer_fails_naming_the_holder(tmp_path, tiny_llama):
    # The holder is another process, as in real use; the lock is the OS's, so nothing here can fake it.
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from editscope.run.store import run_lock
        with run_lock({str(tmp_path)!r}):
            print("locked", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(EditscopeError, match=f"pid {holder.pid}"):
            _runner(tmp_path, tiny_llama).run()
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "results.jsonl").exists()
    # Killed holder: the OS released the lock, the run goes ahead.
    result = _runner(tmp_path, tiny_llama).run()
    assert result.written == 2


def test_lock_is_released_on_error(tmp_path):
    with pytest.raises(RuntimeError), run_lock(tmp_path):
        raise RuntimeError("boom")
    with run_lock(tmp_path):  # would raise EditscopeError if still held
        pass


def test_duplicate_rows_are_refused_then_repaired(tmp_path, tiny_llama):
    _runner(tmp_path, tiny_llama).run()
    path = tmp_path / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 2
    path.write_text("".join(lines + [lines[0]]))  # a hand-duplicated line
    with pytest.raises(EditscopeError, match=r"results.jsonl:line 3: duplicate row .*first at line 1"):
        read_results(path)
    with pytest.raises(EditscopeError, match="duplicate row"):
        _runner(tmp_path, tiny_llama).run()  # resume refuses to count a case twice
    logs: list[str] = []
    runner = _runner(tmp_path, tiny_llama, repair=True)
    runner.log = logs.append
    result = runner.run()
    assert any("dropped 1 duplicate" in m for m in logs)
    assert result.written == 0 and result.total_rows == 2
    assert path.read_text() == "".join(lines)


@pytest.mark.slow
def test_two_concurrent_cli_runs_write_each_row_once(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent("""
        model: tiny-llama
        seed: 0
        output: out
        methods: [{name: rome, overrides: {v_steps: 2}}]
        dataset: counterfact
        slice: {offset: 0, limit: 3}
        suites: [counterfact]
    """))
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([*CLI, "run", str(config), "-o", str(out), "--no-progress"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    t0 = time.time()
    results = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    assert time.time() - t0 < 600
    codes = sorted(r[2] for r in results)
    assert codes[0] == 0, results
    if codes[1] != 0:  # the usual case: the second writer found the lock taken
        loser = next(r for r in results if r[2] != 0)
        assert "another editscope process (pid" in loser[1]
        assert "Traceback" not in loser[1]
    rows = read_results(out / "results.jsonl")  # raises on any duplicate
    assert sorted(r["case_id"] for r in rows) == sorted({r["case_id"] for r in rows}) and len(rows) == 3
