"""Ray scale-out on one machine: 2 Ray workers × 1 thread vs 1 process × 2 threads.

The same config both ways: the model (default SmolLM2-135M), ROME with its shipped hparams (``--v-steps``
overrides the v* optimisation's steps to keep the run short; both sides get the same value), ``mode: single``,
the first N CounterFact cases scored by the ``counterfact`` suite. Each side is a fresh ``editscope run``
process timed end to end (model load, Ray start-up and the actors' own model loads for Ray, statistics from the
disk cache, edits, evaluation, summaries), alternating the order per round so load from other processes hits
both alike. Prints cases/min of each and ``ratio X.XX`` = cases/min(Ray 2×1) / cases/min(local 1×2), with the
load average before and after (the machine may be shared). Usage:

    .venv/bin/python benchmarks/bench_ray.py [--cases 6] [--rounds 1] [--v-steps N] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import yaml

from bench_run import timed_run  # benchmarks/ is on sys.path when a script runs


def write_config(folder: Path, model: str, cases: int, v_steps: int | None) -> Path:
    method: dict = {"name": "rome"}
    if v_steps is not None:
        method["overrides"] = {"v_steps": v_steps}
    config = {"model": model, "seed": 0, "output": str(folder / "out"), "mode": "single", "methods": [method],
              "dataset": "counterfact", "slice": {"offset": 0, "limit": cases}, "suites": ["counterfact"]}
    path = folder / "bench-ray.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_once(config: Path, out: Path, executor: str) -> tuple[float, int]:
    """Seconds of one ``editscope run`` process and the result rows it wrote. Local: one process with 2 torch
    threads; Ray: 2 actors of 1 thread each (the driver also loads the model to check fingerprints)."""
    threads = "2" if executor == "local" else "1"
    extra = ["--executor", executor] + (["--workers", "2"] if executor == "ray" else [])
    return timed_run(config, out, {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}, *extra,
                     what=f"--executor {executor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--v-steps", type=int, default=None, help="override ROME's v* steps (default: shipped)")
    args = parser.parse_args()
    try:
        import ray  # noqa: F401, PLC0415 (optional dependency)
    except ImportError:
        raise SystemExit("bench_ray needs Ray: pip install 'editscope[ray]'") from None
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = write_config(folder, args.model, args.cases, args.v_steps)
        seconds: dict[str, list[float]] = {"local": [], "ray": []}
        for r in range(args.rounds):
            order = ("local", "ray") if r % 2 == 0 else ("ray", "local")
            for executor in order:
                s, rows = run_once(config, folder / f"out-{executor}-{r}", executor)
                if rows != args.cases:
                    raise SystemExit(f"{executor}: {rows} rows, expected {args.cases}")
                seconds[executor].append(s)
                print(f"round {r}: {executor:5s} {s:7.1f} s  {60 * rows / s:6.2f} cases/min", flush=True)
    per_min = {k: 60 * args.cases * len(v) / sum(v) for k, v in seconds.items()}
    print(f"model {args.model}, ROME, {args.cases} CounterFact cases, {args.rounds} round(s), "
          f"v_steps {args.v_steps or 'shipped'}; cpus {os.cpu_count()}; load average before "
          f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"local 1 process x 2 threads: {per_min['local']:.2f} cases/min; ray 2 workers x 1 thread: "
          f"{per_min['ray']:.2f} cases/min")
    print(f"ratio {per_min['ray'] / per_min['local']:.2f}")


if __name__ == "__main__":
    main()
