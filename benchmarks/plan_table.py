"""The predicted GPU memory of one edit for the papers' models (the config.json fixtures under tests/fixtures/configs),
as the Markdown table docs/scale.md holds. No weights, no GPU: ``editscope.edit.budget`` from the configs.

    python benchmarks/plan_table.py [--dtype bfloat16] [--methods rome,memit,alphaedit,kn,mend,ft] [--tflops 400]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from editscope.edit.budget import GiB, Rates, model_shape, plan_edit, plan_hparams

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "configs"
MODELS = ["gpt2-xl", "gpt-j-6B", "Llama-2-7b-hf", "Mistral-7B-v0.1", "Meta-Llama-3-8B", "Qwen3-8B"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--methods", default="rome,memit,alphaedit,kn,mend,ft")
    parser.add_argument("--tflops", type=float, default=None, help="matmul rate for a time column (TFLOP/s)")
    parser.add_argument("--fp64-tflops", type=float, default=None)
    parser.add_argument("--flops", action="store_true",
                        help="cells: TFLOP per edit in the dtype + float64 TFLOP per edit (+ once per run) instead")
    args = parser.parse_args()
    methods = args.methods.split(",")
    print(f"| model ({args.dtype}) | " + " | ".join(methods) + " |")
    print("|---|" + "---:|" * len(methods))
    for name in MODELS:
        shape = model_shape(str(CONFIGS / name))
        cells = []
        for method in methods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hp, _ = plan_hparams(method, shape, name)
            rates = Rates(args.tflops * 1e12, (args.fp64_tflops or args.tflops / 2) * 1e12) if args.tflops else None
            cold = plan_edit(shape, method, hp, dtype=args.dtype, device="cuda", rates=rates)
            warm = plan_edit(shape, method, hp, dtype=args.dtype, device="cuda", stats_cached=True, rates=rates)
            if args.flops:
                per = sum(v for k, v in cold.flops.items() if not k.startswith("once") and not k.endswith("fp64"))
                fp64 = sum(v for k, v in cold.flops.items() if not k.startswith("once") and k.endswith("fp64"))
                once = sum(v for k, v in cold.flops.items() if k.startswith("once"))
                cells.append(f"{per / 1e12:.1f} + {fp64 / 1e12:.1f} fp64" + (f" (+{once / 1e12:,.0f})" if once else ""))
                continue
            cell = f"{warm.peak / GiB:.1f}"
            if cold.peak > warm.peak + GiB // 10:
                cell += f" ({cold.peak / GiB:.1f})"
            cell += f" {warm.biggest().name}"
            if rates:
                cell += f", {warm.seconds_per_edit():.2f} s"
            if not warm.editable:
                cell += " *"
            cells.append(cell)
        print(f"| {name} ({shape.n_params / 1e9:.2f}B, L{shape.n_layers}, d_ff {shape.mlp}) | " + " | ".join(cells)
              + " |")


if __name__ == "__main__":
    main()
