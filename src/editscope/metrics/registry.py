"""Metric declarations: what a number is, so the runner, summary and report never guess from names or values.

A suite declares every metric it emits once, as a :class:`MetricSpec` (DESIGN rule 11). Naming scheme, the
same for every suite (see :mod:`editscope.suites.base`):

* ``pairing="pre_post"``: the metric is measured on the unedited and on the edited model; a row holds
  ``NAME_pre`` and ``NAME_post`` (:attr:`MetricSpec.columns`);
* ``pairing="post_only"``: the metric only exists after the edit (it compares pre and post itself, e.g.
  PEAK's RFF, or describes the case); a row holds plain ``NAME``.

An *aggregate* metric (:class:`Aggregate`) is not emitted per case: the summary computes it from the
dataset-level means of other metrics of the same suite (the CounterFact/zsRE Score, paper 002 appendix C),
with a bootstrap confidence interval over cases. Declarations are plain data (JSON via :meth:`to_dict`), so a
run directory carries them in ``run.json``. Pure: no torch, no model, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Pairing = Literal["pre_post", "post_only"]
PAIRINGS = ("pre_post", "post_only")
UNITS = ("share", "log-prob", "nats", "bits", "ppl", "prob", "prob-diff", "count", "cosine", "ratio", "flag")


def harmonic_mean(values: Sequence[float]) -> float:
    """Harmonic mean ``n / Σ 1/x`` of non-negative values, 0 when any value is 0 (its limit); NaN when any
    value is NaN or negative. The CounterFact/zsRE Score S (paper 002, appendix C.1 and C.2) is this mean of
    the dataset-level ES, PS, NS (Efficacy, Paraphrase, Specificity)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x)) or np.any(x < 0):
        return math.nan
    if np.any(x == 0):
        return 0.0
    return float(x.size / np.sum(1.0 / x))


AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {"hmean": harmonic_mean}
"""Aggregate kind -> function of the component means (in the order of ``Aggregate.of``)."""


@dataclass(frozen=True)
class Aggregate:
    """A summary-time metric: ``AGGREGATES[kind]`` of the dataset-level means of the metrics ``of`` (base
    names of metrics of the same suite, with the same pairing)."""

    kind: str
    of: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in AGGREGATES:
            raise ValueError(f"aggregate kind {self.kind!r} unknown; known: {', '.join(AGGREGATES)}")
        if not self.of:
            raise ValueError("an aggregate needs at least one component metric")

    def compute(self, means: Sequence[float]) -> float:
        return AGGREGATES[self.kind](means)


def hmean_of(names: Sequence[str]) -> Aggregate:
    """The harmonic mean of the dataset-level means of ``names`` (paper 002's Score S)."""
    return Aggregate("hmean", tuple(names))


@dataclass(frozen=True)
class MetricSpec:
    """One declared metric.

    ``paper``/``equation`` cite where it is defined; ``higher_is_better`` is the direction (None: neither,
    e.g. a count); ``range`` the values it can take (``(0, 1)`` for shares; ``math.inf`` for open ends);
    ``unit`` what one unit is; ``paper_scale`` the factor the paper prints it with (100 when tables show
    percentages); ``pairing`` the naming scheme (module docstring); ``aggregate`` set for summary-time metrics;
    ``headline``: a column of the paper's main table (the report's compact table); False for magnitudes,
    diagnostics and alternative protocols, which appear in the long table only.
    """

    name: str
    paper: str
    equation: str
    higher_is_better: bool | None
    range: tuple[float, float] | None = (0.0, 1.0)
    unit: str = "share"
    paper_scale: float = 1.0
    pairing: Pairing = "pre_post"
    description: str = ""
    aggregate: Aggregate | None = None
    headline: bool = True

    def __post_init__(self) -> None:
        if self.pairing not in PAIRINGS:
            raise ValueError(f"metric {self.name}: pairing must be one of {PAIRINGS}, not {self.pairing!r}")
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.name}: unit must be one of {UNITS}, not {self.unit!r}")
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError(f"metric {self.name}: range {self.range} is empty")

    @property
    def columns(self) -> tuple[str, ...]:
        """The keys of a metric row (or summary) that hold this metric: ``NAME_pre``, ``NAME_post`` or ``NAME``."""
        return (f"{self.name}_pre", f"{self.name}_post") if self.pairing == "pre_post" else (self.name,)

    @property
    def post(self) -> str:
        """The column of the edited model's value."""
        return self.columns[-1]

    @property
    def pre(self) -> str | None:
        """The column of the unedited model's value (None for post-only metrics)."""
        return self.columns[0] if self.pairing == "pre_post" else None

    @property
    def arrow(self) -> str:
        """``↑`` (higher is better), ``↓`` (lower is better) or ``""``."""
        return {True: "↑", False: "↓", None: ""}[self.higher_is_better]

    @property
    def unit_label(self) -> str:
        """``share``, or e.g. ``share, paper ×100``."""
        return self.unit + (f", paper ×{self.paper_scale:g}" if self.paper_scale != 1 else "")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name, "paper": self.paper, "equation": self.equation,
            "higher_is_better": self.higher_is_better,
            "range": [_json_num(x) for x in self.range] if self.range is not None else None,
            "unit": self.unit, "paper_scale": self.paper_scale, "pairing": self.pairing,
            "description": self.description,
            "aggregate": {"kind": self.aggregate.kind, "of": list(self.aggregate.of)} if self.aggregate else None,
            "headline": self.headline,
        }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricSpec:
        rng = data.get("range")
        agg = data.get("aggregate")
        return cls(name=data["name"], paper=data["paper"], equation=data["equation"],
                   higher_is_better=data["higher_is_better"],
                   range=(float(rng[0]), float(rng[1])) if rng is not None else None,
                   unit=data["unit"], paper_scale=float(data["paper_scale"]), pairing=data["pairing"],
                   description=data.get("description", ""),
                   aggregate=Aggregate(agg["kind"], tuple(agg["of"])) if agg else None,
                   headline=data.get("headline", True))


def _json_num(x: float) -> float | str:
    """JSON has no infinity: open range ends are written as the strings ``"inf"``/``"-inf"``."""
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True)
class Declarations:
    """The metrics of one suite, checked: unique names, aggregates over declared per-case metrics."""

    specs: tuple[MetricSpec, ...]
    by_column: dict[str, MetricSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [s.name for s in self.specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"metrics declared twice: {', '.join(dupes)}")
        by_column = {c: s for s in self.specs for c in s.columns}
        if len(by_column) != sum(len(s.columns) for s in self.specs):
            raise ValueError("two declared metrics share a column name")
        per_case = {s.name: s for s in self.specs if s.aggregate is None}
        for s in self.specs:
            if s.aggregate is None:
                continue
            for part in s.aggregate.of:
                if part not in per_case or per_case[part].pairing != s.pairing:
                    raise ValueError(f"aggregate {s.name}: component {part!r} is not a declared per-case metric "
                                     f"with pairing {s.pairing!r}")
        object.__setattr__(self, "by_column", by_column)

    @property
    def per_case_columns(self) -> tuple[str, ...]:
        """The keys a suite's ``metrics()`` row may hold."""
        return tuple(c for s in self.specs if s.aggregate is None for c in s.columns)

    def undeclared(self, names: Sequence[str]) -> list[str]:
        """The names of ``names`` that are no per-case column of these declarations."""
        allowed = set(self.per_case_columns)
        return [n for n in names if n not in allowed]


def specs_to_json(specs: Sequence[MetricSpec]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in specs]


def specs_from_json(data: Sequence[Mapping[str, Any]]) -> tuple[MetricSpec, ...]:
    return tuple(MetricSpec.from_dict(d) for d in data)


__all__ = ["AGGREGATES", "Aggregate", "Declarations", "MetricSpec", "Pairing", "harmonic_mean", "hmean_of",
           "specs_from_json", "specs_to_json"]
