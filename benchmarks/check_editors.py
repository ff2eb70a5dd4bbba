"""Real-model check of the editors on SmolLM2-135M with CounterFact (not part of the test suite).

1. One edit at a time on the first N records (ROME, MEMIT, AlphaEdit by default), reverted after each:
   efficacy = share of records with mean log-prob of target_new > of ground_truth on the edit prompt (the
   CounterFact ES comparison), paraphrase success = the same on rephrase_prompt, and after every revert the
   edited parameters are bit-identical and the case scores exactly as before.
2. N edits applied sequentially (AlphaEdit with its accumulated keys, MEMIT), efficacy/paraphrase over all N
   at the end, then all patches reverted in reverse order (checked bit-exact).

Prints a table; ``--out FILE`` appends one JSON line per finished method. Usage:

    .venv/bin/python benchmarks/check_editors.py --n 50 --seq-n 50
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch
from safetensors import safe_open

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.paths import data_file
from editscope.stats import Corpus, cache_file, second_moments


def records(n: int, start: int = 0) -> list[tuple[EditRequest, str]]:
    data = json.loads(data_file("counterfact/counterfact-edit.json").read_text())[start:]
    out = []
    for rec in data:
        if rec["subject"] not in rec["prompt"]:
            continue
        template = rec["prompt"].replace(rec["subject"], "{}", 1)
        out.append((EditRequest(template, rec["subject"], rec["target_new"], rec["ground_truth"]),
                    rec["rephrase_prompt"]))
        if len(out) == n:
            break
    return out


def case_scores(engine: ScoringEngine, req: EditRequest, rephrase: str) -> list[float]:
    pairs = [(req.text, req.target_new), (req.text, req.target_true), (rephrase, req.target_new),
             (rephrase, req.target_true)]
    return [s.mean for s in engine.score(pairs)]


def checksum(model, names) -> str:
    params = dict(model.named_parameters())
    h = hashlib.sha256()
    for n in sorted(names):
        h.update(params[n].detach().numpy().tobytes())
    return h.hexdigest()


def stats_seconds(bundle, layers: list[int], budget: int) -> tuple[float, float]:
    """(seconds now — cached when already computed, seconds recorded when the cache was first written)."""
    t0 = time.perf_counter()
    second_moments(bundle, layers, token_budget=budget)
    now = time.perf_counter() - t0
    recorded = 0.0
    digest = Corpus.default().digest
    passes = {}
    for layer in layers:
        with safe_open(str(cache_file(bundle.fingerprint, layer, digest, budget, 256)), "pt") as fh:
            meta = fh.metadata()
        passes[meta["layers_in_pass"]] = float(json.loads(meta["seconds"]))
    recorded = sum(passes.values())
    return now, recorded


def single(bundle, engine, method: str, cases, log) -> dict:
    editor = get_editor(method)
    hp = editor.load_hparams(bundle)
    names = [bundle.arch.weight_name(layer) for layer in hp.layers]
    stats_now, stats_first = stats_seconds(bundle, hp.layers, hp.mom2_tokens) if method != "ft" else (0.0, 0.0)
    ok = para = exact = 0
    seconds = []
    base_state = editor.new_state()
    for i, (req, rephrase) in enumerate(cases):
        before_sum = checksum(bundle.model, names)
        pre = case_scores(engine, req, rephrase)
        t0 = time.perf_counter()
        state = base_state.without_edits()  # every EditState declares its reset
        patch = editor.apply(bundle, req, hp, state, engine=engine)
        if i == 0:
            base_state = state  # keep the projectors computed by the first edit
        seconds.append(time.perf_counter() - t0)
        post = case_scores(engine, req, rephrase)
        patch.revert(bundle)
        again = case_scores(engine, req, rephrase)
        same = checksum(bundle.model, names) == before_sum and again == pre
        ok += post[0] > post[1]
        para += post[2] > post[3]
        exact += same
        steps = [len(r["losses"]) for r in patch.info.get("requests", [])]
        log(f"  {method} {i:>3} {req.subject[:28]:<28} pre {pre[0]:7.2f}/{pre[1]:7.2f}  post {post[0]:7.2f}/"
            f"{post[1]:7.2f}  para {post[2]:7.2f}/{post[3]:7.2f}  {seconds[-1]:6.1f}s v*-steps {steps} "
            f"revert-exact {same}")
    n = len(cases)
    return dict(method=method, mode="single", n=n, efficacy=ok / n, paraphrase=para / n, exact_reverts=exact,
                seconds_per_edit=sum(seconds) / n, stats_seconds_now=stats_now, stats_seconds_first=stats_first,
                layers=hp.layers)


def sequential(bundle, engine, method: str, cases, log) -> dict:
    editor = get_editor(method)
    hp = editor.load_hparams(bundle)
    names = [bundle.arch.weight_name(layer) for layer in hp.layers]
    before_sum = checksum(bundle.model, names)
    state = editor.new_state()
    patches, seconds = [], []
    try:
        for i, (req, _) in enumerate(cases):
            t0 = time.perf_counter()
            patches.append(editor.apply(bundle, req, hp, state, engine=engine))
            seconds.append(time.perf_counter() - t0)
            log(f"  {method} sequential edit {i:>3} {req.subject[:28]:<28} {seconds[-1]:6.1f}s")
        scores = [case_scores(engine, req, reph) for req, reph in cases]
    finally:
        for patch in reversed(patches):
            patch.revert(bundle)
    n = len(cases)
    return dict(method=method, mode="sequential", n=n, efficacy=sum(s[0] > s[1] for s in scores) / n,
                paraphrase=sum(s[2] > s[3] for s in scores) / n,
                exact_reverts=int(checksum(bundle.model, names) == before_sum), seconds_per_edit=sum(seconds) / n,
                stats_seconds_now=0.0, stats_seconds_first=0.0, layers=hp.layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=50, help="records for one-at-a-time edits")
    parser.add_argument("--seq-n", type=int, default=50, help="records for sequential edits")
    parser.add_argument("--methods", nargs="*", default=["rome", "memit", "alphaedit"])
    parser.add_argument("--sequential", nargs="*", default=["alphaedit", "memit"])
    parser.add_argument("--out", default=None, help="append one JSON line per finished method")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--start", type=int, default=0, help="skip the first records (to split a run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)

    bundle = load(args.model)
    engine = ScoringEngine(bundle)
    rows = []
    jobs = [(m, "single", args.n) for m in args.methods] + [(m, "sequential", args.seq_n) for m in args.sequential]
    for method, mode, n in jobs:
        if n <= 0:
            continue
        cases = records(n, args.start)
        log(f"{method} ({mode}, {n} records)")
        row = (single if mode == "single" else sequential)(bundle, engine, method, cases, log)
        rows.append(row)
        log(json.dumps(row))
        if args.out:
            with open(Path(args.out), "a") as fh:
                fh.write(json.dumps(row) + "\n")
    print(f"\n{'method':<10} {'mode':<10} {'n':>3} {'efficacy':>8} {'paraphr.':>8} {'exact':>6} {'s/edit':>7} "
          f"{'stats s (first/now)':>20}")
    for r in rows:
        exact = f"{r['exact_reverts']}/{r['n']}" if r["mode"] == "single" else ("yes" if r["exact_reverts"] else "NO")
        print(f"{r['method']:<10} {r['mode']:<10} {r['n']:>3} {r['efficacy']:>8.2f} {r['paraphrase']:>8.2f} "
              f"{exact:>6} {r['seconds_per_edit']:>7.1f} {r['stats_seconds_first']:>12.0f}/"
              f"{r['stats_seconds_now']:.2f}")


if __name__ == "__main__":
    main()
