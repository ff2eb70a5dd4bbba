"""The search itself, as pure functions: the objective a candidate is scored by, the choice among scored
candidates (by the lower end of the objective's confidence interval, behind a locality guard) and successive
halving (Jamieson & Talwalkar 2016: every candidate sees the first rung's few cases, the best 1/η go on to η
times as many, and so on), which evaluates candidates through a callback so it can be tested on a table."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from editscope.metrics.intervals import bootstrap_aggregate, mean_ci
from editscope.metrics.registry import MetricSpec


@dataclass(frozen=True)
class Objective:
    """What a candidate is scored by on one suite's rows: ``score`` (an aggregate metric with a bootstrap CI over
    cases, e.g. CounterFact's Score = harmonic mean of ES, PS, NS) and a locality ``guard`` metric (NS): a
    candidate whose mean guard metric lies below the unedited model's mean by more than the half-width of that
    mean's 95% CI is refused. Candidates are ranked by the lower CI bound of ``score``, not its mean."""

    suite: str
    score: str
    components: tuple[str, ...]
    guard: str

    def describe(self) -> str:
        return (f"maximise the lower 95% bootstrap CI bound of {self.suite} {self.score} "
                f"(harmonic mean of {', '.join(self.components)}); refuse a candidate whose mean {self.guard} is "
                f"below the unedited model's mean {self.guard} by more than that mean's 95% CI half-width")


#: Objectives per suite: the paper's Score with its locality metric as the guard.
OBJECTIVES: dict[str, Objective] = {
    "counterfact": Objective("counterfact", "Score", ("ES", "PS", "NS"), "NS"),
    "zsre": Objective("zsre", "Score", ("Efficacy", "Paraphrase", "Specificity"), "Specificity"),
}


@dataclass(frozen=True)
class CandidateScore:
    """One candidate's objective on ``n`` cases: the score's mean and CI, the guard metric's mean and CI, and the
    unedited model's guard mean and CI on the same cases (its ``_pre`` values)."""

    n: int
    score: float
    score_lo: float
    score_hi: float
    guard: float
    guard_lo: float
    guard_hi: float
    guard_pre: float
    guard_pre_lo: float
    guard_pre_hi: float

    @property
    def guard_floor(self) -> float:
        """The lowest guard mean accepted: the unedited mean minus its CI half-width (no width: the mean)."""
        half = (self.guard_pre_hi - self.guard_pre_lo) / 2
        return self.guard_pre - (half if math.isfinite(half) else 0.0)

    @property
    def local(self) -> bool:
        """Whether the candidate passes the locality guard."""
        return self.guard >= self.guard_floor - 1e-12

    def to_dict(self) -> dict[str, Any]:
        return {**{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()},
                "guard_floor": self.guard_floor, "local": self.local}


def score_rows(metrics: Sequence[dict[str, float | None]], objective: Objective, spec: MetricSpec) -> CandidateScore:
    """The objective of one candidate from its rows' metrics of ``objective.suite`` (``NAME_post``/``NAME_pre``
    columns); ``spec`` is the suite's declaration of the aggregate score (its bootstrap CI)."""
    def column(name: str) -> np.ndarray:
        return np.array([np.nan if m.get(name) is None else float(m[name]) for m in metrics], dtype=np.float64)

    columns = np.stack([column(f"{c}_post") for c in objective.components], axis=1)
    score, lo, hi = bootstrap_aggregate(columns, spec)
    guard, g_lo, g_hi, _ = mean_ci(column(f"{objective.guard}_post").tolist())
    pre, p_lo, p_hi, _ = mean_ci(column(f"{objective.guard}_pre").tolist())
    return CandidateScore(len(metrics), score, lo, hi, guard, g_lo, g_hi, pre, p_lo, p_hi)


def rank_key(s: CandidateScore) -> tuple[bool, float, float]:
    """Sort key, best last: local before non-local, then the score's lower CI bound, then its mean (a NaN bound,
    fewer than 2 cases, ranks as -inf)."""
    lo = s.score_lo if math.isfinite(s.score_lo) else -math.inf
    mean = s.score if math.isfinite(s.score) else -math.inf
    return (s.local, lo, mean)


def select(scores: dict[str, CandidateScore]) -> str | None:
    """The chosen candidate: the local one with the highest lower CI bound of the score (ties: the higher mean,
    then the first given); None when every candidate breaks locality."""
    local = [cid for cid, s in scores.items() if s.local]
    if not local:
        return None
    return max(local, key=lambda cid: rank_key(scores[cid])[1:])


def survivors(scores: dict[str, CandidateScore], keep: int) -> list[str]:
    """The ``keep`` best candidates by :func:`rank_key` (ties: the order given), in the order given."""
    order = sorted(scores, key=lambda cid: rank_key(scores[cid]), reverse=True)  # stable: earlier first on ties
    kept = set(order[:keep])
    return [cid for cid in scores if cid in kept]


def rung_sizes(first: int, eta: int, n_candidates: int, max_cases: int) -> list[int]:
    """Cases per rung: ``first``, ×η, ... until one candidate is left or ``max_cases`` is reached (the last rung
    is ``max_cases`` when the next one would pass it)."""
    sizes, n, left = [], min(first, max_cases), n_candidates
    while True:
        sizes.append(n)
        left = max(1, math.ceil(left / eta))
        if left == 1 and len(sizes) > 1 or n >= max_cases:
            return sizes
        n = min(n * eta, max_cases)


@dataclass
class HalvingResult:
    """Per rung: its size (cases) and the scores of the candidates it evaluated; ``complete`` says whether every
    rung ran (False: the callback stopped the search, e.g. the time budget ran out)."""

    rungs: list[tuple[int, dict[str, CandidateScore]]] = field(default_factory=list)
    complete: bool = True

    @property
    def last_full(self) -> tuple[int, dict[str, CandidateScore]] | None:
        """The last rung every one of its candidates finished: the one a choice is made on."""
        return self.rungs[-1] if self.rungs else None


class StopSearch(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """Raised by an evaluation callback to end the search early (budget spent); the rung in progress is dropped."""


def successive_halving(candidates: Sequence[str], sizes: Sequence[int], eta: int,
                       evaluate: Callable[[str, int], CandidateScore],
                       on_rung: Callable[[int, dict[str, CandidateScore]], None] | None = None) -> HalvingResult:
    """Evaluate every candidate on ``sizes[0]`` cases, keep the best ceil(k/η) (:func:`survivors`), evaluate them
    on ``sizes[1]`` cases, and so on. ``evaluate(candidate, n_cases)`` scores a candidate on the first ``n_cases``
    validation cases (rows of a smaller rung are reused by the caller, not recomputed); it may raise
    :class:`StopSearch`, which ends the search with the rungs finished so far."""
    result = HalvingResult()
    alive = list(candidates)
    for r, n in enumerate(sizes):
        try:
            scores = {cid: evaluate(cid, n) for cid in alive}
        except StopSearch:
            result.complete = False
            return result
        result.rungs.append((n, scores))
        if on_rung is not None:
            on_rung(n, scores)
        if r + 1 < len(sizes):
            alive = survivors(scores, max(1, math.ceil(len(alive) / eta)))
    return result


__all__ = ["OBJECTIVES", "CandidateScore", "HalvingResult", "Objective", "StopSearch", "rank_key", "rung_sizes",
           "score_rows", "select", "successive_halving", "survivors"]
