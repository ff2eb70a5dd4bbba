"""Whole-run throughput: ``editscope run`` on a fixed small config, in edits per minute.

The config (written to a temporary folder): the model, ROME, MEMIT and AlphaEdit with their shipped hparams,
``mode: single``, the first N CounterFact cases scored by the ``counterfact`` suite and the first N zsRE cases by
the ``zsre`` suite (as ``configs/demo.yaml`` configures datasets and suites). Each run is a fresh
``editscope run`` process (model load, statistics from the disk cache, every edit, evaluation, summaries)
timed end to end; edits = result rows written. ``--paths fast,plain`` runs the config once per v* objective path
(``EDITSCOPE_FORWARD``: ``fast`` = editscope's, ``plain`` = the reference code's cost structure),
alternating the order per round so load from other processes hits both alike, and prints
``speedup X.XX`` = time(plain) / time(fast). ``batched`` is the fast path with ``EDITSCOPE_VSTAR_BATCH=N``
(``--vstar-batch``, default 8): mode single optimises the v*/z of N cases together (edit.objective); it prints
``batched speedup X.XX`` = time(fast) / time(batched). Usage:

    .venv/bin/python benchmarks/bench_run.py --cases 50 [--paths fast,plain,batched] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

METHODS = ("rome", "memit", "alphaedit")


def write_config(folder: Path, model: str, cases: int, methods: list[str]) -> Path:
    config = {
        "model": model,
        "seed": 0,
        "output": str(folder / "out"),
        "mode": "single",
        "methods": methods,
        "datasets": [
            {"dataset": "counterfact", "slice": {"offset": 0, "limit": cases}, "suites": ["counterfact"]},
            {"dataset": "zsre", "slice": {"offset": 0, "limit": cases}, "suites": ["zsre"]},
        ],
    }
    path = folder / "bench-run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def timed_run(config: Path, out: Path, env: dict[str, str], *extra: str, what: str = "") -> tuple[float, int]:
    """Seconds of one ``editscope run CONFIG --output OUT [extra]`` process (with ``env`` added to this process's
    environment) and the result rows it wrote; a failed run stops the benchmark with its output."""
    cmd = [sys.executable, "-c", "import sys; from editscope.cli import main; sys.exit(main())",
           "run", str(config), "--output", str(out), "--no-progress", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"editscope run {what} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    rows = sum(1 for line in (out / "results.jsonl").read_text().splitlines() if line.strip())
    return seconds, rows


def run_once(config: Path, out: Path, path: str, threads: int, vstar_batch: int = 8) -> tuple[float, int]:
    """Seconds of one ``editscope run`` process on forward strategy ``path`` and the result rows it wrote."""
    env = {"EDITSCOPE_FORWARD": "fast" if path == "batched" else path,
           "EDITSCOPE_VSTAR_BATCH": str(vstar_batch) if path == "batched" else "auto", "OMP_NUM_THREADS": str(threads)}
    return timed_run(config, out, env, what=f"({path})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=50, help="cases per dataset block")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--paths", default="fast", help="comma-separated: fast, full, plain, batched")
    parser.add_argument("--vstar-batch", type=int, default=8, help="cases optimised together on the batched path")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",")]
    methods = [m.strip() for m in args.methods.split(",")]
    times: dict[str, list[float]] = {p: [] for p in paths}
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        folder = Path(tmp)
        config = write_config(folder, args.model, args.cases, methods)
        for r in range(args.rounds):
            for path in paths if r % 2 == 0 else paths[::-1]:
                out = folder / f"out-{path}-{r}"
                seconds, rows = run_once(config, out, path, args.threads, args.vstar_batch)
                times[path].append(seconds)
                print(f"round {r} {path}: {rows} edits in {seconds:.1f} s = {60 * rows / seconds:.2f} edits per minute",
                      flush=True)
    for path in paths:
        best = min(times[path])
        print(f"{path}: {rows} edits, best {best:.1f} s, {60 * rows / best:.2f} edits per minute")
    if "fast" in times and "plain" in times:
        print(f"speedup {min(times['plain']) / min(times['fast']):.2f}")
    if "fast" in times and "batched" in times:
        print(f"batched speedup {min(times['fast']) / min(times['batched']):.2f}")


if __name__ == "__main__":
    main()
