"""Editor benchmark: ROME, MEMIT and AlphaEdit on the first N CounterFact records.

For each method (its shipped hparams for the model) and each record, one edit's patch is computed twice:

(a) editscope: the v*/z optimisation runs each step only on the positions δ can reach (the suffix from the
    subject's last token, over the prefix's cached keys/values; :mod:`editscope.lm.partial_forward`), the LM head
    only where the loss reads, no weight gradients; key forwards stop after the highest layer needed.
(b) the reference algorithms' cost structure (kmeng01/rome ``compute_v``, kmeng01/memit ``compute_z``): every
    step a full forward of every row from the embeddings and a log-softmax over the full vocabulary at every
    position (``EditRuntime(RuntimeSettings(forward="plain"))``).

(c) for ROME and MEMIT (``--batched``): the N records as runner ``mode: single`` edits them with
    runtime ``vstar_batch: N``: the v*/z of all N optimised together, one batched forward per step (each record
    its own δ and early stop; edit.objective.optimise), then each record's ΔW as in (a). Timed after
    (a)/(b); must agree with (a) to 1e-4 relative (SmolLM2, 4 records: 5.5e-6 measured).
    Prints ``batched speedup X.XX vs (b), Y.YY vs (a)``.

Same hparams, seeds, context prefixes, statistics and sequential-state template (as the runner: AlphaEdit's
null-space projector is computed once). (a) and (b) alternate which runs first, record by record, so load
from other processes hits both alike. Both patches must agree to 1e-4 relative (Frobenius norm over the
edited weights). Per method it prints seconds per edit of each, the agreement, ``speedup X.XX`` = time(b) /
time(a), and a cProfile summary of (a). Usage:

    .venv/bin/python benchmarks/bench_edit.py --cases 3 [--methods rome,memit,alphaedit] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from editscope.data.counterfact import load_counterfact
from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.context import context_templates
from editscope.edit.objective import independent_edits
from editscope.edit.runtime import EditRuntime, RuntimeSettings
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.paths import data_file


def requests(n: int) -> list[EditRequest]:
    cases = load_counterfact(data_file("counterfact/counterfact-edit.json"))
    return [case.requests[0] for case in cases[:n]]


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all edited weights (Frobenius)."""
    if a.keys() != b.keys():
        raise SystemExit(f"the two paths edited different weights: {sorted(a)} vs {sorted(b)}")
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b) ** 0.5
    den = sum(float(b[k].double().pow(2).sum()) for k in b) ** 0.5
    return num / den


def profile_summary(prof: cProfile.Profile, top: int) -> str:
    """Where (a)'s time goes: editscope functions by cumulative time, then everything by own time."""
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(r"editscope/(edit|lm|stats)/", top)
    stats.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip() and not ln.startswith(("   Ordered", "   List"))]
    return "\n".join("    " + ln for ln in lines)


def bench_method(bundle, method: str, reqs: list[EditRequest], top: int, batched: bool) -> None:
    editor = get_editor(method)
    hp = editor.load_hparams(bundle)
    engine = ScoringEngine(bundle)
    runtimes = {path: EditRuntime(RuntimeSettings(forward=path)) for path in ("fast", "plain")}
    for runtime in runtimes.values():  # ROME's template cache, per runtime
        context_templates(engine, hp.context_templates, hp.template_seed, cache=runtime.templates)
    # Warm-up outside the timing: statistics on disk, first-call costs, the state template (as the runner's).
    state = editor.new_state()
    editor.compute_patch(bundle, reqs[0], hp.replace(v_steps=1), state, engine=engine, runtime=runtimes["fast"])
    template = state.without_edits()

    times: dict[str, list[float]] = {"fast": [], "plain": []}
    diffs = []
    fast_deltas = []
    prof = cProfile.Profile()
    for i, req in enumerate(reqs):
        order = ("fast", "plain") if i % 2 == 0 else ("plain", "fast")
        deltas = {}
        for path in order:
            if path == "fast" and i == 0:
                prof.enable()
            t0 = time.perf_counter()
            patch = editor.compute_patch(bundle, req, hp, template.without_edits(), engine=engine,
                                         runtime=runtimes[path])
            times[path].append(time.perf_counter() - t0)
            prof.disable()
            deltas[path] = patch.deltas
        diffs.append(relative_difference(deltas["fast"], deltas["plain"]))
        fast_deltas.append(deltas["fast"])
        print(f"{method} record {i}: (a) {times['fast'][-1]:.2f} s  (b) {times['plain'][-1]:.2f} s  "
              f"rel. ΔW difference {diffs[-1]:.1e}", flush=True)
    fast, plain = sum(times["fast"]), sum(times["plain"])
    n = len(reqs)
    print(f"{method}: (a) editscope {fast / n:.2f} s/edit (median {statistics.median(times['fast']):.2f}), "
          f"(b) reference cost {plain / n:.2f} s/edit (median {statistics.median(times['plain']):.2f}), "
          f"max rel. ΔW difference {max(diffs):.1e}")
    print(f"{method} profile of (a), record 0:\n{profile_summary(prof, top)}")
    check(f"{method}: (a) and (b)", max(diffs))
    print(f"{method} speedup {plain / fast:.2f}", flush=True)
    if batched and n > 1:
        bench_batched(bundle, editor, hp, reqs, template, fast_deltas, fast, plain)


DISAGREEMENTS: list[str] = []


def check(what: str, diff: float, tol: float = 1e-4) -> None:
    """Record a ΔW disagreement above ``tol`` (the run goes on; main exits 1 at the end naming each)."""
    if not diff <= tol:  # NaN disagrees too
        DISAGREEMENTS.append(f"{what} disagree: relative ΔW difference {diff:.2e} > {tol:.0e}")
        print(f"DISAGREE {DISAGREEMENTS[-1]}", flush=True)


def bench_batched(bundle, editor, hp, reqs: list[EditRequest], template, fast_deltas: list[dict[str, torch.Tensor]],
                  fast: float, plain: float) -> None:
    """(c): the N records as the runner's ``mode: single`` edits them with runtime vstar_batch N: one window of
    independent edits, whose first edit optimises every record's v*/z in one batched loop (each record its own δ
    and early stop), then each record's ΔW as in (a). Must agree with (a) to 1e-4 relative."""
    engine = ScoringEngine(bundle)
    runtime = EditRuntime(RuntimeSettings(vstar_batch=len(reqs)))
    context_templates(engine, hp.context_templates, hp.template_seed, cache=runtime.templates)
    t0 = time.perf_counter()
    with independent_edits(runtime, bundle.fingerprint, [[r] for r in reqs]):
        patches = [editor.compute_patch(bundle, r, hp, template.without_edits(), engine=engine, runtime=runtime)
                   for r in reqs]
    batched = time.perf_counter() - t0
    diff = max(relative_difference(p.deltas, d) for p, d in zip(patches, fast_deltas, strict=True))
    n = len(reqs)
    print(f"{editor.name}: (c) batched B={n} {batched / n:.2f} s/edit, max rel. ΔW difference to (a) {diff:.1e}")
    check(f"{editor.name}: (c) and (a)", diff)  # float rounding of another batch shape through the Adam steps
    print(f"{editor.name} batched speedup {plain / batched:.2f} vs (b), {fast / batched:.2f} vs (a)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="rome,memit,alphaedit")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument("--batched", default="rome,memit", help="methods also timed as (c), the batched path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load(args.model)
    reqs = requests(args.cases)
    for method in args.methods.split(","):
        bench_method(bundle, method.strip(), reqs, args.profile_top, method.strip() in args.batched.split(","))
    if DISAGREEMENTS:
        raise SystemExit("; ".join(DISAGREEMENTS))


if __name__ == "__main__":
    main()
