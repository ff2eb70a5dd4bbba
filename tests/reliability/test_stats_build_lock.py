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
