"""Statistics precision on a real model: float32 (compensated) against float64 C, and what it changes in an edit.

For the MEMIT layers of the model's shipped hparams (SmolLM2: 2-6, ROME's layer 4 among them), at the shipped token
budget over the default corpus (wikitext-2):

1. C in float64 (editscope's default: float32 k kᵀ products of <= 1,024 tokens summed in float64) and in float32
   (the same products, Kahan-compensated float32 sum), each computed in one pass over the same rows: seconds and
   ``time ratio`` float32 / float64 (baseline: the float64 pass of the same run), and per layer the relative
   Frobenius error ‖C32 − C64‖ / ‖C64‖.
2. One edit of CounterFact record ``--case`` with each editor of ``--methods`` (shipped hparams), once with
   ``mom2_dtype: float64`` and once with ``float32``: ‖ΔW32 − ΔW64‖ / ‖ΔW64‖ over the edited weights. The v*/z
   optimisation does not read C and is seeded, so both edits optimise the same targets; only the solve differs.

The float64 pass is timed without the cache; the float32 one goes through the cache (computed when missing, so
the float32 edit reads it; when it was cached already the time recorded in its file is printed). Usage:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_stats_precision.py [--methods rome memit] [--case 1500]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from safetensors import safe_open

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.paths import data_file
from editscope.stats import Corpus, cache_file, second_moments


def request(index: int) -> EditRequest:
    rec = json.loads(data_file("counterfact/counterfact-edit.json").read_text())[index]
    return EditRequest(rec["prompt"].replace(rec["subject"], "{}", 1), rec["subject"], rec["target_new"],
                       rec["ground_truth"])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def timed_float32(bundle, layers: list[int], budget: int) -> tuple[dict[int, torch.Tensor], float, str]:
    """float32 C through the cache: (C, seconds of the pass, 'computed' or 'cached (recorded time)')."""
    path = cache_file(bundle.fingerprint, layers[0], Corpus.default().digest, budget, 256, "float32")
    was_cached = path.is_file()
    t0 = time.perf_counter()
    c32 = second_moments(bundle, layers, token_budget=budget, stats_dtype="float32")
    seconds = time.perf_counter() - t0
    if not was_cached:
        return c32, seconds, "computed"
    with safe_open(str(path), "pt") as fh:
        return c32, float(json.loads(fh.metadata()["seconds"])), "cached (time recorded in its file)"


def edit_delta(bundle, engine, method: str, req: EditRequest, stats_dtype: str) -> dict[str, torch.Tensor]:
    editor = get_editor(method)
    hp = editor.load_hparams(bundle).replace(mom2_dtype=stats_dtype)
    patch = editor.apply(bundle, req, hp, editor.new_state(), engine=engine)
    deltas = {name: delta.detach().clone() for name, delta in patch.deltas.items()}
    patch.revert(bundle)
    return deltas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", nargs="+", default=["rome", "memit"])
    parser.add_argument("--case", type=int, default=1500, help="CounterFact record edited")
    args = parser.parse_args()
    bundle = load(args.model)
    engine = ScoringEngine(bundle)
    hp = get_editor("memit").load_hparams(bundle)
    layers, budget = list(hp.layers), hp.mom2_tokens
    print(f"{args.model} ({bundle.fingerprint}), layers {layers}, {budget} tokens of wikitext-2, "
          f"torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    c64 = second_moments(bundle, layers, token_budget=budget, use_cache=False)
    s64 = time.perf_counter() - t0
    c32, s32, how = timed_float32(bundle, layers, budget)
    print(f"float64 pass {s64:.1f} s (computed); float32 pass {s32:.1f} s ({how}); time ratio {s32 / s64:.2f}")
    for layer in layers:
        print(f"layer {layer}: ||C32 - C64|| / ||C64|| = {rel(c32[layer], c64[layer]):.2e}  "
              f"(dtype {c32[layer].dtype}, {c32[layer].numel() * 4 / 2**20:.1f} MiB vs "
              f"{c64[layer].numel() * 8 / 2**20:.1f} MiB)")
    req = request(args.case)
    for method in args.methods:
        d64 = edit_delta(bundle, engine, method, req, "float64")
        d32 = edit_delta(bundle, engine, method, req, "float32")
        num = sum(float((d32[n].double() - d64[n].double()).norm() ** 2) for n in d64) ** 0.5
        den = sum(float(d64[n].double().norm() ** 2) for n in d64) ** 0.5
        print(f"{method}: CounterFact record {args.case} ({req.subject!r} -> {req.target_new!r}): "
              f"||dW32 - dW64|| / ||dW64|| = {num / den:.2e} over {len(d64)} weight(s)")


if __name__ == "__main__":
    main()
