"""``editscope plan``'s prediction against a measured edit: peak RSS and seconds per edit, one editor at a time.

Each measurement is a fresh process (so its peak RSS, ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, is that of
one load and one edit): it loads the model, edits the first ``--requests`` CounterFact records with the editor's
shipped hparams (``--set KEY=VALUE`` overrides), reverts, and reports its peak RSS and the edit's seconds. The
parent plans the same edit (:func:`editscope.edit.budget.plan_edit`, statistics cached or not as they are on disk)
and prints predicted vs measured. Usage (CPU; one measurement at a time):

    python benchmarks/bench_plan.py --model smollm2-135m --methods rome,memit,alphaedit [--requests 1]
                                    [--set mom2_tokens=4096] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def child(args: argparse.Namespace) -> None:
    import resource
    import time

    from editscope.data.records import EditRequest
    from editscope.edit import edited
    from editscope.edit.hparams import parse_overrides
    from editscope.edit.registry import get_editor
    from editscope.lm import load

    records = json.loads(_records_file().read_text())[:args.requests]
    requests = [EditRequest(r["prompt"].replace(r["subject"], "{}"), r["subject"], r["target_new"],
                            r["ground_truth"]) for r in records]
    bundle = load(args.model, device="cpu", dtype=args.dtype)
    hp = get_editor(args.method).load_hparams(bundle, None, parse_overrides(args.set) or None)
    t0 = time.perf_counter()
    with edited(bundle, args.method, requests, hparams=hp):
        pass
    seconds = time.perf_counter() - t0
    print(json.dumps({"maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "seconds": seconds}))


def _records_file() -> Path:
    from editscope.paths import data_file

    try:
        return data_file("counterfact/counterfact-edit.json")
    except Exception:  # noqa: BLE001 (no shared data: the packaged sample)
        import editscope

        return Path(editscope.__file__).parent / "sample" / "counterfact-edit-sample.json"


def measure(model: str, method: str, requests: int, dtype: str, overrides: list[str]) -> dict:
    """Peak RSS (bytes) and seconds of one edit in a fresh process."""
    cmd = [sys.executable, __file__, "--child", "--model", model, "--methods", method, "--requests", str(requests),
           "--dtype", dtype]
    for item in overrides:
        cmd += ["--set", item]
    import tempfile

    from editscope.paths import home

    with tempfile.TemporaryDirectory() as tmp:
        # a fresh EDITSCOPE_HOME sharing only the converted models and the layer statistics: KN's cached attributions
        # (and any other cache) would skip the work being measured
        for name in ("models", "gguf", "stats", "tokenizers", "mend"):
            if (home() / name).is_dir():
                (Path(tmp) / name).symlink_to(home() / name, target_is_directory=True)
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "EDITSCOPE_HOME": tmp}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{method}: the measuring process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def predict(model: str, method: str, requests: int, dtype: str, overrides: list[str]):
    from editscope.edit.budget import model_shape, plan_edit, plan_hparams, stats_cached
    from editscope.edit.hparams import parse_overrides

    shape = model_shape(model)
    hp, note = plan_hparams(method, shape, model, None, parse_overrides(overrides))
    return plan_edit(shape, method, hp, dtype=dtype, device="cpu", requests=requests,
                     stats_cached=stats_cached(model, hp, dtype), hparams_note=note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="rome,memit,alphaedit")
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.method = args.methods
        child(args)
        return
    from editscope.edit.budget import MiB, measure_rates

    rows = []
    for method in args.methods.split(","):
        plan = predict(args.model, method, args.requests, args.dtype, args.set)
        rates = measure_rates("cpu", args.dtype, plan.model, rows=max(16, plan.batch_tokens))
        plan.rates = rates
        got = measure(args.model, method, args.requests, args.dtype, args.set)
        row = {"method": method, "requests": args.requests, "stats_cached": plan.stats_cached,
               "predicted_mib": round(plan.peak / MiB), "phase": plan.peak_phase,
               "measured_mib": round(got["maxrss"] / MiB), "ratio": round(plan.peak / got["maxrss"], 3),
               "predicted_s": round(plan.seconds_first_edit(), 2), "measured_s": round(got["seconds"], 2),
               "gflops": round(rates.matmul / 1e9, 1), "terms_mib": {t.name: round(t.bytes / MiB) for t in plan.terms
                                                                     if t.during(plan.peak_phase)}}
        rows.append(row)
        print(json.dumps(row) if args.json else
              f"{method:<10} predicted {row['predicted_mib']:>6} MiB ({row['phase']}), measured "
              f"{row['measured_mib']:>6} MiB, ratio {row['ratio']:.3f}; predicted {row['predicted_s']:.2f} s "
              f"(first edit; matmuls at {row['gflops']} GFLOP/s), measured {row['measured_s']:.2f} s; "
              f"terms {row['terms_mib']}",
              flush=True)


if __name__ == "__main__":
    main()
