"""Evaluation suites: cases -> scoring requests -> metric rows (protocol in ``editscope.suites.base``).

``SUITES`` (a :class:`~editscope.registry.Registry`) maps a suite name to its factory; ``get_suite(name,
**options)`` builds one; ``register_suite(MySuite)`` adds one (the one place to add a suite). Every suite is a
:class:`~editscope.suites.base.Suite`: it declares its metrics (``metrics_declared``), offers
``probe_many(engine, cases)`` (one ``engine.score`` call for many cases), ``probe(engine, case)``, the pure
``metrics(case, pre, post)``, ``edit_requests(case)`` and its report ``figures``. The probe formats and metrics
are documented in each module:

* ``counterfact`` -- :mod:`.counterfact` (ES/PS/NS, EM/PM/NM, EasyEdit accuracies, optional GE/RS; Score);
* ``zsre`` -- :mod:`.zsre` (Efficacy/Paraphrase/Specificity top-1; Score);
* ``peak`` -- :mod:`.peak` (appending ES/GS/LS, additivity for hard and random false answers);
* ``one_to_n`` -- :mod:`.one_to_n` (NKL/MaxAcc/Precision@K/PPL before and after);
* ``evk`` -- :mod:`.evk` (EVK-Bench Embedding/Text Stability per drift type and σ);
* ``portability`` -- :mod:`.portability` (KnowEdit portability/locality, EasyEdit's token-accuracy protocol);
* ``general`` -- :mod:`.general` (perplexity, next-token accuracy, known-fact locality, GE of the whole model);
* ``collateral`` -- :mod:`.collateral` (known facts an edit made the model stop answering: Flipped);
* ``weights`` -- :mod:`.weights` (drift of the edited matrices: ‖ΔW‖/‖W₀‖, norm growth, σ₁(ΔW)/σ₁(W₀)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from editscope.errors import EditscopeError
from editscope.registry import Registry
from editscope.suites.base import Suite, SuiteFigure
from editscope.suites.collateral import CollateralSuite
from editscope.suites.counterfact import CounterFactSuite
from editscope.suites.evk import EvkSuite
from editscope.suites.general import GeneralAbilitySuite
from editscope.suites.one_to_n import OneToNSuite
from editscope.suites.peak import PeakSuite
from editscope.suites.portability import PortabilitySuite
from editscope.suites.weights import WeightDriftSuite
from editscope.suites.wild import WildSuite
from editscope.suites.zsre import ZsreSuite


def _suite_name(factory: Callable[..., Suite]) -> str:
    if isinstance(factory, type) and issubclass(factory, Suite):
        return factory.name
    raise EditscopeError(f"suite factory {factory!r}: not a Suite subclass, so register it with name=...")


def _first_doc_line(factory: Callable[..., Suite]) -> str:
    return next(iter((factory.__doc__ or "").strip().splitlines()), "")


SUITES: Registry[Callable[..., Suite]] = Registry("suite", check=callable, check_text="callable (a suite factory)",
                                                  name_of=_suite_name, describe=_first_doc_line,
                                                  listed_as="registered")
"""Suite name -> factory (keyword options as documented by each suite class)."""


def register_suite(factory: Callable[..., Suite], name: str | None = None, *, aliases: Sequence[str] = (),
                   replace: bool = False) -> Callable[..., Suite]:
    """Add a suite factory to :data:`SUITES` (name: ``factory.name`` for a Suite subclass); returns it, so it
    also works as a class decorator."""
    return SUITES.register(factory, name, aliases=aliases, replace=replace)


for _factory in (CounterFactSuite, ZsreSuite, PeakSuite, OneToNSuite, EvkSuite, PortabilitySuite,
                 GeneralAbilitySuite, CollateralSuite, WildSuite, WeightDriftSuite):
    register_suite(_factory)


def get_suite(name: str, **options: Any) -> Suite:
    """A suite by name, built with ``options``; unknown names raise naming the registered ones."""
    factory = SUITES.get(name)
    try:
        return factory(**options)
    except TypeError as exc:
        raise EditscopeError(f"suite {name!r}: bad options {sorted(options)}: {exc}") from None


__all__ = ["SUITES", "CollateralSuite", "CounterFactSuite", "EvkSuite", "OneToNSuite", "PeakSuite",
           "PortabilitySuite", "Suite", "SuiteFigure", "WeightDriftSuite", "WildSuite", "ZsreSuite", "get_suite",
           "register_suite"]
