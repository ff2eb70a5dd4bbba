"""Layer statistics are built once under a lock: concurrent first computations of the
same statistics compute them in one process; the others wait and read the cache, with equal values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import hashlib
    import importlib
    from editscope.lm import load

    sm = importlib.import_module("editscope.stats.second_moment")  # the package re-exports a same-named function

    built = []
    accumulate = sm.accumulate

    def counting(*args, **kwargs):  # the real accumulation, recorded
        built.append(1)
        return accumulate(*args, **kwargs)

    sm.accumulate = counting
    bundle = load("tiny-llama")
    c = sm.second_moments(bundle, [1, 2], token_budget=4000, progress=False)
    digest = hashlib.sha256(b"".join(c[k].numpy().tobytes() for k in (1, 2))).hexdigest()
    print(len(built), digest)
""")


def test_concurrent_first_computations_build_once(tmp_path):
    env = {**os.environ, "EDITSCOPE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    lines = [o[0].split() for o in outs]
    assert sorted(int(n) for n, _ in lines) == [0, 0, 1]  # one builder, two readers
    assert len({d for _, d in lines}) == 1  # every process got the same C


HOLDER = textwrap.dedent("""
    import importlib, sys
    from editscope.lm import load

    sm = importlib.import_module("editscope.stats.second_moment")
    accumulate = sm.accumulate

    def held(*args, **kwargs):  # building, under the lock: wait for the test's go
        print("building", flush=True)
        sys.stdin.readline()
        return accumulate(*args, **kwargs)

    sm.accumulate = held
    sm.second_moments(load("tiny-llama"), [1], token_budget=2000, progress=False)
""")


def test_a_waiting_process_names_the_builder(tmp_path, monkeypatch, capfd, tiny_llama):
    import importlib
    import threading

    sm = importlib.import_module("editscope.stats.second_moment")
    env = {**os.environ, "EDITSCOPE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "building"
        built = []
        monkeypatch.setattr(sm, "accumulate", lambda *a, **k: built.append(1))  # this process must not build
        threading.Timer(0.5, lambda: (holder.stdin.write("go\n"), holder.stdin.flush())).start()
        c = sm.second_moments(tiny_llama, [1], token_budget=2000, progress=False)
        assert holder.wait(timeout=120) == 0, holder.stderr.read()[-2000:]
    finally:
        holder.kill()
        holder.wait()
    assert built == [] and c[1].shape[0] == c[1].shape[1] > 0  # it waited, then read the holder's cache
    lines = [line for line in capfd.readouterr().err.splitlines() if "waiting for process" in line]
    assert len(lines) == 1
    assert f"waiting for process {holder.pid} (building layer statistics of tiny-llama, layers 1, 2000 tokens" \
        in lines[0]
