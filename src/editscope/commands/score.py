"""``editscope score``: log-probs of candidate continuations after a prompt."""

from __future__ import annotations

import argparse

from editscope.commands._device import add_device_arguments

HELP = "score candidate continuations of a prompt"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "score",
        help=HELP,
        description="Print each candidate's token count, total and mean log-prob (natural log) after the "
        "prompt, and its rank by total log-prob. Candidates without a leading space are scored with one "
        "after a prompt that ends without a space ('Paris' -> ' Paris').",
    )
    parser.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    parser.add_argument("--prompt", required=True, help="the context")
    parser.add_argument("--candidates", nargs="+", required=True, help="continuations to score")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of {candidate, n_tokens, logprob_sum, logprob_mean, rank}")
    parser.add_argument("--chat-template", action="store_true",
                        help="show the prompt as a user turn of the tokenizer's chat template (instruct models); the "
                        "candidates start the assistant's answer")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from editscope.finite import require_finite, strict_dumps
    from editscope.lm import load
    from editscope.lm.engine import ScoringEngine

    bundle = load(args.model, device=args.device, dtype=args.dtype)
    scores = ScoringEngine(bundle, chat_template=args.chat_template).score([(args.prompt, c) for c in args.candidates])
    rows = [
        {"candidate": c, "n_tokens": s.n_tokens, "logprob_sum": s.sum, "logprob_mean": s.mean}
        for c, s in zip(args.candidates, scores, strict=True)
    ]
    require_finite(rows, "score")  # a model with non-finite weights: refused, not printed as nan
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["logprob_sum"])
    rank = {i: r + 1 for r, i in enumerate(order)}
    for i, row in enumerate(rows):
        row["rank"] = rank[i]  # 1 = the highest total log-prob
    if args.json:
        print(strict_dumps(rows, "score --json", indent=1))
        return 0
    width = max(9, *(len(r["candidate"]) for r in rows))
    print(f"{'candidate':<{width}}  tokens  logprob_sum  logprob_mean  rank")
    for i, r in enumerate(rows):
        print(f"{r['candidate']:<{width}}  {r['n_tokens']:>6}  {r['logprob_sum']:>11.4f}  "
              f"{r['logprob_mean']:>12.4f}  {rank[i]:>4}")
    return 0
