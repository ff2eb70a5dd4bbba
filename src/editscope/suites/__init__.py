"""Evaluation suites: cases -> scoring requests -> metric rows (protocol in ``editscope.suites.base``).

``SUITES`` maps a suite name to its factory; ``get_suite(name, **options)`` builds one. It is the one place
to add a suite. Every suite is a :class:`~editscope.suites.base.Suite`: it declares its metrics
(``metrics_declared``), offers ``probe_many(engine, cases)`` (one ``engine.score`` call for many cases),
``probe(engine, case)``, the pure ``metrics(case, pre, post)``, ``edit_requests(case)`` and its report
``figures``. The probe formats and metrics are documented in each module:

* ``counterfact`` -- :mod:`.counterfact` (ES/PS/NS, EM/PM/NM, EasyEdit accuracies, optional GE/RS; Score);
* ``zsre`` -- :mod:`.zsre` (Efficacy/Paraphrase/Specificity top-1; Score);
* ``peak`` -- :mod:`.peak` (appending ES/GS/LS, additivity for hard and random false answers);
* ``one_to_n`` -- :mod:`.one_to_n` (NKL/MaxAcc/Precision@K/PPL before and after);
* ``evk`` -- :mod:`.evk` (EVK-Bench Embedding/Text Stability per drift type and σ);
* ``portability`` -- :mod:`.portability` (KnowEdit portability/locality, EasyEdit's token-accuracy protocol);
* ``general`` -- :mod:`.general` (perplexity, next-token accuracy, known-fact locality, GE of the whole model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from editscope.errors import EditscopeError
from editscope.suites.base import Suite, SuiteFigure
from editscope.suites.counterfact import CounterFactSuite
from editscope.suites.evk import EvkSuite
from editscope.suites.general import GeneralAbilitySuite
from editscope.suites.one_to_n import OneToNSuite
from editscope.suites.peak import PeakSuite
from editscope.suites.portability import PortabilitySuite
from editscope.suites.zsre import ZsreSuite

SUITES: dict[str, Callable[..., Suite]] = {
    "counterfact": CounterFactSuite,
    "zsre": ZsreSuite,
    "peak": PeakSuite,
    "one_to_n": OneToNSuite,
    "evk": EvkSuite,
    "portability": PortabilitySuite,
    "general": GeneralAbilitySuite,
}
"""Suite name -> factory (keyword options as documented by each suite class)."""


def get_suite(name: str, **options: Any) -> Suite:
    """A suite by name, built with ``options``; unknown names raise naming the registered ones."""
    if name not in SUITES:
        raise EditscopeError(f"unknown suite {name!r}; registered: {', '.join(SUITES)}")
    try:
        return SUITES[name](**options)
    except TypeError as exc:
        raise EditscopeError(f"suite {name!r}: bad options {sorted(options)}: {exc}") from None


__all__ = ["SUITES", "CounterFactSuite", "EvkSuite", "OneToNSuite", "PeakSuite", "PortabilitySuite", "Suite",
           "SuiteFigure", "ZsreSuite",
           "get_suite"]
