"""KLoB benchmark runner (paper 001 §3.4): locate every sentence of KLoB-c/-r/-u with each method, keep the
neuron scores on disk, and compute RSim (consistency on KLoB-c, relevance on KLoB-r) and RSD from those files.

Layout of the output folder (resumable; every number in ``metrics.json`` is recomputed from it):

- ``config.json``: model, fingerprint, methods and their options, recall filters (KLoB-c, KLoB-r), seed.
- ``examples.jsonl``: the selected examples (after the recall filter), fixed at the first run; ``counts.md``
  their number per relation (paper 001 Table 2 layout), also printed.
- ``scores/<method>/<subset>/<n>.npy``: float32 [n_prompts, layers, mlp] neuron scores of one example
  (``np.load(..., allow_pickle=False)``), written atomically before its result line.
- ``results.jsonl``: one line per (example, method) with the score file, its sha256, the wall seconds it took,
  and per prompt the text, answer token and method metadata; appended with flush + fsync; a run skips the
  pairs already there.
- ``metrics.json``, ``table.md``, ``figure.png``: written atomically at the end.

Metric conventions (see :mod:`editscope.metrics.klob`): scores are the methods' neuron scores as given (signed
for kn / grad_x_act / causal_trace, |k| for activation); N = layers × mlp neurons, not all parameters (paper 001
uses every parameter; locating methods here score neurons); Sim_all uses the paper's approximation, the top-k%
of the mean score over all results of the subset (KLoB-c or KLoB-r sentences); RSim is averaged over examples, an
example whose every result selects exactly that baseline (Sim_all = 1: RSim is 0/0) counting as 0;
RSD compares the mean per-result std over KLoB-c and KLoB-r sentences with that over KLoB-u sentences, on the
scores as given (the paper) and with each result divided by its L1 norm (``rsd_l1``: concentration, not size).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from editscope.atomic import atomic_write, atomic_write_bytes, atomic_write_text, file_lock, make_dirs
from editscope.data.klob_build import (
    KlobExample,
    KlobPrompt,
    build_klob,
    format_counts,
    recall_filter,
    relation_counts,
    shuffled,
)
from editscope.errors import EditscopeError
from editscope.finite import REASONS_KEY, strict_dumps, with_reasons
from editscope.jsonl import append_record, read_records
from editscope.lm.engine import ScoringEngine
from editscope.locate import METHODS, OPTION_RANGES, locate
from editscope.metrics.klob import rsd, rsim, sim_all, sim_cand
from editscope.ranges import check
from editscope.tables import Table

SUBSETS = ("c", "r", "u")

#: per-method options used by the bench unless overridden (cheaper than the single-fact defaults: the bench
#: only needs neuron scores, so causal tracing restores the MLP at the subject's last token only)
BENCH_OPTIONS: dict[str, dict[str, Any]] = {
    "causal_trace": {"kinds": ["mlp"], "tokens": "subject_last", "samples": 5},
    "kn": {"steps": 10},
    "grad_x_act": {},
    "activation": {},
    "random": {"seed": 0},
}


def _example_from_json(row: dict) -> KlobExample:
    return KlobExample(row["subset"], row["example_id"], row["relation"],
                       tuple(KlobPrompt(**p) for p in row["prompts"]), row["source"])


def select_examples(engine: ScoringEngine, n: int, *, seed: int = 0, recall: str = "any", recall_r: str = "all",
                    shots: int = 0, log: Callable[[str], None] = lambda _m: None) -> dict[str, list[KlobExample]]:
    """``n`` examples per subset: a seeded shuffle of each, KLoB-c/-r through the recall filter; ``log`` gets a
    line before and after each subset's filter."""
    sets = build_klob(u_limit=max(4 * n, 200))
    pool = sets["c"] + sets["r"]  # demonstrations: the same template about another subject, from either set
    out = {}
    for subset in SUBSETS:
        log(f"KLoB-{subset}: choosing {n} examples from {len(sets[subset])} built (recall filter)")
        out[subset] = recall_filter(engine, shuffled(sets[subset], seed), mode=recall, mode_r=recall_r,
                                    shots=shots, limit=n, pool=pool)
        log(f"KLoB-{subset}: {len(out[subset])} examples kept (of {len(sets[subset])} built)")
    return out


def counts_text(examples: dict[str, list[KlobExample]]) -> str:
    """Examples per relation of the kept KLoB-c and KLoB-r sets, laid out as paper 001's Table 2."""
    parts = [format_counts(relation_counts(examples[s]), f"KLoB-{s} examples kept") for s in ("c", "r")]
    return "\n\n".join(parts) + f"\n\nKLoB-u examples: {len(examples['u'])}\n"


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


#: declared ranges of run_bench's numbers (each k of ``ks``, ``n``, ``shots``), also the CLI's argparse types
RANGES = {"ks": "(0, 100]", "n": "[1, 1e7]", "shots": "[0, 64]"}


def _check_arguments(methods: Sequence[str], ks: Sequence[float], n: int, shots: int,
                     options: dict[str, dict[str, Any]] | None) -> None:
    """Refuse an unknown method or a number outside its declared range, before any work."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise EditscopeError(f"unknown locating methods {unknown}; choose from {', '.join(METHODS)}")
    if not ks:
        raise EditscopeError("run_bench: ks is empty; give at least one k in (0, 100]")
    for i, k in enumerate(ks):
        check(f"run_bench: ks[{i}]", k, RANGES["ks"])
    check("run_bench: n", n, RANGES["n"], int)
    check("run_bench: shots", shots, RANGES["shots"], int)
    for method, method_options in (options or {}).items():
        for name, (text, kind) in OPTION_RANGES.items():
            if method_options.get(name) is not None:
                check(f"run_bench: options[{method!r}][{name!r}]", method_options[name], text, kind)


def _write_config(config_path: Path, config: dict[str, Any], opts: dict[str, dict[str, Any]],
                  methods: Sequence[str]) -> None:
    """Write ``config.json``: a resumed folder must hold a run with the same settings; the methods' options are
    added to those already there."""
    if config_path.exists():
        old = json.loads(config_path.read_text())
        # folders written before the option existed: KLoB-r needed both facts, unless --recall none (no filter)
        old.setdefault("recall_r", "none" if old.get("recall") == "none" else "all")
        for key, value in config.items():
            if old.get(key) != value:
                raise EditscopeError(f"{config_path}: field {key}: this folder holds a run with {old.get(key)!r}, "
                                     f"not {value!r}; use another -o folder")
        config = old
    config.setdefault("options", {}).update({m: opts[m] for m in methods})
    atomic_write_text(config_path, strict_dumps(config, str(config_path), indent=1))


def _examples(engine: ScoringEngine, out: Path, config: dict[str, Any],
              log: Callable[[str], None]) -> dict[str, list[KlobExample]]:
    """The examples per subset: those fixed by an earlier run, else selected now (and written, with their
    counts)."""
    examples_path = out / "examples.jsonl"
    if examples_path.exists():
        rows = read_records(examples_path)
        return {s: [_example_from_json(r) for r in rows if r["subset"] == s] for s in SUBSETS}
    examples = select_examples(engine, config["n"], seed=config["seed"], recall=config["recall"],
                               recall_r=config["recall_r"], shots=config["shots"], log=log)
    atomic_write_text(examples_path, "".join(json.dumps(asdict(e)) + "\n" for s in SUBSETS for e in examples[s]))
    atomic_write_text(out / "counts.md", counts_text(examples))
    log(counts_text(examples))
    return examples


def _round_robin(examples: dict[str, list[KlobExample]]) -> list[tuple[str, int]]:
    """(subset, index) of example i of c, r, u, then i + 1: a run stopped early covers all three subsets."""
    longest = max(len(examples[s]) for s in SUBSETS)
    return [(s, i) for i in range(longest) for s in SUBSETS if i < len(examples[s])]


def _locate_example(engine: ScoringEngine, out: Path, method: str, subset: str, index: int, example: KlobExample,
                    opts: dict[str, Any]) -> None:
    """Locate every prompt of one example with one method: its scores file, then its result line."""
    started = time.perf_counter()
    results = [locate(engine, method, p.template, p.subject, p.answer, progress=False, **opts)
               for p in example.prompts]
    seconds = time.perf_counter() - started
    scores = np.stack([r.neurons for r in results]).astype(np.float32)
    rel = f"scores/{method}/{subset}/{index}.npy"
    data = _npy_bytes(scores)
    atomic_write_bytes(out / rel, data)
    append_record(out / "results.jsonl", {
        "subset": subset, "example_id": example.example_id, "method": method, "file": rel,
        "seconds": round(seconds, 3),
        "sha256": hashlib.sha256(data).hexdigest(),
        "prompts": [{"text": r.prompt, "answer": r.answer, "answer_token": r.answer_token,
                     "meta": {k: v for k, v in r.meta.items() if k != "tokens"}} for r in results]})


def _locate_all(engine: ScoringEngine, out: Path, methods: Sequence[str], examples: dict[str, list[KlobExample]],
                opts: dict[str, dict[str, Any]], progress: bool) -> None:
    """Locate every (example, method) unit not done in an earlier run, with one progress bar over all units."""
    done = {(r["example_id"], r["method"]) for r in read_records(out / "results.jsonl", repair=True)}
    order = _round_robin(examples)
    initial = sum((examples[s][i].example_id, m) in done for m in methods for s, i in order)
    bar = tqdm(total=len(methods) * len(order), initial=initial, desc="KLoB bench", unit="unit",
               disable=not progress, dynamic_ncols=True)
    for method in methods:
        for subset, index in order:
            example = examples[subset][index]
            if (example.example_id, method) in done:
                continue
            bar.set_postfix_str(f"{method} KLoB-{subset} {index + 1}/{len(examples[subset])}")
            _locate_example(engine, out, method, subset, index, example, opts[method])
            bar.update(1)
    bar.close()


def _write_metrics(out: Path, ks: Sequence[float]) -> dict:
    """Compute the metrics from the folder and write ``metrics.json``, ``table.md`` and ``figure.png``."""
    metrics = compute_metrics(out, ks)
    # an RSim/RSD that came out non-finite is null, with the reason under "non_finite" (editscope.finite)
    metrics = with_reasons(metrics)
    atomic_write_text(out / "metrics.json", strict_dumps(metrics, str(out / "metrics.json"), indent=1))
    atomic_write_text(out / "table.md", format_table(metrics))
    plot_metrics(metrics, out / "figure.png")
    return metrics


def run_bench(engine: ScoringEngine, out_dir: str | Path, *, methods: Sequence[str], ks: Sequence[float],
              n: int = 50, seed: int = 0, recall: str = "any", recall_r: str = "all", shots: int = 0,
              options: dict[str, dict[str, Any]] | None = None,
              progress: bool = True, log: Callable[[str], None] = lambda _m: None) -> dict:
    """Run (or resume) the benchmark in ``out_dir`` and return the metrics (also written there).

    ``progress``: one tqdm bar on stderr over the (example, method) units, those done in an earlier run counted as
    done (the methods' own bars stay off); it changes no number. ``log`` gets the example selection's lines."""
    _check_arguments(methods, ks, n, shots, options)
    out = make_dirs(out_dir, "bench output folder")
    opts = {m: {**BENCH_OPTIONS.get(m, {}), **(options or {}).get(m, {})} for m in methods}
    with file_lock(out / ".lock", blocking=False, what="klob bench"):
        config = {"model": engine.bundle.name, "fingerprint": engine.bundle.fingerprint, "n": n, "seed": seed,
                  "recall": recall, "recall_r": recall_r, "shots": shots}
        _write_config(out / "config.json", dict(config), opts, methods)
        examples = _examples(engine, out, config, log)
        _locate_all(engine, out, methods, examples, opts, progress)
        return _write_metrics(out, ks)


def load_scores(out_dir: str | Path) -> dict[str, dict[str, list[np.ndarray]]]:
    """{method: {subset: [scores [n_prompts, layers, mlp] per example]}} from a bench folder, each file checked
    against the sha256 its result line recorded."""
    out = Path(out_dir)
    table: dict[str, dict[str, list[np.ndarray]]] = {}
    for i, row in enumerate(read_records(out / "results.jsonl")):
        data = (out / row["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != row["sha256"]:
            raise EditscopeError(f"{out / 'results.jsonl'}:record {i}: field sha256: {row['file']} changed on disk")
        array = np.load(io.BytesIO(data), allow_pickle=False)
        table.setdefault(row["method"], {}).setdefault(row["subset"], []).append(array.astype(np.float64))
    return table


def group_rsims(groups: Sequence[np.ndarray], k: float) -> list[float | None]:
    """RSim of each candidate group (paper 001, §3.4 and appendix A) with Sim_all approximated by the top-k% of the
    mean score over every result of the subset; None where every member selects exactly the pool mean's top-k%
    (Sim_all = 1, hence Sim_cand = 1: RSim's formula is 0/0). Layer-level methods meet this (causal tracing scores
    all neurons of a layer alike, so its top-k% is a block of whole layers plus the first neurons of one more,
    and a fact's top layers are often the pool's)."""
    pool_mean = np.mean([r for g in groups for r in g], axis=0)
    out: list[float | None] = []
    for g in groups:
        baseline = sim_all(list(g), [pool_mean], k)
        out.append(None if baseline >= 1.0 else rsim(sim_cand(list(g), k), baseline))
    return out


def _mean_rsim(values: Sequence[float | None]) -> float:
    """Mean RSim over groups; a group at the baseline (:func:`group_rsims`'s None) counts as 0: its results are
    no more alike than the baseline, they *are* the baseline."""
    return float(np.mean([v or 0.0 for v in values]))


def group_rsim(groups: Sequence[np.ndarray], k: float) -> float:
    """Mean RSim over candidate groups (:func:`group_rsims`, :func:`_mean_rsim`)."""
    return _mean_rsim(group_rsims(groups, k))


def compute_metrics(out_dir: str | Path, ks: Sequence[float]) -> dict:
    """RSim (consistency, relevance) per k and RSD per method, from the files of a bench folder; ``at_baseline``
    counts, per k, the groups whose Sim_all is 1 (RSim 0 by :func:`_mean_rsim`'s convention)."""
    metrics: dict[str, Any] = {"ks": list(ks), "methods": {}}
    for method, subsets in load_scores(out_dir).items():
        row: dict[str, Any] = {"n": {s: len(subsets.get(s, [])) for s in SUBSETS}, "at_baseline": {}}
        for name, subset in (("consistency", "c"), ("relevance", "r")):
            groups = subsets.get(subset, [])
            row[name], row["at_baseline"][name] = {}, {}
            for k in ks:
                values = group_rsims(groups, k) if len(groups) >= 2 else []
                row[name][str(k)] = _mean_rsim(values) if values else None
                row["at_baseline"][name][str(k)] = values.count(None)
        factual = [r for s in ("c", "r") for g in subsets.get(s, []) for r in g]
        nonfactual = [r for g in subsets.get("u", []) for r in g]
        # RSD divides by SD_factual: undefined when every factual result is flat (on either scale)
        defined = factual and nonfactual and np.mean([np.std(r) for r in factual]) > 0
        row["rsd"] = rsd(factual, nonfactual) if defined else None
        row["rsd_l1"] = rsd(factual, nonfactual, scale="l1") if defined else None
        metrics["methods"][method] = row
    return metrics


def format_table(metrics: dict) -> str:
    """Markdown: RSim (consistency) and RSim (relevance) per k, and RSD (the paper's raw scores, and each result
    L1-normalised), one row per method; "[n]" after an RSim marks n groups at the baseline (Sim_all = 1, counted
    as 0)."""
    ks = metrics["ks"]
    head = (["method"] + [f"RSim-c k={k}%" for k in ks] + [f"RSim-r k={k}%" for k in ks]
            + ["RSD", "RSD (l1)", "n (c/r/u)"])

    def cell(v, at_baseline=0):
        return "–" if v is None else f"{v:.3f}" + (f" [{at_baseline}]" if at_baseline else "")

    rows = [[method] + [cell(row[name][str(k)], row["at_baseline"][name][str(k)])
                        for name in ("consistency", "relevance") for k in ks]
            + [cell(row["rsd"]), cell(row["rsd_l1"]), "/".join(str(row["n"][s]) for s in SUBSETS)]
            for method, row in metrics["methods"].items()]
    lines = [Table(head, rows, align="l" * len(head)).markdown()]
    if any(n for row in metrics["methods"].values() for per_k in row["at_baseline"].values() for n in per_k.values()):
        lines.append("\n[n]: n groups select exactly the top-k% of the subset's mean score (Sim_all = 1, where RSim is "
                     "0/0); they count as RSim 0.")
    if metrics.get(REASONS_KEY):
        lines.append(f"\nNot finite, recorded as null (–): {', '.join(sorted(metrics[REASONS_KEY]))}.")
    return "\n".join(lines) + "\n"


def plot_metrics(metrics: dict, path: str | Path) -> Path:
    """Three panels: RSim (consistency) vs k, RSim (relevance) vs k, RSD per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = metrics["ks"]
    methods = list(metrics["methods"])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, name, title in ((axes[0], "consistency", "RSim consistency (KLoB-c)"),
                            (axes[1], "relevance", "RSim relevance (KLoB-r)")):
        for method in methods:
            values = [metrics["methods"][method][name][str(k)] for k in ks]
            ax.plot(ks, [np.nan if v is None else v for v in values], marker="o", label=method)
        ax.set_xlabel("k (% of neurons selected)")
        ax.set_ylabel("RSim")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
    x = np.arange(len(methods))
    for offset, key, label, colour in ((-0.2, "rsd", "raw (paper)", "grey"), (0.2, "rsd_l1", "l1", "tab:blue")):
        values = [metrics["methods"][m][key] for m in methods]
        axes[2].bar(x + offset, [np.nan if v is None else v for v in values], width=0.4, color=colour, label=label)
    axes[2].set_xticks(x, methods)
    axes[2].set_title("RSD (KLoB-u vs factual)", fontsize=10)
    axes[2].legend(fontsize=8)
    axes[2].tick_params(axis="x", rotation=30)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=130))
    finally:
        plt.close(fig)
