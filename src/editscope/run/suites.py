"""How the runner finds suites: the registry of :mod:`editscope.suites` plus any factories the caller passes
(a Python API user, or a test, can run a suite that is not registered); and the metric declarations of a
run's suites, as stored in ``run.json`` (what the summary and the report read)."""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
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


def declarations_to_json(declared: Mapping[tuple[str, str], Sequence[MetricSpec]]) -> list[dict[str, Any]]:
    """The ``run.json`` form: ``[{"dataset", "suite", "metrics": [spec, ...]}, ...]``."""
    return [{"dataset": d, "suite": s, "metrics": specs_to_json(specs)} for (d, s), specs in declared.items()]


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
