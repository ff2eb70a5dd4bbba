"""The GPU check at the papers' scale, in parts that each fit a short GPU lease (``benchmarks/gpu_check.sh`` runs them).

``--part big``: a random-init model with Llama-3-8B's config (transformers' LlamaConfig: hidden 4,096, 32 layers,
d_ff 14,336, 32/8 heads, vocabulary 128,256; bfloat16 weights; the editors keep their statistics, keys and solves in
float32/float64 as they always do) and the SmolLM2 tokenizer (its ids are < that vocabulary). Random weights hold
no knowledge to preserve, so the statistics come from a small token budget (``--stats-tokens``). For MEMIT, ROME,
UltraEdit and AlphaEdit (that order: MEMIT's first edit computes the statistics of layers 4-8, which hold ROME's
layer 5): the first edit's seconds (statistics, AlphaEdit's projectors), the peak device memory of the editor's
edits, ``editscope plan``'s prediction of both beside them, then one more edit under the default runtime and the
same edit under the reference code's cost structure ``EditRuntime(RuntimeSettings(forward="plain", vstar_batch=1))``,
their ratio, and whether the reverts left the edited matrices bit-equal.

``--part lifelong``: SmolLM2, sequential batches of 100 CounterFact-stream edits (batched z, a small sampled
re-probe at every checkpoint) through the runner, one method per call, until ``--seconds`` pass; the rows are the
runner's own (``results.jsonl``), and edits per minute come from the rows' edit and evaluation seconds.

Every figure is appended to ``--out``/gpu_check.jsonl as soon as it is measured, so a killed run keeps what it has.
``--dry``: the same code on the CPU with a small model (10 layers, hidden 64) and tiny budgets, to
check the script before GPU minutes are spent on it. Usage:

    python benchmarks/gpu_check.py --part big --out OUT [--device cuda] [--dry] [--seconds 240]
    python benchmarks/gpu_check.py --part lifelong --method alphaedit --out OUT [--seconds 200] [--dry]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch

#: Llama-3-8B's config.json values (meta-llama/Meta-Llama-3-8B), as transformers' LlamaConfig arguments
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001,
             "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
#: --dry: 10 layers (Llama-3-8B's hparams edit layers 4-8), every width small
DRY = {**LLAMA3_8B, "num_hidden_layers": 10, "hidden_size": 64, "intermediate_size": 224, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2}
#: the order of the big part (see the module docstring) and each editor's requests per edit
BIG_METHODS = {"memit": 4, "rome": 1, "ultraedit": 4, "alphaedit": 4}


class Figures:
    """Appends one JSON object per measured figure to OUT/gpu_check.jsonl and echoes it."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu_check.jsonl"

    def write(self, kind: str, **values) -> None:
        row = {"kind": kind, "time": round(time.time(), 1), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_info(device: torch.device) -> dict:
    import transformers

    info = {"device": str(device), "torch": torch.__version__, "transformers": transformers.__version__}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"card": props.name, "card_mib": props.total_memory // 2**20}
    return info


def requests(n: int, offset: int = 0) -> list:
    from editscope.data import load_cases

    return [case.request for case in load_cases("counterfact", limit=n, offset=offset)]


# -- the 8B-shaped model --------------------------------------------------------------------------------------------
def build_big(dry: bool, device: torch.device, tokenizer_dir: str | None):
    """The random-init bundle (bfloat16; seed 0) and its transformers config."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from editscope.lm.bundle import finish
    from editscope.lm.loading import prepare

    values = DRY if dry else LLAMA3_8B
    config = transformers.LlamaConfig(**values)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 8B parameters never pass through the host
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or prepare("smollm2-135m"))
    # hashing 16 GB of weights would cost more than an edit: the config and the seed name these weights
    fingerprint = hashlib.sha256(json.dumps({"config": values, "seed": 0, "dtype": "bfloat16"},
                                            sort_keys=True).encode()).hexdigest()
    name = "llama3-8b-random" + ("-dry" if dry else "")
    return finish(model, tokenizer, name, "random init, Llama-3-8B config", fingerprint), config


def edited_matrices(bundle, layers) -> dict[str, torch.Tensor]:
    """Copies of the MLP output matrices of ``layers`` (what every editor here writes)."""
    return {name: p.detach().clone() for name, p in bundle.model.named_parameters()
            if any(f"layers.{i}.mlp.down_proj" in name for i in layers)}


def timed_edit(bundle, method: str, reqs, hp, runtime=None, state=None) -> float:
    from editscope.edit import edited

    device = bundle.device
    sync(device)
    start = time.perf_counter()
    with edited(bundle, method, reqs, hparams=hp, runtime=runtime, state=state):
        sync(device)
        return time.perf_counter() - start


def big_hparams(method: str, shape, stats_tokens: int, v_steps: int | None):
    """Llama-3-8B's shipped hparams (UltraEdit: derived), the statistics budget overridden."""
    from dataclasses import fields

    from editscope.edit.budget import plan_hparams
    from editscope.edit.registry import get_editor

    editor = get_editor(method)
    if method == "ultraedit":  # no shipped or derived 8B hparams: the reference's Mistral-7B settings (32 layers)
        layers = [29, 30] if shape.n_layers == 32 else [shape.n_layers - 3, shape.n_layers - 2]
        return (editor.hparams_class.from_dict({"layers": layers, "lr": 1e-6, "ridge": 1.0}, "<ultraedit 8B>"),
                "the reference's Mistral-7B settings: down_proj of layers 29-30, lr 1e-6, ridge 1")
    names = {f.name for f in fields(editor.hparams_class)}
    overrides = {"mom2_tokens": stats_tokens, "v_steps": v_steps}
    return plan_hparams(method, shape, "llama3-8b", overrides={k: v for k, v in overrides.items()
                                                                  if k in names and v is not None})


def big_row(bundle, shape, rates, method: str, n: int, args) -> dict:
    """One editor on the 8B-shaped model: measured first edit, peak, warm default vs plain, against the plan."""
    from editscope.edit.budget import MiB, plan_edit
    from editscope.edit.registry import get_editor
    from editscope.edit.runtime import EditRuntime, RuntimeSettings

    hp, note = big_hparams(method, shape, args.stats_tokens, args.v_steps)
    cached = method != "memit"  # MEMIT runs first and computes layers 4-8's statistics
    plan = plan_edit(shape, method, hp, dtype="bfloat16", device=str(bundle.device), requests=n, stats_cached=cached,
                     hparams_note=note, rates=rates)
    before = edited_matrices(bundle, hp.layers)
    if bundle.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(bundle.device)
    # the sequential editors' state as a run carries it: AlphaEdit's projectors are computed by the first edit only
    state = get_editor(method).new_state()
    first = timed_edit(bundle, method, requests(n), hp, state=state)
    warm = timed_edit(bundle, method, requests(n, offset=n), hp, EditRuntime(), state=state)
    peak = torch.cuda.max_memory_allocated(bundle.device) / MiB if bundle.device.type == "cuda" else None
    reference = EditRuntime(RuntimeSettings("plain", 1))
    plain = timed_edit(bundle, method, requests(n, offset=n), hp, reference, state=state)
    exact = all(torch.equal(p, dict(bundle.model.named_parameters())[k]) for k, p in before.items())
    return {"method": method, "requests": n, "layers": list(hp.layers), "hparams": note,
            "stats_cached_before": cached, "first_edit_s": round(first, 2),
            "predicted_first_edit_s": round(plan.seconds_first_edit(), 2), "warm_s": round(warm, 2),
            "predicted_warm_s": round(plan.seconds_per_edit(), 2), "plain_vstar1_s": round(plain, 2),
            "plain_over_default": round(plain / warm, 3), "peak_mib": None if peak is None else round(peak),
            "predicted_peak_mib": round(plan.peak / MiB), "predicted_peak_phase": plan.peak_phase,
            "revert_bit_equal": exact}


def part_big(args, figures: Figures) -> None:
    from editscope.edit.budget import measure_rates, shape_of_config

    device = torch.device(args.device)
    figures.write("device", part="big", dry=args.dry, **device_info(device))
    t0 = time.perf_counter()
    bundle, config = build_big(args.dry, device, args.tokenizer)
    sync(device)
    shape = shape_of_config(config, bundle.name)
    figures.write("big_model", params=shape.n_params, build_s=round(time.perf_counter() - t0, 1),
                  weights_mib=round(sum(p.numel() * p.element_size() for p in bundle.model.parameters()) / 2**20),
                  stats_tokens=args.stats_tokens)
    rates = measure_rates(str(device), "bfloat16", shape, rows=256)
    figures.write("rates", matmul_tflops=round(rates.matmul / 1e12, 2), fp64_tflops=round(rates.fp64 / 1e12, 2))
    deadline = time.monotonic() + args.seconds  # for the edits: no editor starts after it
    for method, n in BIG_METHODS.items():
        if time.monotonic() > deadline:
            figures.write("skipped", method=method, why=f"the part's {args.seconds} s were spent")
            continue
        try:
            figures.write("big_edit", **big_row(bundle, shape, rates, method, n, args))
        except Exception as err:  # noqa: BLE001 (one editor's failure must not hide the others' figures)
            import traceback

            figures.write("failed", method=method, error=f"{type(err).__name__}: {err}",
                          trace=traceback.format_exc()[-1500:])


# -- lifelong on SmolLM2 ----------------------------------------------------------------------------------------------
def lifelong_config(method: str, dry: bool, out: Path) -> dict:
    from editscope.edit.registry import get_editor

    batch = 10 if dry else 100
    # an editor that writes no weight (a memory or a context) has no ΔW for the weights suite to measure
    suites = ["counterfact", "weights"] if get_editor(method).kind == "weights" else ["counterfact"]
    return {"model": "tiny-llama" if dry else "smollm2-135m", "seed": 0, "output": str(out), "mode": {
        "sequential_batches": {"batch": batch, "rounds": 100, "checkpoints": 2, "reprobe": batch, "sampled": True}},
        "methods": [method], "datasets": [{"dataset": "counterfact-stream", "suites": suites}]}


def part_lifelong(args, figures: Figures) -> None:
    """The runner in a child process, stopped after ``--seconds``; meanwhile the rows it writes (a checkpoint every
    2 rounds) are read as they come, so each checkpoint gets its wall-clock time since the start."""
    import gzip
    import os
    import shutil
    import subprocess
    import sys

    runs = Path(args.runs or args.out)
    out = runs / f"lifelong-{args.method}"
    cfg = runs / f"lifelong-{args.method}.yaml"
    runs.mkdir(parents=True, exist_ok=True)
    cfg.write_text(json.dumps(lifelong_config(args.method, args.dry, out), indent=1))  # JSON is YAML
    figures.write("device", part="lifelong", method=args.method, dry=args.dry,
                  **device_info(torch.device(args.device)))
    cmd = [sys.executable, "-m", "editscope", "run", str(cfg), "-o", str(out), "--device", args.device]
    start = time.perf_counter()
    # the progress bar (the runner's latest news: template sampling, z steps, probes) goes to its own file, so a
    # chain that reaches no checkpoint in time still shows where its time went
    progress = (Path(args.out) / f"lifelong-{args.method}.progress").open("w")
    child = subprocess.Popen(cmd, env={**os.environ, "EDITSCOPE_DEVICE": args.device}, stderr=progress)
    seen: dict[int, float] = {}  # edits applied -> seconds since the start when its checkpoint rows appeared
    while child.poll() is None and time.perf_counter() - start < args.seconds:
        time.sleep(2.0)
        for applied in checkpoints(out):
            seen.setdefault(applied, round(time.perf_counter() - start, 1))
    how = "finished" if child.poll() is not None else f"stopped after {args.seconds:.0f} s"
    if child.poll() is None:
        child.kill()
        child.wait()
    progress.close()
    figures.write("lifelong", method=args.method, how=how, checkpoint_seconds=seen, curve=curve(out))
    if (out / "results.jsonl").is_file():  # the rows themselves, compressed (the GPU machine's files come back small)
        with (out / "results.jsonl").open("rb") as src, gzip.open(Path(args.out) / f"{out.name}.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


def checkpoints(out: Path) -> set[int]:
    """Edits applied at each checkpoint whose rows are in ``out``/results.jsonl so far (a torn last line skipped)."""
    path = out / "results.jsonl"
    found = set()
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("checkpoint"):
                found.add(int(row["edits_applied"]))
    return found


def curve(out: Path) -> list[dict]:
    """Per checkpoint: rows, mean ES/PS/NS after the edits (sampled re-probe and the batch just written), and the
    weights suite's growth of the edited matrices."""
    from collections import defaultdict

    from editscope.run import read_results

    path = out / "results.jsonl"
    groups: dict[int, list] = defaultdict(list)
    round_seconds: dict[int, float] = {}
    for row in read_results(path) if path.is_file() else []:
        if row.get("checkpoint") and row.get("group") == 0:  # the first chain (a group is 100 rounds)
            groups[int(row["edits_applied"])].append(row["metrics"])
            if row.get("stratum", [False])[0]:  # the batch just written: its row holds that round's edit seconds
                round_seconds[int(row["edits_applied"])] = float(row["edit_seconds"])
    points = []
    for applied, metrics in sorted(groups.items()):
        def mean(suite: str, key: str, metrics=metrics) -> float | None:
            values = [m[suite][key] for m in metrics if key in m.get(suite, {})]
            return round(sum(values) / len(values), 4) if values else None
        points.append({"edits": applied, "rows": len(metrics), "edit_s_last_round": round_seconds.get(applied),
                       "ES": mean("counterfact", "ES_post"),
                       "PS": mean("counterfact", "PS_post"), "NS": mean("counterfact", "NS_post"),
                       "NormGrowth": mean("weights", "NormGrowth"), "DeltaSigma": mean("weights", "DeltaSigma")})
    return points


def part_stats(args, figures: Figures) -> None:
    """SmolLM2's layer statistics for every editor of the agreement test, computed once on ``--device`` before the
    test's CPU and GPU runs read them from the shared cache (its CPU workers would each compute them again)."""
    from editscope.edit.registry import get_editor
    from editscope.lm import load
    from editscope.stats import second_moments

    bundle = load("smollm2-135m", device=args.device)
    by_setting: dict[tuple, set[int]] = {}
    for method in args.methods.split(","):
        editor = get_editor(method)
        hp = editor.load_hparams(bundle)
        if layers := editor.stats_layers(hp):
            by_setting.setdefault((editor.stats_tokens(hp), editor.stats_dtype(hp)), set()).update(layers)
    start = time.perf_counter()
    for (budget, dtype), layers in sorted(by_setting.items()):
        second_moments(bundle, sorted(layers), token_budget=budget, stats_dtype=dtype)
    figures.write("smollm2_stats", settings=[[b, d, sorted(ls)] for (b, d), ls in sorted(by_setting.items())],
                  seconds=round(time.perf_counter() - start, 1), fingerprint=bundle.base_fingerprint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("big", "lifelong", "stats"), required=True)
    parser.add_argument("--out", required=True, help="folder for gpu_check.jsonl and the runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dry", action="store_true", help="small model, tiny budgets (a CPU check of the script)")
    parser.add_argument("--seconds", type=float, default=240.0,
                        help="big: no editor starts after this many seconds of editing; lifelong: the run stops then")
    parser.add_argument("--stats-tokens", type=int, default=8192, help="layer-statistics token budget (big part)")
    parser.add_argument("--v-steps", type=int, default=None, help="override v*/z steps (default: shipped)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: SmolLM2's, converted here)")
    parser.add_argument("--method", default="alphaedit", help="lifelong part: the editor")
    parser.add_argument("--methods", default="rome,memit,alphaedit,ft,prune,rect,evk_edit,kn",
                        help="stats part: the editors whose statistics to compute")
    parser.add_argument("--runs", default=None, help="lifelong part: where the run folder goes (default --out)")
    args = parser.parse_args()
    figures = Figures(Path(args.out))
    {"big": part_big, "lifelong": part_lifelong, "stats": part_stats}[args.part](args, figures)


if __name__ == "__main__":
    main()
