"""Caches under concurrency: simultaneous first loads of a tiny model with an empty cache all
succeed, and the tokenizer folder they share is built once, completely, with nothing temporary left beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

LOADER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from editscope.lm import load  # imports first, so every process reaches the cache at about the same time

    root = Path(sys.argv[1])
    (root / f"ready-{sys.argv[2]}").touch()
    while not (root / "go").exists():
        time.sleep(0.01)
    bundle = load("tiny-llama")
    print(bundle.tokenizer("The Eiffel Tower is in Paris")["input_ids"])
""")


@pytest.mark.slow  # 8 processes importing torch + transformers: ~2 min on 2 busy cores
def test_concurrent_first_loads_of_a_tiny_model(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "EDITSCOPE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    n = 8
    procs = [subprocess.Popen([sys.executable, "-c", LOADER, str(tmp_path), str(i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.time() + 240
    while len(list(tmp_path.glob("ready-*"))) < n and time.time() < deadline:
        time.sleep(0.05)
    (tmp_path / "go").touch()
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [err[-2000:] for _, err in results]
    outs = {out.strip() for out, _ in results}
    assert len(outs) == 1  # every process tokenizes the same way
    folder = home / "tokenizers" / "gpt2"
    files = sorted(p.name for p in folder.iterdir())
    for name in ("merges.txt", "vocab.json", "tokenizer_config.json", "tokenizer.json"):
        assert name in files
    assert sorted(p.name for p in folder.parent.iterdir()) == [".gpt2.lock", "gpt2"]  # no temporary folder left
