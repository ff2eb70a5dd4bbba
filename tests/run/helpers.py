"""A small real suite for runner tests (the registered suites are developed separately): CounterFact-style
efficacy/paraphrase success from the scoring engine, following the suite contract and raw-score conventions of
``editscope.suites.base``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from editscope.data.records import Case
from editscope.lm.engine import ScoringEngine
from editscope.metrics.registry import MetricSpec
from editscope.metrics.rewrite import efficacy_success, paraphrase_success
from editscope.suites.base import Suite


class RewriteSuite(Suite):
    """ES/PS (paper 002 eq. 24-25) after the edit and the change of log P(target_new) on the rewrite prompt."""

    name = "rewrite_es"
    metrics_declared = (
        MetricSpec("ES", "002", "eq 24", True, pairing="post_only"),
        MetricSpec("PS", "002", "eq 25", True, pairing="post_only"),
        MetricSpec("dlogp_new", "test", "log P(new) post - pre", True, None, "log-prob", pairing="post_only"),
    )

    def __init__(self, paraphrases: int = 1) -> None:
        self.paraphrases = paraphrases

    def probe_many(self, engine: ScoringEngine, cases: Sequence[Case]) -> list[dict[str, Any]]:
        return [self._probe(engine, case) for case in cases]

    def _probe(self, engine: ScoringEngine, case: Case) -> dict[str, Any]:
        req = case.request
        prompts = [("rewrite", req.text)] + [("paraphrase", p) for p in case.paraphrase_prompts[: self.paraphrases]]
        targets = [req.target_new, req.target_true]
        scores = engine.score([(p, t) for _, p in prompts for t in targets])
        out = []
        for i, (role, prompt) in enumerate(prompts):
            cands = [{"text": t, "logprob_sum": s.sum, "n_tokens": s.n_tokens}
                     for t, s in zip(targets, scores[2 * i: 2 * i + 2], strict=True)]
            out.append({"prompt": prompt, "role": role, "candidates": cands})
        return {"prompts": out}

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        def nll(probe: dict[str, Any], role: str, k: int) -> np.ndarray:
            return np.array([-p["candidates"][k]["logprob_sum"] / p["candidates"][k]["n_tokens"]
                             for p in probe["prompts"] if p["role"] == role])

        row = {"ES": efficacy_success(nll(post, "rewrite", 0), nll(post, "rewrite", 1)),
               "dlogp_new": float(nll(pre, "rewrite", 0)[0] - nll(post, "rewrite", 0)[0])}
        if any(p["role"] == "paraphrase" for p in post["prompts"]):
            row["PS"] = paraphrase_success(nll(post, "paraphrase", 0), nll(post, "paraphrase", 1))
        return row


SUITES = {"rewrite_es": RewriteSuite}


def close(a: Any, b: Any) -> bool:
    """Equal JSON trees, floats to 1e-6 (the same computation, possibly batched differently)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return bool(np.isclose(a, b, rtol=1e-6, atol=1e-6, equal_nan=True))
    return a == b


def base_config(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "tiny-llama",
        "seed": 0,
        "output": "unused",
        "methods": [{"name": "rome", "overrides": {"v_steps": 2}}, {"name": "memit", "overrides": {"v_steps": 2}}],
        "dataset": "counterfact",
        "slice": {"offset": 0, "limit": 3},
        "suites": ["rewrite_es"],
    }
    data.update(changes)
    return data
