"""The search itself, as pure functions: the objective a candidate is scored by, the choice among scored
candidates (by the lower end of the objective's confidence interval, behind a guard: locality, or efficacy for
PEAK) and successive halving (Jamieson & Talwalkar 2016: every candidate sees the first rung's few cases, the
best 1/η go on to η times as many, and so on), which evaluates candidates through a callback so it can be
tested on a table."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from editscope.metrics.intervals import bootstrap_aggregate, clip_interval, mean_ci, wilson_interval
from editscope.metrics.registry import MetricSpec, hmean_of

GuardReference = Literal["unedited", "editor_alone"]
GUARD_REFERENCES: dict[str, str] = {
    "unedited": "the unedited model (the rows' {guard}_pre values)",
    "editor_alone": "the same editor alone (base hparams, no plug-ins) on the same validation cases",
}


class Unmeasured(ValueError):
    """An objective's term that no row measures (the rows cannot score any candidate)."""


@dataclass(frozen=True)
class Component:
    """One term of an objective's harmonic mean: a metric of the suite, or its complement ``1 - metric`` (for a
    share where lower is better, e.g. PEAK's AFF/ANF), taken per case before the mean over cases."""

    metric: str
    complement: bool = False
    #: why a run may not measure the metric at all (said when no row has it); "": every run measures it
    unmeasured: str = ""

    @property
    def label(self) -> str:
        return f"1−{self.metric}" if self.complement else self.metric

    def transform(self, values: np.ndarray) -> np.ndarray:
        return 1.0 - values if self.complement else values


@dataclass(frozen=True)
class Objective:
    """What a candidate is scored by on one suite's rows, and what may refuse it.

    ``score``: the harmonic mean of the dataset-level means of ``components`` (each a metric or its complement),
    with a bootstrap 95% CI over cases (:func:`~editscope.metrics.intervals.bootstrap_aggregate`, as the summary's
    CounterFact Score); candidates are ranked by its lower CI bound, not its mean. ``guard``: a higher-is-better
    metric of the suite; a candidate whose mean guard metric lies below the low end of the reference mean's 95% CI
    (:func:`reference_ci`) is refused. ``guard_reference`` says what the reference is: the unedited model
    (``"unedited"``, the rows' ``_pre`` column) or the same editor without the plug-ins (``"editor_alone"``, a
    reference run on the same cases)."""

    suite: str
    score: str
    components: tuple[Component, ...]
    guard: str
    guard_reference: GuardReference = "unedited"
    why: str = ""
    extra_suites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.guard_reference not in GUARD_REFERENCES:
            raise ValueError(f"guard_reference must be one of {', '.join(GUARD_REFERENCES)}")

    @property
    def suites(self) -> tuple[str, ...]:
        """Every suite a candidate's run measures; their metrics are merged per case (names must not collide)."""
        return (self.suite, *self.extra_suites)

    @property
    def suite_label(self) -> str:
        return "+".join(self.suites)

    @property
    def reference_label(self) -> str:
        """How tables name the guard's reference: ``unedited`` or ``editor alone``."""
        return self.guard_reference.replace("_", " ")

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics reported per candidate (mean and CI): the components' metrics (uncomplemented), then the
        guard when it is not one of them."""
        names = [c.metric for c in self.components]
        return tuple(names + ([self.guard] if self.guard not in names else []))

    def aggregate_spec(self) -> MetricSpec:
        """The score as an aggregate declaration (for :func:`bootstrap_aggregate`)."""
        return MetricSpec(self.score, "", "harmonic mean", True, aggregate=hmean_of([c.label for c in self.components]))

    def describe(self) -> str:
        ref = GUARD_REFERENCES[self.guard_reference].format(guard=self.guard)
        return (f"maximise the lower 95% bootstrap CI bound of {self.suite_label} {self.score} (harmonic mean of the "
                f"post-edit dataset-level means of {', '.join(c.label for c in self.components)}); refuse a candidate "
                f"whose mean post-edit {self.guard} is below the mean {self.guard} of {ref} by more than that mean's "
                f"95% CI half-width (for a share with no spread over the cases, below the low end of its Wilson score "
                f"interval)" + (f" ({self.why})" if self.why else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.describe(), "suite": self.suite, "suites": list(self.suites), "score": self.score,
                "components": [c.label for c in self.components],
                "complemented": [c.metric for c in self.components if c.complement], "aggregate": "harmonic mean",
                "guard": self.guard, "guard_reference": self.guard_reference,
                "select_by": "lower 95% CI bound of the score"}


def _objective(suite: str, score: str, components: Sequence[str], guard: str,
               guard_reference: GuardReference = "unedited", why: str = "",
               extra_suites: tuple[str, ...] = ()) -> Objective:
    comps = tuple(Component(c[2:], True) if c.startswith("1-") else Component(c) for c in components)
    return Objective(suite, score, comps, guard, guard_reference, why, extra_suites)


#: Objectives per suite: CounterFact's and zsRE's paper Score with their locality metric as the guard against the
#: unedited model; PEAK (paper 003): efficacy with the additivity cut of the hard setting, ES guarded against the
#: editor without its plug-ins (APP exists to cut AFF/ANF; its cost, if any, is efficacy); EVK (paper 004, for
#: EVK-Align): CounterFact efficacy with the EVK-Bench Embedding and Text Stability of the same edits (eq 9), ES
#: guarded against the editor alone (a plug-in that weakens the edit raises stability for free).
def _suite_score(suite: str, guard: str) -> Objective:
    """The suite's own declared ``Score`` aggregate (its components as the suite declares them, so the objective
    and the summary's Score are one definition), guarded by ``guard`` against the unedited model."""
    from editscope.suites import get_suite

    spec = next(m for m in get_suite(suite).metrics_declared if m.name == "Score" and m.aggregate is not None)
    if spec.aggregate.kind != "hmean":
        raise ValueError(f"{suite}: its Score is a {spec.aggregate.kind}; tune objectives are harmonic means")
    return _objective(suite, spec.name, spec.aggregate.of, guard)


def sequential_objective(base: Objective) -> Objective:
    """``base`` for sequential editing: the same harmonic mean with the general suite's ``KnownFacts`` (the share of
    facts the unedited model answers that the edited model still answers) as one more term, read after the whole
    chain. A chain can write every fact while it breaks the model around them (UltraEdit's step size on SmolLM2:
    ES 96 % at 18x the perplexity after 1,000 edits), which efficacy and locality over the edited cases' own
    neighbours do not see; the known facts are the general ability a term of the Score can carry (a share, higher
    is better). Only for objectives guarded against the unedited model."""
    if base.guard_reference != "unedited":
        raise ValueError(f"{base.suite_label} {base.score}: its guard compares with the editor alone; sequential "
                         "tuning supports the objectives guarded against the unedited model (counterfact, zsre)")
    known = Component("KnownFacts", unmeasured="the model answers none of the general suite's known-fact pool; tune "
                      "single edits")
    return Objective(base.suite, f"{base.score}+KnownFacts", (*base.components, known), base.guard,
                     base.guard_reference, why="KnownFacts: general suite, measured once on the model after the last "
                     "batch and carried by every row", extra_suites=(*base.extra_suites, "general"))


OBJECTIVES: dict[str, Objective] = {
    "counterfact": _suite_score("counterfact", "NS"),
    "zsre": _suite_score("zsre", "Specificity"),
    # PEAK and EVK declare no Score of their own: these two objectives are tune's (the comment above says why)
    "peak": _objective("peak", "Score", ("ES", "1-AFF_hard", "1-ANF_hard"), "ES", "editor_alone",
                       why="AFF/ANF are shares where lower is better, so their complements enter the mean"),
    "evk": _objective("counterfact", "EVK score", ("ES", "EVK_ES", "EVK_TS"), "ES", "editor_alone",
                      why="EVK_ES/EVK_TS are the evk suite's pre/post cosines of the same cases",
                      extra_suites=("evk",)),
}


@dataclass(frozen=True)
class CandidateScore:
    """One candidate's objective on ``n`` cases: the score's mean and CI, the guard metric's mean and CI, the
    reference's guard mean and CI on the same cases (the unedited ``_pre`` values, or the editor-alone run's),
    and ``metrics``: each of :attr:`Objective.metrics` as (mean, low, high) over the cases."""

    n: int
    score: float
    score_lo: float
    score_hi: float
    guard: float
    guard_lo: float
    guard_hi: float
    guard_ref: float
    guard_ref_lo: float
    guard_ref_hi: float
    metrics: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def guard_floor(self) -> float:
        """The lowest guard mean accepted: the low end of the reference's 95% CI (for its t interval, the mean
        minus the half-width; no interval: the mean)."""
        return self.guard_ref_lo if math.isfinite(self.guard_ref_lo) else self.guard_ref

    @property
    def local(self) -> bool:
        """Whether the candidate passes the guard (locality for CounterFact/zsRE, efficacy for PEAK)."""
        return self.guard >= self.guard_floor - 1e-12

    def to_dict(self) -> dict[str, Any]:
        def fin(v: Any) -> Any:
            return None if isinstance(v, float) and not math.isfinite(v) else v

        data = {k: fin(v) for k, v in asdict(self).items() if k != "metrics"}
        data["metrics"] = {k: {"mean": fin(m), "lo": fin(lo), "hi": fin(hi)} for k, (m, lo, hi) in self.metrics.items()}
        return {**data, "guard_floor": fin(self.guard_floor), "local": self.local}


def _column(metrics: Sequence[dict[str, float | None]], name: str) -> np.ndarray:
    return np.array([np.nan if m.get(name) is None else float(m[name]) for m in metrics], dtype=np.float64)


def _spec(specs: Sequence[MetricSpec], metric: str) -> MetricSpec:
    for spec in specs:
        if spec.name == metric:
            return spec
    raise ValueError(f"objective: the suite declares no metric {metric!r}")


def post_column(specs: Sequence[MetricSpec], metric: str) -> str:
    """The row key of ``metric``'s edited-model value from the suite's declarations: ``NAME_post`` for a pre/post
    metric, plain ``NAME`` for a post-only one (PEAK's AFF/ANF)."""
    return _spec(specs, metric).post


def _reported(values: np.ndarray, spec: MetricSpec) -> tuple[float, float, float]:
    """A reported metric's mean and t interval, cut to the values it can take (a share's CI never passes 1)."""
    mean, lo, hi, _ = mean_ci(values.tolist())
    return (mean, *clip_interval(lo, hi, spec.range))


def reference_ci(values: np.ndarray, share: bool) -> tuple[float, float, float]:
    """The guard reference's mean and 95% CI over cases: Student t's, except for a share (``share``: the metric is
    declared on [0, 1]) with no spread, where t's interval has no width and would refuse any candidate that loses one
    case (a model that answers every neighbour of a small rung): there the Wilson score interval of that share."""
    mean, lo, hi, _ = mean_ci(values.tolist())
    n = int(np.isfinite(values).sum())
    if share and n >= 2 and lo == hi:
        lo, hi = wilson_interval(mean, n)
    return mean, lo, hi


def score_rows(metrics: Sequence[dict[str, float | None]], objective: Objective, specs: Sequence[MetricSpec],
               reference: Sequence[dict[str, float | None]] | None = None) -> CandidateScore:
    """The objective of one candidate from its rows' metrics of ``objective.suites`` (merged per case); ``specs``
    are those suites' declarations (which column holds a metric's post-edit value). ``reference``: the editor-alone
    run's rows on the same cases, required when ``objective.guard_reference`` is ``"editor_alone"``. A component that
    declares it may go unmeasured and is absent from every row is an :class:`Unmeasured` error."""
    values = [_column(metrics, post_column(specs, c.metric)) for c in objective.components]
    for c, column in zip(objective.components, values, strict=True):
        if c.unmeasured and len(column) and np.isnan(column).all():
            raise Unmeasured(f"{c.metric}, a term of the objective {objective.score}, is not measured: {c.unmeasured}")
    columns = np.stack([c.transform(v) for c, v in zip(objective.components, values, strict=True)], axis=1)
    score, lo, hi = bootstrap_aggregate(columns, objective.aggregate_spec())
    guard_col = post_column(specs, objective.guard)
    guard, g_lo, g_hi, _ = mean_ci(_column(metrics, guard_col).tolist())
    if objective.guard_reference == "editor_alone":
        if reference is None:
            raise ValueError("objective: its guard compares with the editor alone, and no reference rows were given")
        if len(reference) != len(metrics):
            raise ValueError(f"objective: {len(reference)} reference rows for {len(metrics)} candidate rows")
        ref = _column(reference, guard_col)
    else:
        ref = _column(metrics, f"{objective.guard}_pre")
    r, r_lo, r_hi = reference_ci(ref, _spec(specs, objective.guard).range == (0.0, 1.0))
    per = {m: _reported(_column(metrics, post_column(specs, m)), _spec(specs, m)) for m in objective.metrics}
    return CandidateScore(len(metrics), score, lo, hi, guard, g_lo, g_hi, r, r_lo, r_hi, per)


def rank_key(s: CandidateScore) -> tuple[bool, float, float]:
    """Sort key, best last: guard-passing before refused, then the score's lower CI bound, then its mean (a NaN bound,
    fewer than 2 cases, ranks as -inf)."""
    lo = s.score_lo if math.isfinite(s.score_lo) else -math.inf
    mean = s.score if math.isfinite(s.score) else -math.inf
    return (s.local, lo, mean)


def select(scores: dict[str, CandidateScore]) -> str | None:
    """The chosen candidate: the guard-passing one with the highest lower CI bound of the score (ties: the higher mean,
    then the first given); None when the guard refuses every candidate."""
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


__all__ = ["GUARD_REFERENCES", "OBJECTIVES", "CandidateScore", "Component", "HalvingResult", "Objective", "StopSearch",
           "Unmeasured", "post_column", "rank_key", "reference_ci", "rung_sizes", "score_rows", "select",
           "sequential_objective", "successive_halving", "survivors"]
