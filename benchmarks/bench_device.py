"""Seconds per edit and peak accelerator memory of every editor, and low-precision edits, on one device.

For each editor (its shipped hparams for the model) the first ``--cases`` CounterFact records are edited one at
a time, each edit applied, scored and reverted (``editscope.edit.edited``); the first record is a warm-up and
not timed. Per editor it prints seconds per edit (the median), the peak memory the device allocated while that
editor ran (CUDA only), the post-edit probability of the new target, and whether every revert was bit-exact.

Then ``--dtypes``: ROME on the same records in each precision, against float32: the largest gap of the scores
before and after the edit (probabilities), and bit-exact revert. docs/scale.md holds a measured table. Usage:

    python benchmarks/bench_device.py --device cuda [--cases 4] [--methods rome,memit,...] [--dtypes bfloat16,float16]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from editscope.data import load_cases
from editscope.data.records import EditRequest
from editscope.edit import edited
from editscope.lm import load
from editscope.lm.engine import ScoringEngine

METHODS = "rome,memit,alphaedit,prune,rect,ft,evk_edit,kn"


def requests(n: int) -> list[EditRequest]:
    return [case.request for case in load_cases("counterfact", limit=n)]


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().cpu().view(torch.uint8).numpy().tobytes())  # bytes: exact in every dtype
    return h.hexdigest()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probabilities(engine: ScoringEngine, reqs: list[EditRequest]) -> list[float]:
    """P(target_new) of each request's own prompt (mean-token probability, as the CounterFact suite reads it)."""
    return [float(torch.tensor(s.mean).exp()) for s in engine.score([(r.text, r.target_new) for r in reqs])]


def time_editor(bundle, method: str, reqs: list[EditRequest]) -> dict:
    device = next(bundle.model.parameters()).device
    engine = ScoringEngine(bundle)
    before = weights_digest(bundle.model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, post = [], []
    for i, req in enumerate(reqs):
        sync(device)
        start = time.perf_counter()
        with edited(bundle, method, req, engine=engine):
            sync(device)
            took = time.perf_counter() - start
            post.append(probabilities(engine, [req])[0])
        if i:  # the first edit warms caches (statistics, templates, kernels)
            seconds.append(took)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    return {"method": method, "s_per_edit": statistics.median(seconds), "peak_mib": peak,
            "p_new_post": statistics.mean(post), "revert_exact": weights_digest(bundle.model) == before}


def precision_rows(model: str, device: str, dtypes: list[str], reqs: list[EditRequest]) -> list[dict]:
    """ROME in each dtype against float32: largest probability gaps before/after the edit, bit-exact revert."""
    def scores(bundle) -> tuple[list[float], list[float], bool]:
        engine = ScoringEngine(bundle)
        before = weights_digest(bundle.model)
        pre, post = probabilities(engine, reqs), []
        for req in reqs:
            with edited(bundle, "rome", req, engine=engine):
                post.append(probabilities(engine, [req])[0])
        return pre, post, weights_digest(bundle.model) == before

    ref_pre, ref_post, _ = scores(load(model, device=device))
    rows = []
    for dtype in dtypes:
        pre, post, exact = scores(load(model, device=device, dtype=dtype))
        rows.append({"dtype": dtype, "max_gap_pre": max(abs(a - b) for a, b in zip(pre, ref_pre, strict=True)),
                     "max_gap_post": max(abs(a - b) for a, b in zip(post, ref_post, strict=True)),
                     "revert_exact": exact})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default: $EDITSCOPE_DEVICE, "
                                                       "else auto)")
    parser.add_argument("--cases", type=int, default=4, help="records per editor; the first is a warm-up")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--dtypes", default="bfloat16,float16", help="precisions compared with float32 ('' : none)")
    args = parser.parse_args()
    reqs = requests(args.cases)
    bundle = load(args.model, device=args.device)
    device = next(bundle.model.parameters()).device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.model} on {device} ({name}), torch {torch.__version__}, {args.cases - 1} timed edits each")
    print(f"{'method':<10} {'s/edit':>8} {'peak MiB':>9} {'P(new) post':>12} revert")
    for method in args.methods.split(","):
        try:
            row = time_editor(bundle, method, reqs)
        except Exception as err:  # one editor's failure must not hide the others' rows
            print(f"{method:<10} FAILED: {type(err).__name__}: {err}", flush=True)
            continue
        print(f"{method:<10} {row['s_per_edit']:>8.3f} {row['peak_mib']:>9.0f} {row['p_new_post']:>12.3f} "
              f"{'bit-exact' if row['revert_exact'] else 'DIFFERS'}", flush=True)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if dtypes:
        print(f"ROME in lower precision vs float32 ({len(reqs)} records)")
        for row in precision_rows(args.model, str(device), dtypes, reqs):
            print(f"{row['dtype']:<9} max |ΔP| pre {row['max_gap_pre']:.4f}  post {row['max_gap_post']:.4f}  "
                  f"revert {'bit-exact' if row['revert_exact'] else 'DIFFERS'}", flush=True)


if __name__ == "__main__":
    main()
