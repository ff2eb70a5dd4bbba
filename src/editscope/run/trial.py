"""The trial: the one unit of work through which everything that edits and measures goes.

A trial is one method (an editor with its hyperparameters and plug-ins) on one dataset block (its suites), under a
config seed and the runtime settings. Its steps, each written here once:

1. :meth:`Trial.probe` -- every suite probes some cases on the model as it is now, under the seed of the probe's
   identity: ``pre`` (dataset, group; before any edit, shared by every method of a group) or ``post`` (dataset,
   method, group and a tag such as a lifelong round);
2. :meth:`Trial.edit` -- one edit of some requests, seeded by its identity (dataset, method, group and, in a
   lifelong chain, the round), recorded in the :class:`Edits` log of the trial's :meth:`Trial.edits` block;
3. the end of that block -- the patches still applied are reverted and every edited parameter is checked
   against the bytes it had before the first edit: the only revert check there is;
4. :meth:`Trial.row` -- one :class:`Row` per probed case.

The runner (every mode), the lifelong chain (:mod:`editscope.run.chain`), the edit card
(:mod:`editscope.report.card`), :func:`editscope.edit_and_evaluate` and ``editscope edit`` all go through it:
a seed, a check or a row field lives in one place, and a new evaluation protocol (a suite) reaches all of them.
Seeds come from the config seed and the identity of a unit of work, never from the order of work, so a resumed,
sharded or replayed trial edits and probes exactly as the uninterrupted run did.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from editscope.edit.patch import Patch, tensor_checksum
from editscope.errors import EditscopeError
from editscope.progress import report
from editscope.run.plan import derived_seed, reprobe_seed, seed_label
from editscope.run.store import clean_metrics
from editscope.run.suites import probe_cases

if TYPE_CHECKING:
    from editscope.data.records import Case, EditRequest
    from editscope.edit.runtime import EditRuntime
    from editscope.lm.engine import Scorer
    from editscope.lm.loading import Bundle
    from editscope.suites.base import Suite


@contextmanager
def naming(what: str) -> Iterator[None]:
    """Prefix an editor's error (e.g. a non-finite ΔW) with the dataset, case and method it happened on."""
    try:
        yield
    except EditscopeError as exc:
        raise EditscopeError(f"{what}: {exc}") from None


@dataclass(frozen=True)
class Method:
    """What edits: the method's label in the config (e.g. ``rome+app``), its editor, resolved hyperparameters
    and attached plug-ins."""

    label: str
    editor: Any
    hp: Any
    plugins: tuple = ()

    @property
    def display(self) -> str:
        return self.editor.display(list(self.plugins))


@dataclass
class Probes:
    """Every suite's probes of some cases (``by_suite[name][j]``: the j-th case's) and the seconds per case."""

    by_suite: dict[str, list[dict[str, Any]]]
    seconds: float

    def of(self, j: int) -> dict[str, dict[str, Any]]:
        """The j-th case's probe of every suite."""
        return {name: probes[j] for name, probes in self.by_suite.items()}

    def at(self, positions: Sequence[int], size: int) -> Probes:
        """These probes (the j-th of the case at ``positions[j]``) laid out by position in a group of ``size``
        cases, the cases not probed left empty."""
        if list(positions) == list(range(size)):
            return self
        spread: dict[str, list[Any]] = {}
        for name, probes in self.by_suite.items():
            spread[name] = [None] * size
            for j, k in enumerate(positions):
                spread[name][k] = probes[j]
        return Probes(spread, self.seconds)


class PreProbeCache:
    """The unedited model's probes, shared by runs that probe the same cases the same way (a tune's candidates edit
    the same validation cases with other hparams). A pre probe depends on the model, the cases and the config but
    not on the method (its seed names the group alone), so runs that differ only in their methods compute it once.
    The caller owns the cache and keys it (:meth:`editscope.run.runner.Runner.pre_key`); every run gets its own
    copy of an entry, so no row aliases another run's probe. ``hits`` / ``misses`` count the lookups."""

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple, Probes] = {}
        self.hits = self.misses = 0

    def get(self, key: tuple, compute: Callable[[], Probes]) -> Probes:
        """The probes stored under ``key``, computed by ``compute`` on a miss (the oldest entry makes room)."""
        if key in self._entries:
            self.hits += 1
        else:
            self.misses += 1
            if len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = compute()
        return copy.deepcopy(self._entries[key])


@dataclass
class Row:
    """One line of ``results.jsonl``: one case, one method, one probe of the model.

    ``conventions`` and ``runtime`` are None on a row of the unedited model (``method: none``): no editor made
    it, so no convention and no runtime setting can have changed it, and the row leaves them out. ``lifelong``
    (``checkpoint``, ``edits_applied``, ``round``) is set only in ``mode: sequential_batches``: what was on the
    model when the row was probed."""

    dataset: str
    case_id: str
    index: int
    model: str  # as run.json's model.name (rows of older runs lack it: that model)
    method: str
    editor: str
    method_display: str
    plugins: list[dict[str, Any]]
    mode: str
    group: int
    group_size: int
    edit_seconds: float
    eval_seconds: float
    edit_info: dict[str, Any]
    requests: list[dict[str, str | None]]
    hparams: dict[str, Any]  # the editor's resolved hyperparameters (its convention, if it has one)
    conventions: dict[str, Any] | None  # the convention switches in force (DESIGN rule 10)
    runtime: dict[str, Any] | None
    protocol: dict[str, dict[str, Any]]  # DESIGN rule 10
    metrics: dict[str, dict[str, float | None]]
    pre: dict[str, Any]
    post: dict[str, Any]
    lifelong: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as stored: the fields in declaration order, those that are None left out, ``lifelong``'s keys
        at the end."""
        out = {k: v for k, v in self.__dict__.items() if v is not None and k != "lifelong"}
        return out | (self.lifelong or {})


def request_dicts(requests: Sequence[EditRequest]) -> list[dict[str, str | None]]:
    """What a row records of its edit requests."""
    return [{"prompt": r.prompt, "subject": r.subject, "target_new": r.target_new, "target_true": r.target_true}
            for r in requests]


def info_scalars(info: Mapping[str, Any]) -> dict[str, Any]:
    """The finite scalars of an edit's ``info``, by key name: a chain's checkpoint stores them sorted, so a resumed
    run writes them in the order a fresh one does."""
    out = {}
    for key, value in sorted(info.items()):
        if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
            out[key] = value
    return out


def check_restored(bundle: Bundle, checksums: Mapping[str, str], where: str = "") -> None:
    """Every parameter an edit touched is back at the bytes it had before the first edit (``checksums``)."""
    params = dict(bundle.model.named_parameters())
    for name, checksum in checksums.items():
        if tensor_checksum(params[name]) != checksum:
            raise EditscopeError(f"{where}parameter {name} was not restored after the edit (bug: please report)")


@dataclass
class Edits:
    """What a trial's edits left: the patches still applied (``loose``; in a chain each is folded into the bundle
    as soon as it is taken), the pre-edit checksum of every edited parameter, per edit (patch) a record of its
    cases, seconds and ``info`` scalars, and per case the edit that edited it: what the rows need, nothing that
    grows with the size of the weights. :meth:`take` saves a patch (when asked) and, in a chain, folds it."""

    bundle: Bundle
    chained: bool = False
    save_to: Path | None = None
    stem: str = "edit"
    loose: list[Patch] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    patch_of: list[int] = field(default_factory=list)

    @property
    def n_cases(self) -> int:
        """Cases edited so far."""
        return len(self.patch_of)

    def seconds(self, k: int) -> float:
        return self.records[self.patch_of[k]]["seconds"]

    def info(self, k: int) -> dict[str, Any]:
        return self.records[self.patch_of[k]]["info"]

    def take(self, patch: Patch, n_cases: int) -> None:
        """Record ``patch`` (just applied) as the edit of the next ``n_cases`` cases."""
        self.loose.append(patch)  # first: whatever fails below, the trial reverts what the log holds
        for name, checksum in patch.checksums.items():
            self.checksums.setdefault(name, checksum)
        self.patch_of += [len(self.records)] * n_cases
        self.records.append({"cases": n_cases, "seconds": patch.info["seconds"], "info": info_scalars(patch.info),
                             "digest": patch.digest})
        if self.save_to is not None:
            patch.save(self.save_to / f"{self.stem}-{len(self.records) - 1}.safetensors")
        if self.chained and patch.kind == "weights":
            self.bundle.fold(patch)
            self.loose.pop()
        elif self.chained:  # a memory or context edit holds the whole store: the one it superseded is let go
            patch.release_superseded()
            self.loose = [patch]

    def restored(self, patch: Patch, records: Sequence[Mapping[str, Any]]) -> None:
        """A resumed chain: ``patch`` (the folded ΔW of the rounds before, already folded; or the memory or context
        edit reinstated from the chain's store, applied) and those rounds' :attr:`records` as its checkpoint saved
        them."""
        if patch.kind != "weights":
            self.loose = [patch]
        for name, checksum in patch.checksums.items():
            self.checksums.setdefault(name, checksum)
        for record in records:
            self.patch_of += [len(self.records)] * int(record["cases"])
            self.records.append({"cases": int(record["cases"]), "seconds": float(record["seconds"]),
                                 "info": dict(record["info"]), "digest": str(record["digest"])})


@dataclass
class Trial:
    """One method on one dataset block (see the module docstring). ``method`` is None for the unedited model
    (``probe_only``); ``prompt_format`` is the engine's chat template when prompts are wrapped in it."""

    dataset: str
    suites: Mapping[str, Suite]
    method: Method | None
    runtime: EditRuntime | None
    seed: int = 0
    prompt_format: Mapping[str, str] | None = None

    @property
    def label(self) -> str:
        return self.method.label if self.method is not None else "none"

    # -- seeds: the identity of each unit of work -------------------------------------------------------------
    def edit_seed(self, group: int, *round_: int) -> int:
        return derived_seed(self.seed, seed_label(self.dataset), self.label, group, "edit", *round_)

    def reprobe_seed(self, group: int) -> int:
        """The seed of a lifelong group's re-probe sample (:func:`editscope.run.plan.reprobe_seed`)."""
        return reprobe_seed(self.seed, self.dataset, group)

    # -- the steps ------------------------------------------------------------------------------------------
    def probe(self, engine: Scorer, cases: Sequence[Case], stage: str = "post") -> Probes:
        """Every suite's probes of ``cases`` on the model as it is now (``stage`` "pre": before any edit; "post":
        after this trial's edits; the progress line says which). A probe draws nothing from torch's global stream:
        a suite that samples (CounterFact's GE) draws from a generator of its own seeded by its options."""
        if stage not in ("pre", "post"):
            raise ValueError(f"stage {stage!r}: expected 'pre' or 'post'")
        t0 = time.perf_counter()
        head = (f"{self.dataset}: probing {len(cases)} case(s) before editing" if stage == "pre" else
                f"{self.dataset}, {self.label}: probing {len(cases)} case(s) after the edits")
        by_suite = {}
        for name, suite in self.suites.items():  # one status per suite: a slow suite is named while it runs
            report(f"{head}: {name}" if len(self.suites) > 1 else head)
            by_suite[name] = probe_cases(suite, engine, cases)
        return Probes(by_suite, (time.perf_counter() - t0) / max(len(cases), 1))

    @contextmanager
    def edits(self, bundle: Bundle, *, chained: bool = False, save_to: Path | None = None,
              stem: str = "edit") -> Iterator[Edits]:
        """A block in which :meth:`edit` edits ``bundle``; on exit (also on error) every edit is undone, and on a
        normal exit every edited parameter is checked to hold its pre-edit bytes again. ``chained``: the patches
        are folded into the bundle as they come (one pre-edit copy per edited parameter, not one ΔW per edit, so
        memory stays flat over long chains; a patch is saved before it is folded)."""
        log = Edits(bundle, chained, save_to, stem)
        with bundle.folding() if chained else nullcontext():
            try:
                yield log
            finally:
                for patch in reversed(log.loose):
                    if patch.applied:
                        patch.revert(bundle)
        check_restored(bundle, log.checksums, f"{self.dataset}, {self.label}: ")
        if bundle.contexts or bundle.has_memory:  # a memory or context edit writes no weight: it must be gone
            raise EditscopeError(f"{self.dataset}, {self.label}: a memory or context edit is still in force after the "
                                 "edits were undone (bug: please report)")

    def edit(self, log: Edits, requests: Sequence[EditRequest], state: Any, *, engine: Scorer, group: int,
             n_cases: int, where: str, round_: tuple[int, ...] = (), seeded: bool = True) -> Patch:
        """One edit of ``requests`` (of ``n_cases`` cases) on the log's bundle with the sequential ``state``,
        seeded by its identity (group and, in a lifelong chain, ``round_``); taken into ``log``. ``where`` names
        the cases in an editor's error. ``seeded`` False: the edit continues the random stream of the group's
        earlier edits (the later edits of a ``sequential`` group)."""
        method = self.method
        if method is None:
            raise EditscopeError(f"{self.dataset}: method none edits nothing")
        if seeded:
            torch.manual_seed(self.edit_seed(group, *round_))
        with naming(f"{self.dataset}: {where}, method {method.label}"):
            patch = method.editor.apply(log.bundle, list(requests), method.hp, state, engine=engine,
                                        runtime=self.runtime, plugins=list(method.plugins))
        log.take(patch, n_cases)
        return patch

    @contextmanager
    def edited(self, bundle: Bundle, requests: Sequence[EditRequest], *, engine: Scorer, group: int = 0,
               state: Any = None) -> Iterator[Patch]:
        """One edit of ``requests`` held for the body of the block, then undone and checked: a card's, an API
        call's or ``editscope edit``'s trial. ``state``: the editor's (default: a fresh one)."""
        assert self.method is not None
        if state is None:
            state = self.method.editor.new_state()
        with self.edits(bundle) as log:
            yield self.edit(log, requests, state, engine=engine, group=group, n_cases=1, where="request")

    def metrics(self, case: Case, pre: Mapping[str, Any], post: Mapping[str, Any] | None
                ) -> dict[str, dict[str, float | None]]:
        """Every suite's metric row of ``case``; ``post`` None: the unedited model's (``NAME_pre``) columns alone,
        the pre-edit probe standing in for the post-edit one (post-only metrics compare the two: left out)."""
        out = {}
        for name, suite in self.suites.items():
            if post is None:
                decl = suite.declarations
                values = {col: v for col, v in suite.checked_metrics(case, pre[name], pre[name]).items()
                          if decl.by_column[col].pre == col}
            else:
                values = suite.checked_metrics(case, pre[name], post[name])
            out[name] = clean_metrics(values)
        return out

    def protocol(self) -> dict[str, dict[str, Any]]:
        """Each suite's protocol (DESIGN rule 10), with the chat template's when prompts are wrapped in it."""
        fmt = self.prompt_format
        if not fmt:
            return {name: s.protocol for name, s in self.suites.items()}
        return {name: {**s.protocol, "chat_template": fmt["chat_template"],
                       "note": f"{s.protocol.get('note', '')}; {fmt['note']}".lstrip("; ")}
                for name, s in self.suites.items()}

    def row(self, case: Case, index: int, *, model: str, mode: str, group: int, group_size: int,
            requests: Sequence[EditRequest], pre: Mapping[str, Any], post: Mapping[str, Any] | None,
            eval_seconds: float, edit_seconds: float = 0.0, edit_info: Mapping[str, Any] | None = None,
            lifelong: Mapping[str, Any] | None = None) -> Row:
        """The row of ``case`` (the ``index``-th of its block) from its probes; ``post`` None: the unedited
        model's row (``method: none``, ``post: {}``)."""
        method = self.method
        return Row(
            dataset=self.dataset, case_id=case.case_id, index=index, model=model,
            method=self.label, editor=method.editor.name if method else "none",
            method_display=method.display if method else "unedited",
            plugins=[p.to_dict() for p in method.plugins] if method else [],
            mode=mode, group=group, group_size=group_size, edit_seconds=edit_seconds, eval_seconds=eval_seconds,
            edit_info=dict(edit_info or {}), requests=request_dicts(requests),
            hparams=method.hp.to_dict() if method else {},
            conventions=method.hp.protocol() if method else None,
            runtime=self.runtime.settings.recorded() if method and self.runtime is not None else None,
            protocol=self.protocol(), metrics=self.metrics(case, pre, post),
            pre={name: pre[name] for name in self.suites},
            post={name: post[name] for name in self.suites} if post is not None else {},
            lifelong=dict(lifelong) if lifelong else None)


__all__ = ["Edits", "Method", "PreProbeCache", "Probes", "Row", "Trial", "check_restored", "derived_seed",
           "info_scalars", "naming", "request_dicts"]
