"""How the runner finds suites: the registry of :mod:`editscope.suites` plus any factories the caller passes
(a Python API user, or a test, can run a suite that is not registered); and the metric declarations and the facts
of a run's suites, as stored in ``run.json`` (what the summary and the report read: a run scored with a plug-in
suite is summarised without importing it)."""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics.registry import MetricSpec, specs_from_json, specs_to_json
from editscope.suites import SUITES, get_suite
from editscope.suites.base import Suite
from editscope.typed import typed

SuiteFactory = Callable[..., Suite]


def available_suites(extra: Mapping[str, SuiteFactory] | None = None) -> list[str]:
    """Names of the registered suites (``editscope.suites.SUITES``) plus ``extra``."""
    names = list(SUITES)
    return names + [n for n in (extra or {}) if n not in names]


def option_problem(name: str, options: Mapping[str, Any],
                   extra: Mapping[str, SuiteFactory] | None = None) -> tuple[str, str] | None:
    """``(option, what is wrong)`` for the first option of suite ``name`` whose value does not fit its annotation
    on the suite's constructor; None when all fit (or the suite is unknown)."""
    factory = extra[name] if extra and name in extra else SUITES.get(name, None)
    if factory is None:
        return None
    try:
        hints = typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)
    except Exception:  # noqa: BLE001 -- unresolvable annotations: leave the check to the constructor
        return None
    for key, value in options.items():
        if key in hints and not typed(value, hints[key], strict=False):
            tp = hints[key]
            shown = tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")
            return key, f"expected {shown}, got {value!r}"
    return None


def make_suite(name: str, options: Mapping[str, Any], extra: Mapping[str, SuiteFactory] | None = None) -> Suite:
    """Instantiate suite ``name`` with ``options`` (``extra`` factories first, then the registry); the result
    must implement the :class:`~editscope.suites.base.Suite` contract."""
    problem = option_problem(name, options, extra)
    if problem:
        raise EditscopeError(f"suite {name!r}: option {problem[0]!r}: {problem[1]}")
    if extra and name in extra:
        try:
            suite = extra[name](**options)
        except TypeError as exc:  # an unknown option
            raise EditscopeError(f"suite {name!r}: bad options {dict(options)}: {exc}") from exc
    elif name in SUITES:
        suite = get_suite(name, **options)
    else:
        raise EditscopeError(f"unknown suite {name!r}; available: {', '.join(available_suites(extra)) or 'none'}")
    if not isinstance(suite, Suite):
        raise EditscopeError(f"suite {name!r}: {type(suite).__name__} does not implement the suite contract "
                             "(subclass editscope.suites.base.Suite)")
    suite.declarations  # noqa: B018 -- a malformed declaration fails here, before any work
    return suite


def probe_cases(suite: Suite, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
    """Raw probes of ``cases`` (one ``probe_many`` call), checked to be one per case."""
    out = list(suite.probe_many(engine, list(cases)))
    if len(out) != len(cases):
        raise EditscopeError(f"suite {suite.name}: probe_many returned {len(out)} probes for {len(cases)} cases")
    return out


DeclaredMetrics = dict[tuple[str, str], tuple[MetricSpec, ...]]
"""(dataset label, suite name) -> metric declarations."""


@dataclass(frozen=True)
class SuiteFacts:
    """What the summary and the report need to know of a suite beyond its metric declarations (recorded in
    ``run.json`` beside them): ``whole_model``, whether it measures the model as a whole (``chooses_edits`` False:
    every case of a probe carries the same value, so no interval over cases); ``counterparts``, the teacher-forced
    columns its own columns pair with (:attr:`Suite.counterparts`); ``edit_info_curves``, the per-round editor
    quantities its curves show (:attr:`Suite.edit_info_curves`)."""

    whole_model: bool = False
    counterparts: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    edit_info_curves: Mapping[str, MetricSpec] = field(default_factory=dict)

    @classmethod
    def of(cls, suite: Suite | type[Suite]) -> SuiteFacts:
        return cls(not suite.chooses_edits, dict(suite.counterparts), dict(suite.edit_info_curves))

    def to_json(self) -> dict[str, Any]:
        return {"whole_model": self.whole_model,
                "counterparts": {s: [list(p) for p in pairs] for s, pairs in self.counterparts.items()},
                "edit_info_curves": {k: spec.to_dict() for k, spec in self.edit_info_curves.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SuiteFacts:
        pairs = data.get("counterparts") or {}
        return cls(bool(data.get("whole_model", False)),
                   {s: tuple((str(a), str(b)) for a, b in cols) for s, cols in pairs.items()},
                   {k: MetricSpec.from_dict(d) for k, d in (data.get("edit_info_curves") or {}).items()})


FactsMap = Mapping[str, SuiteFacts]
"""Suite name -> its :class:`SuiteFacts` (a suite's facts do not depend on its options)."""


def live_facts(name: str) -> SuiteFacts:
    """The facts the registered suite class ``name`` declares (empty facts for an unregistered suite or a factory
    function): for runs recorded before ``run.json`` held them."""
    factory = SUITES.get(name, None)
    return SuiteFacts.of(factory) if isinstance(factory, type) and issubclass(factory, Suite) else SuiteFacts()


def facts_of(facts: FactsMap | None, name: str) -> SuiteFacts:
    """``name``'s recorded facts, else the live registry's."""
    return facts[name] if facts is not None and name in facts else live_facts(name)


def recorded_facts(meta: Mapping[str, Any]) -> dict[str, SuiteFacts]:
    """The suite facts a run's ``run.json`` (``meta``) records (none for a run made before they were recorded)."""
    return {e["suite"]: SuiteFacts.from_json(e["facts"]) for e in meta.get("metrics", []) if "facts" in e}


def declarations_to_json(declared: Mapping[tuple[str, str], Sequence[MetricSpec]],
                         facts: FactsMap | None = None) -> list[dict[str, Any]]:
    """The ``run.json`` form: ``[{"dataset", "suite", "metrics": [spec, ...], "facts": {...}}, ...]``."""
    return [{"dataset": d, "suite": s, "metrics": specs_to_json(specs)}
            | ({"facts": facts[s].to_json()} if facts is not None and s in facts else {})
            for (d, s), specs in declared.items()]


def declared_metrics(meta: Mapping[str, Any], suite_factories: Mapping[str, SuiteFactory] | None = None,
                     ) -> DeclaredMetrics:
    """The metric declarations of a run: from its ``run.json`` (``meta``) when stored there, else rebuilt
    from its config with the registry and ``suite_factories`` (suites found in neither are left out)."""
    if "metrics" in meta:
        return {(e["dataset"], e["suite"]): specs_from_json(e["metrics"]) for e in meta["metrics"]}
    out: DeclaredMetrics = {}
    for block in meta.get("config", {}).get("blocks", []):
        for spec in block.get("suites", []):
            if spec["name"] in SUITES or spec["name"] in (suite_factories or {}):
                suite = make_suite(spec["name"], spec.get("options") or {}, suite_factories)
                out[(block["label"], spec["name"])] = suite.declarations.specs
    return out
