"""The suite contract: how a family of evaluations turns cases into scoring requests and metric rows.

A suite is a subclass of :class:`Suite` and declares, instead of the runner or the report probing for them:

- ``name``: the registry key (``editscope.suites.SUITES``);
- ``metrics_declared``: every metric it emits, once, as :class:`~editscope.metrics.registry.MetricSpec`
  (paper, equation, direction, range, unit, paper scale, pre/post pairing; aggregates such as the CounterFact
  Score are computed by the summary from these declarations). Emitting an undeclared metric is an error
  (:meth:`Suite.checked_metrics`, called by the runner);
- ``probe_many(engine, cases) -> list[dict]`` (required): ask the scoring engine everything the suite needs
  about many cases on the model as it is *now* (once before the edit and once after) with one
  ``engine.score`` call. The results are JSON-serialisable raw data; ``probe(engine, case)`` is
  ``probe_many`` of one case;
- ``metrics(case, pre, post) -> dict[str, float]`` (required, pure): the metric row from two probes, with
  ``editscope.metrics`` functions; no model access;
- ``edit_requests(case)``: what the runner edits for a case; default: the case's own requests
  (``one_to_n`` overrides it to write every valid answer);
- ``figures(dataset, rows, methods, seed)``: the suite's own report figures (default: none); the report
  draws its generic tables and bar charts from the declarations and adds these.

Metric naming, one scheme for every suite: a metric measured on the unedited and on the edited model is
emitted as ``NAME_pre`` and ``NAME_post`` (``pairing="pre_post"``); a metric that only exists after the edit
(it compares pre and post itself, or describes the case) is plain ``NAME`` (``pairing="post_only"``). A key
whose value is undefined for a case (e.g. a PEAK setting where the pre-edit filter left no prompt) is
*absent* rather than NaN; values may be ``inf`` (PPL overflow).

Raw-score conventions every suite follows (the runner and the report rely on them):

- a scored candidate is ``{"text": str, "kind": str, "logprob_sum": float, "n_tokens": int,
  "token_logprobs": [float], "token_is_argmax": [bool]}``; ``"text"`` is the answer as given (the engine
  adds the boundary space when scoring);
- a probe is ``{"prompts": [{"prompt": str, "role": str, "candidates": [candidate, ...]}, ...], ...}`` with
  ``role`` one of ``rewrite``, ``paraphrase``, ``neighborhood`` and suite-specific extras at the top level
  (``counterfact`` ``"generation"``, ``one_to_n`` ``"gold"``);
- ``counterfact`` and ``zsre`` label candidates ``"new"`` (target_new) and ``"true"`` (target_true, or a
  neighbourhood prompt's own answer); ``peak`` labels ``"correct" | "hard_false" | "random_false" | "new"``.

Adding a suite is one module (a :class:`Suite` subclass) plus one line, ``register_suite(MySuite)``
(:func:`editscope.suites.register_suite`); the runner, summary and report need no change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics.registry import Declarations, MetricSpec


def check_choice(suite: str, option: str, value: Any, choices: Sequence[Any]) -> None:
    """A suite option that takes one of ``choices``: a one-line error naming the suite, the option and the
    choices otherwise (bools are choices too: ``(True, False)``)."""
    if not any(value is c if isinstance(c, bool) else (not isinstance(value, bool) and value == c) for c in choices):
        names = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
        raise EditscopeError(f"{suite} suite: option {option} must be one of {names}, not {value!r}")


@dataclass(frozen=True)
class SuiteFigure:
    """One figure a suite adds to the report: file slug, title, caption and the PNG bytes."""

    slug: str
    title: str
    caption: str
    png: bytes


class Suite(ABC):
    """One evaluation family (see the module docstring)."""

    name: ClassVar[str]
    #: whether the suite has a say in what is edited (:meth:`edit_requests`); False for a suite that measures the
    #: model whatever was edited (``general``), so it can share a block with any other suite
    chooses_edits: ClassVar[bool] = True
    #: the edit card's section that shows this suite's probes (``logprobs``: scored candidates; ``siblings``,
    #: ``peak-answers``, ``evk-stability``, ``collateral-damage``: the sections of those suites); None: the card
    #: shows its metrics only
    card_section: ClassVar[str | None] = None
    #: an evaluation protocol's pairing with the teacher-forced suites (teacher-forced suite name -> pairs of (its
    #: column, this suite's column) that measure the same thing): the summary's paired gap table of a block that
    #: holds both (:func:`editscope.run.summary_tables.protocol_gaps`); empty for a teacher-forced suite
    counterparts: ClassVar[Mapping[str, tuple[tuple[str, str], ...]]] = {}
    #: quantities the editors report per round (``edit_info`` key -> its declaration) that this suite's curves
    #: against the number of edits show beside its own metrics (:func:`editscope.run.summary.edit_info_curves`)
    edit_info_curves: ClassVar[Mapping[str, MetricSpec]] = {}
    #: whether the suite scores prompts from embeddings it perturbs (EVK's stability): a context edit cannot be
    #: measured so (its text before the prompt has no perturbed embeddings), and a run pairing them is refused
    reads_prompt_embeddings: ClassVar[bool] = False

    @property
    @abstractmethod
    def metrics_declared(self) -> tuple[MetricSpec, ...]:
        """Every metric this suite (with its options) can emit, plus its summary-time aggregates."""

    @abstractmethod
    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Raw scores of ``cases`` on the model as it is now, one probe per case (JSON-serialisable)."""

    @abstractmethod
    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """The suite's metric row from a pre-edit and a post-edit probe (pure)."""

    @property
    def protocol(self) -> dict[str, str]:
        """The protocol this suite's numbers follow (DESIGN rule 10), copied into every results row and printed
        under the report's tables: ``{"name": "paper" | "reference" | ..., "note": one sentence}``, plus any
        settings a reader of the rows needs as values (the wild suite's ``judge`` and ``locality_judge``). Suites
        whose options choose between a paper's and its reference code's protocol override it."""
        return {"name": "paper", "note": "as the papers cited by the metric declarations define them"}

    def probe(self, engine: Scorer, case: Case) -> dict[str, Any]:
        """Raw scores of one case (``probe_many`` of one case)."""
        return self.probe_many(engine, [case])[0]

    def edit_requests(self, case: Case) -> list[EditRequest]:
        """What to edit for ``case``: its own requests."""
        return list(case.requests)

    def figures(self, dataset: str, rows: Sequence[dict[str, Any]], methods: Sequence[str], *,
                seed: int = 0) -> list[SuiteFigure]:
        """Suite-specific report figures from the results rows of one dataset (``row["pre"][self.name]``...)."""
        return []

    @cached_property
    def declarations(self) -> Declarations:
        """``metrics_declared``, checked (unique names; aggregates over declared metrics)."""
        try:
            return Declarations(tuple(self.metrics_declared))
        except ValueError as exc:
            raise EditscopeError(f"suite {self.name}: {exc}") from None

    def checked_metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """``metrics`` after checking that the row holds only declared per-case metric names."""
        row = self.metrics(case, pre, post)
        bad = self.declarations.undeclared(list(row))
        if bad:
            raise EditscopeError(f"suite {self.name}: metric {bad[0]!r} is not declared in metrics_declared "
                                 f"(undeclared: {', '.join(bad)}; declared: "
                                 f"{', '.join(self.declarations.per_case_columns)})")
        return row
