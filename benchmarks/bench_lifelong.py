"""Lifelong-editing benchmark: sequential batches through the runner, and one batch's z against the reference cost.

(a) A lifelong run of ``--rounds`` batches of ``--batch`` CounterFact edits with one editor (default AlphaEdit, its
    shipped hparams), an evaluation checkpoint after every round (counterfact + general suites), through
    ``editscope.run.Runner`` as ``editscope run`` does. Prints the wall time per phase — z (the v*/z optimisation),
    the rest of the edit (keys, solves, state), evaluation — and edits per minute.
(b) One batch of ``--z-batch`` requests: the ΔW of one batch edit computed as editscope does (the one optimiser,
    requests batched, the suffix-only forward) and with the reference code's cost structure (memit / AlphaEdit
    ``compute_z``: one request at a time, a full forward from the embeddings, a full-vocabulary log-softmax at every
    position: ``EditRuntime(RuntimeSettings(forward="plain", vstar_batch=1))``), and with editscope's forward one
    request at a time (what batching alone buys; EVK-Edit ran so before its copies joined the main batch), same
    hparams, same process.
    The two one-at-a-time structures may be timed on ``--ref-sample`` of the requests (their cost per request does
    not depend on the batch). Prints ``ratio X.XX`` = z seconds per request, reference / editscope, and the
    relative ΔW differences on a batch of the sampled requests (must be <= 1e-4).
    It also prints the FLOP ratio of the two structures (:func:`flop_counts`): what the work itself allows an exact
    computation of the same optimiser steps to save, the ceiling of the ratio where matmuls dominate (SmolLM2).
(c) Peak resident memory (VmHWM) after every round of (a): flat memory means the last is within ~10% of the first.
(u) UltraEdit against AlphaEdit (the baseline) on the same batch of ``--u-batch`` CounterFact requests, same process,
    each from a fresh chain state after a warm-up edit (so AlphaEdit's statistics and projector, computed once per
    chain, are not counted): seconds per edit of each and ``ratio X.X`` = AlphaEdit / UltraEdit.
(g) The editors that write no weight against AlphaEdit (the baseline) on the same batch of ``--u-batch`` CounterFact
    requests, same process: GRACE (its codebook placed request by request, the values trained together), retrieval
    (facts stored; BM25 needs no index until queried) and PROMPT, each from a fresh store, AlphaEdit after a warm-up
    edit as in (u). Prints seconds per edit and ``ratio X.X`` = AlphaEdit / each; and GRACE's value training (30
    steps on ``--s-cases`` requests) as it runs now (the values together, from its layer and the query token on)
    against a full forward each step, one request at a time (the faithful baseline, as it ran before), ``ratio`` =
    full / now. Then (s) the scoring overhead of a context editor's longer prompts: the counterfact suite probes
    ``--s-cases`` cases with no edit, then with the retrieval store of the batch in force (one fact before each
    prompt) and with IKE's 32 demonstrations, ``ratio`` = with / without (the engine shares each context's forward
    among its continuations, and a context edit's opening text among the prompts that share it); then IKE's probe
    with that opening forwarded once per prompt against once per case (``share_prefix``).
(k) A checkpoint's evaluation cost at ``--k-edits`` (default 1,000 and 10,000) edits applied, emulated: a synthetic
    accumulated ΔW (one real UltraEdit batch's ΔW scaled to that many edits) is folded into the bundle as a chain
    does, and the suites of ``lifelong-stream`` (counterfact, general, weights) probe the cases that config's
    checkpoint probes at that point (the config is ``sampled``: the batch just written plus the re-probe sample; the
    mode's batch/checkpoints/reprobe, overridable). Prints the seconds per suite and ``ratio`` = at the largest /
    at the smallest, for the config's case sets and for one fixed case set (what the edits on the weights alone
    change).

Usage: .venv/bin/python benchmarks/bench_lifelong.py [--model smollm2-135m] [--method alphaedit] [--batch 100]
       [--rounds 10] [--z-batch 100] [--ref-sample K] [--threads 2] [--parts ab] [--u-batch 100]
       [--k-edits 1000,10000] [--k-batch B --k-every K --k-reprobe N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from editscope.data.counterfact import load_counterfact
from editscope.edit import EditRuntime, RuntimeSettings, get_editor
from editscope.edit import registry as registry_module
from editscope.edit.objective import solve as solve_module
from editscope.lm import load
from editscope.paths import data_file
from editscope.run import Runner, parse_config


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class ZTimer:
    """Wall time spent inside the one optimiser (the v*/z loop), by wrapping the function every editor calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._optimise = solve_module.optimise

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return self._optimise(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        solve_module.optimise = timed

    def restore(self) -> None:
        solve_module.optimise = self._optimise


class PhaseTimer:
    """Wall time inside the v*/z optimiser (:class:`ZTimer`) and inside whole edits, by wrapping the two functions
    the runner calls; the peak RSS after each edit (one edit = one round in sequential batches)."""

    def __init__(self) -> None:
        self.edit = 0.0
        self.rss: list[tuple[int, float]] = []
        self.edits = 0
        self._z: ZTimer | None = None

    @property
    def z(self) -> float:
        return self._z.seconds if self._z is not None else 0.0

    def install(self) -> None:
        self._z = ZTimer()
        apply = registry_module.Editor.apply

        def timed_apply(editor, bundle, requests, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return apply(editor, bundle, requests, *args, **kwargs)
            finally:
                self.edit += time.perf_counter() - t0
                self.edits += len(requests) if isinstance(requests, list | tuple) else 1
                self.rss.append((self.edits, peak_rss_mb()))

        registry_module.Editor.apply = timed_apply


def part_a(bundle, args, timer: PhaseTimer) -> None:
    config = parse_config({
        "model": args.model, "seed": 0, "output": "unused",
        "mode": {"sequential_batches": {"batch": args.batch, "rounds": args.rounds, "checkpoints": 1}},
        "methods": [args.method], "dataset": "counterfact", "slice": {"offset": 0, "limit": args.batch * args.rounds},
        "suites": ["counterfact", "general"]})
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        Runner(config, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None).run()
        wall = time.perf_counter() - t0
    n = args.batch * args.rounds
    print(f"(a) {args.method}: {n} edits in {args.rounds} batches of {args.batch}, checkpoint every round: "
          f"wall {wall:.1f} s = z {timer.z:.1f} s + rest of edit {timer.edit - timer.z:.1f} s + evaluation "
          f"{wall - timer.edit:.1f} s; {n / wall * 60:.1f} edits/min overall, {n / timer.edit * 60:.1f} edits/min "
          "editing")
    for edits, rss in timer.rss:
        print(f"(c) peak RSS after {edits} edits: {rss:.0f} MiB")
    if len(timer.rss) >= 2:
        print(f"(c) peak RSS last / first round: {timer.rss[-1][1] / timer.rss[0][1]:.3f}")


def _timed_patch(editor, bundle, reqs, hp, runtime) -> tuple[dict, float, float]:
    """(ΔW per parameter, whole-edit seconds, z seconds) of one batch edit."""
    z = ZTimer()
    try:
        t0 = time.perf_counter()
        deltas = editor.compute_patch(bundle, reqs, hp, runtime=runtime).deltas
        return deltas, time.perf_counter() - t0, z.seconds
    finally:
        z.restore()


def _rel_diff(a: dict, b: dict) -> float:
    den = sum(float(d.double().pow(2).sum()) for d in b.values()) ** 0.5
    return sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b) ** 0.5 / den


def flop_counts(bundle, editor, hp, reqs) -> tuple[float, float]:
    """Matmul FLOPs of one optimiser step over ``reqs`` (forward + backward; weights frozen, so a backward matmul
    costs what its forward does), (reference cost structure, editscope): the reference runs every token of every row
    through all blocks and the LM head forward, then the blocks after δ's and the LM head backward, all positions
    (its tensors are whole rows); editscope runs the lanes' padded suffix tokens through the blocks after δ's and the
    LM head at the positions the loss reads, forward and backward. The ratio is the most an exact computation of the
    same steps can save; attention's score matmuls and the elementwise work are left out (a few % here)."""
    from editscope.edit.context import context_templates
    from editscope.edit.objective import VSpec, build_context, request_groups
    from editscope.lm.engine import ScoringEngine
    from editscope.lm.partial_forward import lanes_of, start_block

    engine = ScoringEngine(bundle)
    blocks = bundle.model.get_submodule(bundle.arch.blocks)
    per_token_block = 2 * sum(m.weight.numel() for m in blocks[0].modules() if isinstance(m, torch.nn.Linear))
    head = 2 * bundle.model.get_output_embeddings().weight.numel()
    templates = context_templates(engine, hp.context_templates, hp.template_seed, hp.template_start)
    spec = VSpec.of(hp, f"blocks.{hp.layers[-1]}.resid_post", templates)
    ctxs = [build_context(engine, r, spec.templates, spec.hook_point, terms=spec.terms()) for r in reqs]
    n, after = bundle.n_layers, bundle.n_layers - start_block(spec.hook_point, bundle.n_layers)[0]
    reference = editscope = 0.0
    for group in request_groups(ctxs, engine.token_budget):
        counts, read = [], 0
        for c in (ctxs[i] for i in group):
            tokens = int(c.batch.attention_mask.sum())
            reference += tokens * (n + after) * per_token_block + 2 * tokens * head
            counts += [e - p + 1 for e, p in zip(c.last_read, c.subject_positions, strict=True)]
            read += sum(c.batch.continuation_lengths[r] for r in range(c.n_rewrite)) + len(c.essence_rows)
        padded = sum(len(lane) * max(counts[r] for r in lane) for lane in lanes_of(counts))
        editscope += 2 * (padded * after * per_token_block + read * head)
    return reference, editscope


def part_b(bundle, args) -> None:
    """z per request: editscope on the whole batch of ``--z-batch`` requests; the two one-request-at-a-time
    structures on ``--ref-sample`` of them (all by default). One request at a time, a request's cost does not depend
    on the others, so their per-request time is measured on the sample; the ΔW agreement is checked on a batch of
    the sampled requests computed all three ways."""
    import random

    editor = get_editor(args.method)
    hp = editor.load_hparams(bundle)
    cases = load_counterfact(data_file("counterfact/counterfact-edit.json"))
    reqs = [c.requests[0] for c in cases[: args.z_batch]]
    k = min(args.ref_sample or len(reqs), len(reqs))
    sample = reqs if k == len(reqs) else [reqs[i] for i in sorted(random.Random(0).sample(range(len(reqs)), k))]
    editor.compute_patch(bundle, reqs[:1], hp.replace(v_steps=1))  # warm-up: statistics, first-call costs
    runtimes = {"editscope": EditRuntime(), "one at a time": EditRuntime(RuntimeSettings(vstar_batch=1)),
                "reference": EditRuntime(RuntimeSettings(forward="plain", vstar_batch=1))}
    deltas, edit_s, z_s = {}, {}, {}
    deltas["editscope"], edit_s["editscope"], z_s["editscope"] = _timed_patch(editor, bundle, reqs, hp,
                                                                              runtimes["editscope"])
    if k < len(reqs):  # the agreement is checked on a batch of the sampled requests
        deltas["editscope"] = _timed_patch(editor, bundle, sample, hp, runtimes["editscope"])[0]
    for name in ("one at a time", "reference"):
        deltas[name], edit_s[name], z_s[name] = _timed_patch(editor, bundle, sample, hp, runtimes[name])
    n = {"editscope": len(reqs), "one at a time": k, "reference": k}
    diffs = {name: _rel_diff(deltas[name], deltas["reference"]) for name in ("editscope", "one at a time")}
    per = {name: z_s[name] / n[name] for name in z_s}
    print(f"(b) {args.method}, batch of {len(reqs)} requests; one-at-a-time structures timed on {k} of them "
          f"(seed 0). z seconds per request: editscope {per['editscope']:.2f} (batch of {len(reqs)}), the same forward "
          f"one request at a time {per['one at a time']:.2f}, reference cost structure {per['reference']:.2f}. "
          f"Whole edit: editscope {edit_s['editscope']:.1f} s for {len(reqs)}, one at a time "
          f"{edit_s['one at a time']:.1f} s and reference {edit_s['reference']:.1f} s for {k}")
    print(f"(b) relative ΔW difference to the reference (batch of the {k} sampled requests): editscope "
          f"{diffs['editscope']:.1e}, one at a time {diffs['one at a time']:.1e}")
    print(f"(b) ratio {per['reference'] / per['editscope']:.2f} (z per request, reference / editscope); batching "
          f"alone {per['one at a time'] / per['editscope']:.2f}")
    reference, ours = flop_counts(bundle, editor, hp, reqs)
    print(f"(b) matmul FLOPs per step, batch of {len(reqs)}: reference {reference / 1e9:.1f} G, editscope "
          f"{ours / 1e9:.1f} G: FLOP ratio {reference / ours:.2f}, what the work itself allows an exact computation to "
          "save (where per-call overheads dominate, as on a tiny model, the measured ratio can exceed it)")
    if not max(diffs.values()) <= 1e-4:
        raise SystemExit(f"(b) the ΔW disagree: {max(diffs.values()):.2e} > 1e-4")


def _fresh_state(editor, bundle, reqs, hp, runtime):
    """A chain state after a warm-up edit of one request (statistics, projectors and first-call costs paid), without
    its edits."""
    state = editor.new_state()
    warm = hp.replace(v_steps=1) if "v_steps" in hp.to_dict() else hp
    editor.compute_patch(bundle, reqs[:1], warm, state, runtime=runtime)
    return state.without_edits()


def part_u(bundle, args) -> None:
    """Seconds per edit of UltraEdit and of AlphaEdit on the same batch (CounterFact records 0..u_batch-1)."""
    cases = load_counterfact(data_file("counterfact/counterfact-edit.json"))
    reqs = [c.requests[0] for c in cases[: args.u_batch]]
    per: dict[str, float] = {}
    for name in ("alphaedit", "ultraedit"):
        editor = get_editor(name)
        hp, runtime = editor.load_hparams(bundle), EditRuntime()
        state = _fresh_state(editor, bundle, reqs, hp, runtime)
        t0 = time.perf_counter()
        editor.compute_patch(bundle, reqs, hp, state, runtime=runtime)
        per[name] = (time.perf_counter() - t0) / len(reqs)
        print(f"(u) {name}: one batch of {len(reqs)} edits in {per[name] * len(reqs):.2f} s = "
              f"{per[name]:.4f} s per edit", flush=True)
    print(f"(u) ratio {per['alphaedit'] / per['ultraedit']:.1f} (seconds per edit, AlphaEdit / UltraEdit, same batch "
          f"of {len(reqs)})")


def part_g(bundle, args) -> None:
    """Seconds per edit of GRACE, WISE, retrieval and PROMPT against AlphaEdit on one batch; the probe overhead of a
    context and of WISE's router."""
    from editscope.data import load_cases
    from editscope.lm.engine import ScoringEngine
    from editscope.suites import get_suite

    cases = load_counterfact(data_file("counterfact/counterfact-edit.json"))[: args.u_batch]
    reqs = [c.requests[0] for c in cases]
    engine = ScoringEngine(bundle)
    per: dict[str, float] = {}
    for name in ("alphaedit", "grace", "wise", "retrieval", "prompt"):
        editor = get_editor(name)
        hp, runtime = editor.load_hparams(bundle), EditRuntime()
        state = _fresh_state(editor, bundle, reqs, hp, runtime) if editor.kind == "weights" else editor.new_state()
        torch.manual_seed(0)
        t0 = time.perf_counter()
        editor.compute_patch(bundle, reqs, hp, state, engine=engine, runtime=runtime)
        per[name] = (time.perf_counter() - t0) / len(reqs)
        print(f"(g) {name}: one batch of {len(reqs)} edits in {per[name] * len(reqs):.2f} s = {per[name]:.4f} s per "
              "edit", flush=True)
    for name in ("grace", "wise", "retrieval", "prompt"):
        print(f"(g) ratio {per['alphaedit'] / per[name]:.1f} (seconds per edit, AlphaEdit / {name}, same batch of "
              f"{len(reqs)})")
    _grace_partial_forward(bundle, engine, reqs[:args.s_cases])
    probe_cases = load_cases("counterfact", limit=args.s_cases)
    suite = get_suite("counterfact")
    timings = {}
    for name in ("none", "retrieval", "ike", "wise"):
        edit = None
        if name != "none":
            editor = get_editor(name)
            edit = editor.apply(bundle, reqs, editor.load_hparams(bundle), editor.new_state(), engine=engine)
        t0 = time.perf_counter()
        suite.probe_many(engine, probe_cases)
        timings[name] = time.perf_counter() - t0
        if edit is not None:
            edit.revert(bundle)
        print(f"(s) counterfact probe of {len(probe_cases)} cases, {name}: {timings[name]:.2f} s", flush=True)
    for name in ("retrieval", "ike", "wise"):
        what = "router" if name == "wise" else "context"
        print(f"(s) ratio {timings[name] / timings['none']:.2f} (probe seconds with the {name} {what} / without)")
    # IKE's demonstrations open every prompt: forwarded once per probe (share_prefix) or once per prompt
    editor = get_editor("ike")
    edit = editor.apply(bundle, reqs[:1], editor.load_hparams(bundle), editor.new_state(), engine=engine)
    shared = {}
    for share in (False, True):
        t0 = time.perf_counter()
        for case in probe_cases:  # one case at a time, as a single-edit run probes
            suite.probe_many(ScoringEngine(bundle, share_prefix=share), [case])
        shared[share] = time.perf_counter() - t0
    edit.revert(bundle)
    print(f"(s) ratio {shared[False] / shared[True]:.2f} (IKE probe seconds, each prompt forwarding the "
          "demonstrations / the demonstrations forwarded once per case)")


def _grace_full_forward_value(engine, module, request, start, hp):
    """GRACE's value training as it ran before the partial forward (the faithful baseline): a full forward of the
    model and the log-softmax at every position, each step."""
    batch = engine.prepare([(request.text, request.target_new)])
    query = batch.context_lengths[0] - 1
    value = start.detach().clone().float().requires_grad_(True)
    optimiser = torch.optim.Adam([value], lr=hp.lr)
    span = slice(query, None) if hp.where == "answer" else slice(0, query)

    def replace(_module, _args, output):
        out = output.clone()
        out[:, span] = value.to(out)
        return out

    handle = module.register_forward_hook(replace)
    try:
        for _ in range(hp.n_iter):
            optimiser.zero_grad()
            loss = -engine.batch_logprobs(batch).sum() / float(batch.target_mask.sum())
            value.grad = torch.autograd.grad(loss, [value])[0]
            optimiser.step()
    finally:
        handle.remove()
    return float(loss.detach())


def _grace_partial_forward(bundle, engine, reqs) -> None:
    """(g) GRACE's value training (a fixed 30 steps, no early stop) as it runs now — the requests' values trained
    together, each step from the codebook's layer on and from the query token on — against full forwards one request
    at a time, same requests, same process: seconds and the largest difference of the final losses."""
    from editscope.edit.grace import module_path, train_values

    hp = get_editor("grace").load_hparams(bundle).replace(n_iter=30, stop_loss=0.0)
    module, layer = bundle.model.get_submodule(module_path(bundle, hp)), hp.layers[0]
    with torch.no_grad():
        keys = [engine.hidden_states([r.text], [layer], kind="mlp_key")[0, 0] for r in reqs]
        starts = torch.stack([module.forward(k[None].to(module.weight.dtype))[0] for k in keys])
    t0 = time.perf_counter()
    _, partial, _ = train_values(engine, module, layer, reqs, starts, hp)
    seconds = {"partial": time.perf_counter() - t0}
    t0 = time.perf_counter()
    full = [_grace_full_forward_value(engine, module, r, s, hp) for r, s in zip(reqs, starts, strict=True)]
    seconds["full"] = time.perf_counter() - t0
    gap = max(abs(a - b) for a, b in zip(partial, full, strict=True))
    print(f"(g) GRACE value training, {len(reqs)} requests x {hp.n_iter} steps: full forwards one request at a time "
          f"{seconds['full']:.2f} s, together from layer {layer} and the query token {seconds['partial']:.2f} s; ratio "
          f"{seconds['full'] / seconds['partial']:.2f} (final losses within {gap:.1e})")


def _stream_mode(args):
    from editscope.paths import configs_dir
    from editscope.run.config import load_config
    from editscope.run.plan import Lifelong

    mode = load_config(configs_dir() / "experiments" / "lifelong-stream.yaml").mode
    assert isinstance(mode, Lifelong)
    return Lifelong(batch=args.k_batch or mode.batch, rounds=mode.rounds, checkpoints=args.k_every or mode.checkpoints,
                    reprobe=args.k_reprobe or mode.reprobe, sampled=mode.sampled)


def part_k(bundle, args) -> None:
    """A checkpoint's probe on a bundle holding a synthetic accumulated ΔW of each number of edits."""
    from editscope.data import load_cases
    from editscope.lm.engine import ScoringEngine
    from editscope.suites import get_suite

    mode = _stream_mode(args)
    edits = [int(e) for e in args.k_edits.split(",")]
    stream = load_cases("counterfact-stream", limit=max(edits))
    group = min(mode.group_size, len(stream))
    suites = [get_suite("counterfact"), get_suite("general", fact_dataset="counterfact-stream-heldout",
                                                  fact_pool=2000, facts=200), get_suite("weights")]
    engine = ScoringEngine(bundle)
    for suite in suites[1:2]:
        suite.probe_many(engine, stream[:1])  # the known facts are chosen on the unedited model
    editor = get_editor("ultraedit")
    hp = editor.load_hparams(bundle)
    one = editor.compute_patch(bundle, [c.requests[0] for c in stream[: mode.batch]], hp, editor.new_state())
    fixed = [stream[i] for i in mode.probed(edits[0], group, 0)]
    timings: dict[tuple[str, int], dict[str, float]] = {}
    for n in edits:
        cases = [stream[i] for i in mode.probed(n, group, 0)]
        deltas = {k: v * (n / mode.batch) for k, v in one.deltas.items()}
        patch = type(one)(deltas, "synthetic", {}, bundle.fingerprint, one.checksums)
        with bundle.folding():
            patch.apply(bundle)
            bundle.fold(patch)
            for label, probed in (("config", cases), ("fixed", fixed)):
                seconds = {}
                for suite in suites:
                    t0 = time.perf_counter()
                    suite.probe_many(engine, probed)
                    seconds[suite.name] = time.perf_counter() - t0
                timings[label, n] = seconds
                print(f"(k) {n} edits applied, {label} case set: {len(probed)} cases probed in "
                      f"{sum(seconds.values()):.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
                      + ")", flush=True)
    lo, hi = edits[0], edits[-1]
    for label in ("config", "fixed"):
        print(f"(k) ratio {label} {sum(timings[label, hi].values()) / sum(timings[label, lo].values()):.2f} "
              f"(checkpoint evaluation seconds at {hi} / at {lo} edits applied)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", default="alphaedit")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--z-batch", type=int, default=100, help="requests in the one batch of part (b)")
    parser.add_argument("--ref-sample", type=int, default=0,
                        help="part (b): time the one-request-at-a-time structures on this many of the batch's "
                        "requests (sampled with seed 0; default: all). Their cost per request does not depend on the "
                        "batch, and the reference on 100 requests is over an hour of one core")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", default="ab", help="which parts to run: a (with c), b, u, g (with s), k")
    parser.add_argument("--s-cases", type=int, default=20, help="part (s): cases the counterfact suite probes")
    parser.add_argument("--u-batch", type=int, default=100, help="part (u): requests in the one batch")
    parser.add_argument("--k-edits", default="1000,10000", help="part (k): numbers of edits applied, comma-separated")
    parser.add_argument("--k-batch", type=int, default=0, help="part (k): batch (default: lifelong-stream's)")
    parser.add_argument("--k-every", type=int, default=0, help="part (k): rounds per checkpoint")
    parser.add_argument("--k-reprobe", type=int, default=0, help="part (k): re-probe sample (default: the config's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load(args.model)
    print(f"model {args.model}, {args.threads} thread(s)", flush=True)
    if "b" in args.parts:
        part_b(bundle, args)
    if "g" in args.parts:
        part_g(bundle, args)
    if "u" in args.parts:
        part_u(bundle, args)
    if "k" in args.parts:
        part_k(bundle, args)
    if "a" in args.parts:
        timer = PhaseTimer()
        timer.install()
        part_a(bundle, args, timer)


if __name__ == "__main__":
    main()
