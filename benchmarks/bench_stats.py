"""Layer-statistics benchmark: token rate of C = E[k kᵀ] against a forward-only pass.

Over the same corpus rows (wikitext-2, as :func:`editscope.stats.second_moments` reads them), for the given
layers:

(a) :func:`editscope.stats.second_moment.accumulate`: forward stopped at the deepest layer's MLP key, k kᵀ sums
    at each layer (float32 products of <= 1024 tokens summed in float64; checked against float64 products);
(f) a forward-only pass stopped at the same point (no statistics): the floor (a) can reach;
(b) the same sums with the whole forward run (no early stop), as a pass that ignores the layers it needs.

Prints tokens per second of each, ``token rate ratio`` = rate(a) / rate(f) (goal >= 0.90), checks that (a) and
(b) give the same sums (1e-9 relative) and prints ``speedup X.XX`` = time(b) / time(a). Each is timed
``--rounds`` times, interleaved, keeping the fastest. Usage:

    .venv/bin/python benchmarks/bench_stats.py --tokens 8192 --layers 4 [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import time

import torch

from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import hooks, run_until
from editscope.stats import Corpus
from editscope.stats.second_moment import accumulate, add_outer, corpus_rows


def full_forward_sums(bundle, rows: torch.Tensor, layers: list[int], batch_rows: int,
                      exact: bool = False) -> dict[int, torch.Tensor]:
    """(b): the same sums with every block run; ``exact``: float64 products instead of float32 chunks."""
    dim, device = bundle.arch.mlp_size(bundle.config), bundle.device
    sums = {layer: torch.zeros(dim, dim, dtype=torch.float64, device=device) for layer in layers}

    def adder(layer: int):
        def fn(k: torch.Tensor) -> None:
            if exact:  # one float64 product of all tokens (the accumulation before the float32-chunk speed-up)
                flat = k.detach().reshape(-1, k.shape[-1]).double()
                sums[layer].addmm_(flat.T, flat)
            else:
                add_outer(sums[layer], k)

        return fn

    base = bundle.model.get_submodule(bundle.arch.base)
    with torch.no_grad(), hooks(bundle.model, bundle.arch, {f"blocks.{lay}.mlp_key": adder(lay) for lay in layers}):
        for start in range(0, rows.shape[0], batch_rows):
            batch = rows[start:start + batch_rows].to(device)
            base(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False)
    return {layer: total.cpu() for layer, total in sums.items()}  # on the host, as accumulate returns them


def stopped_forward(bundle, rows: torch.Tensor, last: int, batch_rows: int) -> None:
    """(f): the forward up to the deepest layer's MLP key, nothing else."""
    base = bundle.model.get_submodule(bundle.arch.base)
    with torch.no_grad():
        for start in range(0, rows.shape[0], batch_rows):
            batch = rows[start:start + batch_rows].to(bundle.device)
            run_until(bundle.model, bundle.arch, [f"blocks.{last}.mlp_key"],
                      lambda b=batch: base(input_ids=b, attention_mask=torch.ones_like(b), use_cache=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--layers", default="4", help="comma-separated layer indices")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-rows", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default: $EDITSCOPE_DEVICE, "
                                                       "else auto)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load(args.model, device=args.device)
    layers = sorted({int(x) for x in args.layers.split(",")})
    rows = corpus_rows(ScoringEngine(bundle), Corpus.default(), args.tokens, args.seq_len)
    n_tokens = int(rows.numel())

    best = {"a": float("inf"), "f": float("inf"), "b": float("inf")}
    sums_a = sums_b = None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        sums_a, _count = accumulate(bundle, rows, layers, batch_rows=args.batch_rows, progress=False)
        best["a"] = min(best["a"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        stopped_forward(bundle, rows, layers[-1], args.batch_rows)
        best["f"] = min(best["f"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        sums_b = full_forward_sums(bundle, rows, layers, args.batch_rows)
        best["b"] = min(best["b"], time.perf_counter() - t0)
    exact = full_forward_sums(bundle, rows, layers, args.batch_rows, exact=True)
    # compared on the host: the accumulated statistics live there, the bench's own sums beside the model
    sums_a, sums_b, exact = ({layer: s[layer].cpu() for layer in layers} for s in (sums_a, sums_b, exact))
    for layer in layers:
        diff = float((sums_a[layer] - sums_b[layer]).norm() / sums_b[layer].norm())
        if diff > 1e-9:
            raise SystemExit(f"layer {layer}: stopped and full-forward sums differ by {diff:.2e}")
        rounding = float((sums_a[layer] - exact[layer]).norm() / exact[layer].norm())
        print(f"layer {layer}: float32-chunk vs float64 products, relative Frobenius difference {rounding:.1e}")
        if rounding > 1e-6:
            raise SystemExit(f"layer {layer}: float32-chunk sums off by {rounding:.2e} > 1e-6")
    rate = {k: n_tokens / v for k, v in best.items()}
    print(f"{bundle.name}, layers {layers}, {n_tokens} tokens, {bundle.n_layers} blocks")
    print(f"(a) statistics, stopped after layer {layers[-1]}: {rate['a']:.0f} tok/s")
    print(f"(f) forward only, stopped at the same point:   {rate['f']:.0f} tok/s")
    print(f"(b) statistics with the whole forward:          {rate['b']:.0f} tok/s")
    print(f"token rate ratio {rate['a'] / rate['f']:.2f}")
    print(f"speedup {best['b'] / best['a']:.2f}")


if __name__ == "__main__":
    main()
