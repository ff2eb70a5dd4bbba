"""Collateral damage: how many facts the unedited model knew stop being answered after an edit.

The probe set is a fixed list of facts the *unedited* model answers top-1 (every answer token is the argmax after
the prompt), chosen once per model by a :class:`editscope.suites.known_facts.FactPool` -- the pool the general
suite's ``KnownFacts`` uses -- of CounterFact, zsRE and PEAK records (``sources``, in order; each record's filled
prompt and ``target_true``; a prompt that occurs more than once in the sources is left out, since its answer is
ambiguous), the first ``facts`` known ones (default 500). It is a property of the model, measured with one
batched ``engine.score`` over the set per model state (on the unedited model: the choosing pass's scores); a case's
own facts (probe prompts equal to one of the case's request prompts) are excluded from that case's counts, so an
edit is never charged for the fact it was asked to change.

Probe: ``{"n": facts in the set, "wrong": [indices not answered top-1], "excluded": [indices of the case's own
facts]}``.

Metrics (post-only, lower is better):

* ``Flipped``: facts answered top-1 before the edit and not after (the case's own facts excluded);
* ``FlippedShare``: ``Flipped`` over the facts counted (the set minus the case's own facts and any fact the
  model did not answer before the edit).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics.registry import MetricSpec
from editscope.suites.base import Suite
from editscope.suites.known_facts import FactPool, KnownSet

SOURCES = ("counterfact-train", "zsre", "peak-cf", "counterfact")
#: the same pool from the datasets packaged with editscope (no PEAK record is packaged), for a pip install
SAMPLE_SOURCES = ("counterfact-train-sample", "zsre-sample", "counterfact-sample")
_P = "editscope (collateral scan)"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("Flipped", _P, "facts top-1 before the edit and not after", False, (0.0, float("inf")), "count",
               pairing="post_only", description="known facts (never the edited case) the edit made the model stop "
               "answering top-1"),
    MetricSpec("FlippedShare", _P, "Flipped / facts counted", False, pairing="post_only", paper_scale=100,
               description="share of the known-fact probe set that flipped", headline=False),
)


class CollateralSuite(Suite):
    """Collateral damage on a fixed probe set of known facts (see the module docstring)."""

    name = "collateral"
    card_section = "collateral-damage"
    chooses_edits = False  # the model as a whole: any block's edits

    def __init__(self, *, facts: int = 500, sources: Sequence[str] = SOURCES) -> None:
        if isinstance(facts, bool) or not isinstance(facts, int) or facts < 1:
            raise EditscopeError(f"collateral suite: option facts must be an integer >= 1, not {facts!r}")
        if isinstance(sources, str) or not sources:
            raise EditscopeError(f"collateral suite: option sources must be a non-empty list of datasets, "
                                 f"not {sources!r}")
        self.facts, self.sources = facts, tuple(sources)
        self.pool = FactPool(self.sources)
        self._known: KnownSet | None = None
        # weights fingerprint -> (log-probs, top-1 flags) of the last few models scanned
        self._measured: dict[str, tuple[list[float], list[bool]]] = {}

    metrics_declared = METRICS

    @property
    def protocol(self) -> dict[str, str]:
        return {"name": "collateral", "note": f"up to {self.facts} facts of {', '.join(self.sources)} (filled prompt, "
                "target_true): the first the unedited model answers top-1, in the sources' order (fewer when the "
                "sources hold fewer); a case's own facts excluded"}

    def known(self, engine: Scorer, *, progress: bool = False) -> KnownSet:
        """The probe set (chosen on the unedited model on first use; cached on disk)."""
        if self._known is None:
            def show(scanned: int, total: int, found: int) -> None:
                print(f"collateral probe set: {found}/{self.facts} known facts in {scanned}/{total} scanned",
                      file=sys.stderr, flush=True)

            self._known = self.pool.known(engine, self.facts, who="collateral suite",
                                          progress=show if progress else None)
            if not self._known.facts:
                raise EditscopeError(f"collateral suite: the model answers none of the {self._known.scanned} facts "
                                     f"of {', '.join(self.sources)} top-1: nothing to scan")
        return self._known

    def scan(self, engine: Scorer) -> tuple[list[float], list[bool]]:
        """The probe set's answer log-probs (sum over tokens) and top-1 flags on the model as it is now: one batched
        ``engine.score`` call, reused for the same weights. On the weights the set was chosen on (the unedited
        model) they are the choosing pass's scores, all top-1 by construction: no second pass."""
        known = self.known(engine)
        fingerprint = engine.fingerprint
        if fingerprint == known.fingerprint:
            return list(known.logprobs), [True] * len(known.facts)
        measured = self._measured.get(fingerprint)
        if measured is None:
            scores = engine.score([(f.prompt, f.answer) for f in known.facts])
            measured = ([s.sum for s in scores], [all(s.token_is_argmax) for s in scores])
            self._measured = {k: v for k, v in list(self._measured.items())[-3:]} | {fingerprint: measured}
        return measured

    def excluded(self, engine: Scorer, case: Case) -> list[int]:
        """Indices of the probe facts that are the case's own (its request prompts)."""
        own = {r.text for r in case.requests}
        return [i for i, f in enumerate(self.known(engine).facts) if f.prompt in own]

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        _, top1 = self.scan(engine)
        wrong = [i for i, ok in enumerate(top1) if not ok]
        return [{"n": len(top1), "wrong": wrong, "excluded": self.excluded(engine, c)} for c in cases]

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        if pre["n"] != post["n"]:
            raise EditscopeError(f"collateral suite: case {case.case_id}: pre and post probes scan different sets "
                                 f"({pre['n']} vs {post['n']} facts)")
        skip = set(pre["wrong"]) | set(post["excluded"])
        flipped = len(set(post["wrong"]) - skip)
        counted = post["n"] - len(skip)
        row = {"Flipped": float(flipped)}
        if counted:
            row["FlippedShare"] = flipped / counted
        return row


__all__ = ["SOURCES", "CollateralSuite"]
