"""Cost of the wild probe (generation) against the teacher-forced probe and a plain per-prompt generate.

For the first N CounterFact cases, every prompt the wild suite asks (edit prompt, paraphrases, neighbourhood
prompts) is answered three ways, in one process, on one model and thread count:

(a) editscope's wild probe: ``WildSuite.probe_many`` -- every prompt of every case in one batched
    ``engine.answer`` call (left padding, KV cache, each row leaving the batch and its cache as soon as it stops at
    '.', newline or EOS: :mod:`editscope.lm.decode`);
(a0) the same batches through ``model.generate`` with transformers' stop-string criterion, which keeps every row
    until the batch's longest answer ends (what ``engine.answer`` did before);
(b) the naive baseline: ``model.generate`` once per prompt (greedy, ``max_new_tokens``) and the answer cut at the
    first stop string afterwards, as an evaluation loop written per example does;
(c) the teacher-forced probe the same cases get from the counterfact suite (one batched ``engine.score``).

(a), (a0) and (b) must give the same answers (checked; the run fails otherwise). Printed: seconds per case of each,
``wild vs naive speedup X.XX`` = time(b) / time(a), ``wild vs batched generate speedup X.XX`` = time(a0) / time(a)
and ``wild / teacher-forced cost X.XX`` = time(a) / time(c).
"""

from __future__ import annotations

import argparse
import time

import torch

from editscope.data import load_cases
from editscope.lm import load
from editscope.lm.engine import ScoringEngine, cut_at_stop
from editscope.suites import get_suite


def naive_answers(bundle, engine: ScoringEngine, prompts: list[str], max_new_tokens: int,
                  stop: tuple[str, ...]) -> list[str]:
    """One ``model.generate`` per prompt, the whole ``max_new_tokens`` unless EOS, cut afterwards."""
    out = []
    device = next(bundle.model.parameters()).device
    for prompt in prompts:
        ids = torch.tensor([engine.context_ids(prompt)], device=device)
        gen = bundle.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, pad_token_id=engine.pad_id)
        new = gen[0, ids.shape[1]:].tolist()
        end = next((k for k, t in enumerate(new) if t == bundle.tokenizer.eos_token_id), len(new))
        out.append(cut_at_stop(bundle.tokenizer.decode(new[:end], skip_special_tokens=True), stop))
    return out


def batched_generate_answers(bundle, engine: ScoringEngine, prompts: list[str], max_new_tokens: int,
                             stop: tuple[str, ...]) -> list[str]:
    """The batches ``engine.answer`` makes, each through one ``model.generate`` with stop strings: a row that
    stopped stays in the batch (as padding) until the batch's last row stops."""
    rows = [(engine.context_ids(p), None) for p in prompts]
    per_call = max(1, engine.token_budget // (max(len(r[0]) for r in rows) + max_new_tokens))
    eos = bundle.tokenizer.eos_token_id
    out = []
    for start in range(0, len(rows), per_call):
        ids, mask, _, _ = engine._inputs(rows[start:start + per_call], "left")
        gen = bundle.model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=engine.pad_id, stop_strings=list(stop), tokenizer=engine.tokenizer)
        for new in gen[:, ids.shape[1]:].tolist():
            end = next((k for k, t in enumerate(new) if t == eos), len(new))
            out.append(cut_at_stop(bundle.tokenizer.decode(new[:end], skip_special_tokens=True), stop))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load(args.model)
    engine = ScoringEngine(bundle)
    cases = load_cases("counterfact", limit=args.cases)
    wild = get_suite("wild", max_new_tokens=args.max_new_tokens)
    teacher = get_suite("counterfact")
    prompts = [wild.shown(p) for c in cases for p, _, _ in wild.questions(c)]
    print(f"{args.model}, {args.threads} thread(s): {len(cases)} CounterFact cases, {len(prompts)} prompts, "
          f"max_new_tokens {args.max_new_tokens}")

    wild.probe_many(engine, cases[:1])  # warm-up (first-call allocations)
    t0 = time.perf_counter()
    probes = wild.probe_many(engine, cases)
    t_wild = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = batched_generate_answers(bundle, engine, prompts, args.max_new_tokens, wild.stop)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    naive = naive_answers(bundle, engine, prompts, args.max_new_tokens, wild.stop)
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    teacher.probe_many(engine, cases)
    t_teacher = time.perf_counter() - t0

    answers = [p["answer"] for probe in probes for p in probe["prompts"]]
    for name, other in (("naive", naive), ("batched generate", batched)):
        differ = [k for k, (a, b) in enumerate(zip(answers, other, strict=True)) if a != b]
        if differ:
            k = differ[0]
            raise SystemExit(f"answers differ from {name} at {len(differ)} prompt(s), first {prompts[k]!r}: "
                             f"{answers[k]!r} vs {other[k]!r}")
    n = len(cases)
    print(f"(a) wild probe (batched, per-row stops): {t_wild / n:.3f} s/case")
    print(f"(a0) batched generate, stop strings:     {t_batched / n:.3f} s/case")
    print(f"(b) naive per-prompt generate:            {t_naive / n:.3f} s/case")
    print(f"(c) teacher-forced counterfact probe:     {t_teacher / n:.3f} s/case")
    print(f"answers equal on all {len(answers)} prompts; mean answer length "
          f"{sum(len(a.split()) for a in answers) / len(answers):.1f} words")
    print(f"wild / teacher-forced cost {t_wild / t_teacher:.2f}")
    print(f"wild vs naive speedup {t_naive / t_wild:.2f}")
    print(f"wild vs batched generate speedup {t_batched / t_wild:.2f}")


if __name__ == "__main__":
    main()
