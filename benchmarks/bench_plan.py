"""``editscope plan``'s prediction against a measured edit: peak RSS and seconds per edit, one editor at a time.

Each measurement is a fresh process, so its peak RSS (VmHWM, :func:`editscope.edit.budget.peak_rss`; not
``ru_maxrss``, which in a vfork + exec child includes the parent's peak) is that of one load and one edit: it loads
the model, edits the first ``--requests`` CounterFact records with the editor's shipped hparams (``--set KEY=VALUE``
overrides), reverts, and reports its peak RSS and the edit's seconds. The parent plans the same edit
(:func:`editscope.edit.budget.plan_edit`, statistics cached or not as they are on disk) and prints predicted vs
measured. Usage (CPU; one measurement at a time):

    python benchmarks/bench_plan.py --model smollm2-135m --methods rome,memit,alphaedit [--requests 1]
                                    [--set mom2_tokens=4096] [--json]

``--real-size qwen3-0.6b``: the model is a random-init one with Qwen3-0.6B's shape (transformers' Qwen3Config:
hidden 1024, 28 layers, d_ff 3072, 16/8 heads of 128, vocab 151,936, tied embeddings; float32 safetensors and the
SmolLM2 tokenizer, whose ids are < that vocab), built once under ``--real-size-dir``. After the measured edit (so
the peak is its), each child times the same edit again with the statistics cached, under the default runtime and
under the reference cost structure ``EditRuntime(RuntimeSettings(forward="plain", vstar_batch=1))``; the row gives
their ratio:

    python benchmarks/bench_plan.py --real-size qwen3-0.6b --set mom2_tokens=2048 --set v_steps=5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
#: random-init stand-ins for real models: transformers config class and its arguments
REAL_SIZES = {"qwen3-0.6b": ("Qwen3Config", {
    "hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 3072, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151_936, "tie_word_embeddings": True,
    "max_position_embeddings": 40_960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6})}


def build_real_size(name: str, folder: Path) -> Path:
    """A random-init model of ``name``'s shape saved as float32 safetensors with the SmolLM2 tokenizer (once)."""
    out = folder / f"{name}-random"
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from editscope.lm.loading import prepare

    config_class, kwargs = REAL_SIZES[name]
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = folder / f".{name}-random.tmp"
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(prepare("smollm2-135m")).save_pretrained(tmp)
    tmp.rename(out)
    return out


def child(args: argparse.Namespace) -> None:
    import time

    from editscope.edit import edited
    from editscope.edit.budget import peak_rss
    from editscope.edit.hparams import parse_overrides
    from editscope.edit.registry import get_editor
    from editscope.edit.runtime import EditRuntime, RuntimeSettings
    from editscope.lm import load

    requests = _requests(args.requests)
    bundle = load(args.model, device="cpu", dtype=args.dtype)
    hp = get_editor(args.method).load_hparams(bundle, None, parse_overrides(args.set) or None)
    t0 = time.perf_counter()
    with edited(bundle, args.method, requests, hparams=hp):
        pass
    seconds = time.perf_counter() - t0
    row = {"maxrss": peak_rss(), "seconds": seconds}
    if args.baseline:  # after the peak is read, statistics cached: the default runtime again, then the reference
        reference = EditRuntime(RuntimeSettings("plain", 1))
        for key, runtime in (("warm_seconds", EditRuntime()), ("baseline_seconds", reference)):
            t0 = time.perf_counter()
            with edited(bundle, args.method, requests, hparams=hp, runtime=runtime):
                pass
            row[key] = time.perf_counter() - t0
    print(json.dumps(row))


def _requests(n: int) -> list:
    """The first ``n`` CounterFact edits (the packaged sample where the shared data is missing)."""
    from editscope.data import load_cases
    from editscope.errors import EditscopeError

    try:
        cases = load_cases("counterfact", limit=n)
    except EditscopeError:
        cases = load_cases("counterfact-sample", limit=n)
    return [case.request for case in cases]


def measure(model: str, method: str, requests: int, dtype: str, overrides: list[str], baseline: bool = False) -> dict:
    """Peak RSS (bytes) and seconds of one edit in a fresh process (and the reference runtime's seconds)."""
    cmd = [sys.executable, __file__, "--child", "--model", model, "--methods", method, "--requests", str(requests),
           "--dtype", dtype] + (["--baseline"] if baseline else [])
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
    from editscope.edit.budget import converted_cached, model_shape, plan_edit, plan_hparams, stats_cached
    from editscope.edit.hparams import parse_overrides

    shape = model_shape(model)
    hp, note = plan_hparams(method, shape, model, None, parse_overrides(overrides))
    return plan_edit(shape, method, hp, dtype=dtype, device="cpu", requests=requests,
                     stats_cached=stats_cached(model, hp, dtype), hparams_note=note,
                     converted=converted_cached(model, dtype))


def row_of(args: argparse.Namespace, method: str) -> dict:
    """Predicted vs measured for one editor."""
    from editscope.edit.budget import MiB, measure_rates

    plan = predict(args.model, method, args.requests, args.dtype, args.set)
    rates = measure_rates("cpu", args.dtype, plan.model, rows=max(16, plan.batch_tokens))
    plan.rates = rates
    got = measure(args.model, method, args.requests, args.dtype, args.set, baseline=bool(args.real_size))
    row = {"method": method, "requests": args.requests, "stats_cached": plan.stats_cached, "converted": plan.converted,
           "predicted_mib": round(plan.peak / MiB), "phase": plan.peak_phase,
           "measured_mib": round(got["maxrss"] / MiB), "ratio": round(plan.peak / got["maxrss"], 3),
           "predicted_s": round(plan.seconds_first_edit(), 2), "measured_s": round(got["seconds"], 2),
           "gflops": round(rates.matmul / 1e9, 1), "terms_mib": {t.name: round(t.bytes / MiB) for t in plan.terms
                                                                 if t.during(plan.peak_phase)}}
    if "baseline_seconds" in got:
        row["warm_s"] = round(got["warm_seconds"], 2)
        row["baseline_s"] = round(got["baseline_seconds"], 2)
        row["speedup"] = round(got["baseline_seconds"] / got["warm_seconds"], 3)
    return row


def line_of(row: dict) -> str:
    text = (f"{row['method']:<10} predicted {row['predicted_mib']:>6} MiB ({row['phase']}), measured "
            f"{row['measured_mib']:>6} MiB, ratio {row['ratio']:.3f}; predicted {row['predicted_s']:.2f} s "
            f"(first edit; matmuls at {row['gflops']} GFLOP/s), measured {row['measured_s']:.2f} s")
    if "baseline_s" in row:
        text += (f"; statistics cached: {row['warm_s']:.2f} s, plain/vstar_batch=1 {row['baseline_s']:.2f} s "
                 f"(baseline / default {row['speedup']:.3f})")
    return text + f"; terms {row['terms_mib']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="rome,memit,alphaedit")
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--real-size", choices=sorted(REAL_SIZES), default=None,
                        help="edit a random-init model of this shape (replaces --model)")
    parser.add_argument("--real-size-dir", default=None, help="where it is built (default: EDITSCOPE_HOME/bench)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.method = args.methods
        child(args)
        return
    if args.real_size:
        from editscope.paths import home

        folder = Path(args.real_size_dir) if args.real_size_dir else home() / "bench"
        folder.mkdir(parents=True, exist_ok=True)
        args.model = str(build_real_size(args.real_size, folder))
    for method in args.methods.split(","):
        row = row_of(args, method)
        print(json.dumps(row) if args.json else line_of(row), flush=True)


if __name__ == "__main__":
    main()
