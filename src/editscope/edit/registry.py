"""The editor registry: one declared contract for every editing method.

An :class:`Editor` states what a method is and can do — its name and display label, the parameters it writes,
whether it optimises through a loss built from :class:`~editscope.edit.objective.ObjectiveTerm` (so plug-ins
apply), the key statistics it reads, its sequential state class and the architecture families it supports —
plus its hparams class and its ``compute`` function (:class:`ComputeFn`). The runner, the CLI and reports read
these declarations; nothing is probed.

``EDITORS[name].apply(bundle, requests, hparams=None, state=None, plugins=[...])`` computes the edit, applies it
and returns the :class:`~editscope.edit.patch.Patch` (which reverts it bit-exactly). Adding a method is one
module exposing ``compute`` and an ``HParams`` subclass, plus one line: ``register_editor(Editor(...))``
(:data:`EDITORS` is a :class:`~editscope.registry.Registry`). Sequential state (AlphaEdit's keys, PRUNE's ΔW,
UltraEdit's normaliser) is ``editor.new_state()``, owned by the caller; nothing is kept in module state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from editscope.data.records import EditRequest
from editscope.edit import (
    alphaedit,
    evk_edit,
    ft,
    grace,
    ike,
    kn,
    memit,
    prompt,
    prune,
    rect,
    retrieval,
    rome,
    ultraedit,
    wise,
)
from editscope.edit.context import key_statistics
from editscope.edit.context_edit import ContextStore
from editscope.edit.hparams import HParams, load_yaml, resolve_hparams, shipped_hparams_path
from editscope.edit.intervention import KINDS, StoredEdit, in_force
from editscope.edit.mend import core as mend
from editscope.edit.mend.train import prepare as mend_prepare
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.patch import Patch, tensor_checksum
from editscope.edit.plugins import Plugin, PluginLike, attach, combined_label
from editscope.edit.runtime import EditRuntime
from editscope.edit.state import EditState, NoState
from editscope.errors import EditscopeError
from editscope.finite import walk
from editscope.lm.archs import ARCHS
from editscope.lm.engine import ScoringEngine
from editscope.lm.loading import Bundle, registry_name_of
from editscope.progress import report
from editscope.registry import Registry


class ComputeFn(Protocol):
    """``compute(bundle, requests, hp, state, *, engine, runtime, extra_terms[, presolved]) -> (deltas, info)``: ΔW per
    parameter (stored orientation) and diagnostics; the model is unchanged on return. ``runtime`` says how to
    compute (forward strategy, request batching, template cache: :class:`~editscope.edit.runtime.EditRuntime`).
    ``extra_terms`` (the attached plug-ins' terms) are added to the editor's loss; editors that do not optimise
    never receive any. ``presolved`` is the result of the editor's declared :class:`PresolveFn` (only passed when
    it declares one)."""

    def __call__(self, bundle: Bundle, requests: list[EditRequest], hp: HParams, state: EditState, *,
                 engine: ScoringEngine, runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()
                 ) -> tuple[dict[str, torch.Tensor], dict]: ...


class PresolveFn(Protocol):
    """``presolve(bundle, hp, state) -> presolved``: what an edit computes once before its solve, from the unedited
    model and the caller's state (the key statistics C per layer of ROME/MEMIT, AlphaEdit's null-space projectors).
    :meth:`Editor.compute_patch` passes the result to ``compute`` as ``presolved=``; ``state`` is only read."""

    def __call__(self, bundle: Bundle, hp: HParams, state: EditState) -> Any: ...


class ReinstateFn(Protocol):
    """``reinstate(bundle, hp, state) -> intervention``: the memory or context edit that puts everything ``state``
    holds on the model (a resumed lifelong chain restores its store, then this)."""

    def __call__(self, bundle: Bundle, hp: HParams, state: EditState) -> Any: ...


class PrepareFn(Protocol):
    """``prepare(bundle, hparams, log, *, progress)``: what edits with each of ``hparams`` need done once before
    them (MEND: training its editor networks to every ``steps`` asked); ``log`` receives progress lines."""

    def __call__(self, bundle: Bundle, hparams: Sequence[HParams], log: Callable[[str], None], *,
                 progress: bool = True) -> None: ...


@dataclass(frozen=True)
class Editor:
    """The declared contract of an editing method (see the module docstring).

    ``writes`` is the per-layer part (an :class:`~editscope.lm.archs.ArchMap` field) whose weight is edited at
    each of ``hp.layers``; ``optimises`` says the method minimises a sum of objective terms, so plug-ins
    apply; ``state_class`` is its sequential state (:class:`NoState` when edits are independent);
    ``needs_linear_residual`` says its ΔW's output must add linearly to the residual stream (MEMIT's residual
    spread and the solves built on it): an architecture whose map declares an ``mlp_post_norm`` (Gemma 3
    normalises the MLP output before adding it) is refused; ROME and FT target the MLP module output itself
    (before that norm). ``families`` optionally restricts the architecture families further (None: all).
    ``prepare`` is the training the editor needs before an edit (:class:`PrepareFn`; None: none): ``editscope
    tune`` runs it for every candidate's hparams before its search, so candidates that differ in training length
    compare trained editors. An ordinary run does not: a missing trained editor is an error naming the command.
    ``presolve`` is what an edit computes once before its solve (:class:`PresolveFn`; None: nothing, and
    ``compute`` is called without ``presolved``).

    ``kind`` is what an edit leaves on the model (:data:`~editscope.edit.intervention.KINDS`): ``weights`` (the
    default: ``compute`` returns ΔW per parameter and the edit is a :class:`Patch`), ``memory`` or ``context``
    (``compute`` returns the :class:`~editscope.edit.intervention.StoredEdit` itself, which supersedes the edit of
    the same method in force; ``reinstate`` rebuilds it from the sequential state for a resumed chain).

    ``cost`` names the memory and time model ``editscope plan`` uses for its edits (a key of
    :data:`editscope.edit.budget.COST_MODELS`: ``rome``, ``memit``, ``alphaedit``, ``ft``, ``kn``, ``mend``,
    ``ultraedit``); None: ``plan`` says it has no plan for the editor rather than give another editor's.
    """

    name: str
    label: str
    hparams_class: type[HParams]
    compute: ComputeFn
    optimises: bool
    writes: str = "mlp_out"
    state_class: type[EditState] = NoState
    needs_linear_residual: bool = False
    families: frozenset[str] | None = None
    prepare: PrepareFn | None = None
    presolve: PresolveFn | None = None
    kind: str = "weights"
    reinstate: ReinstateFn | None = None
    cost: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise EditscopeError(f"editor {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind != "weights" and (self.reinstate is None or self.state_class is NoState):
            raise EditscopeError(f"editor {self.name}: a {self.kind} editor keeps its store in a sequential state and "
                                 "declares how to reinstate it")

    # -- declarations read by the runner and the CLI -------------------------------------------------------
    @property
    def sequential(self) -> bool:
        """Whether edits carry state from one to the next."""
        return self.state_class is not NoState

    def new_state(self) -> EditState:
        return self.state_class()

    def param_names(self, bundle: Bundle, hp: HParams) -> list[str]:
        """Names of the parameters an edit with ``hp`` writes (none for a memory or context editor)."""
        if self.kind != "weights":
            return []
        written = hp.written()
        if written is None:
            return [bundle.arch.weight_name(layer, self.writes) for layer in hp.layers]
        return [bundle.arch.weight_name(layer, bundle.arch.matrix_part(m)) for layer, m in written]

    def stats_layers(self, hp: HParams) -> list[int]:
        """Layers whose key statistics an edit with ``hp`` reads (computed up front by the runner)."""
        return hp.stats_layers()

    def stats_tokens(self, hp: HParams) -> int:
        """Token budget of those statistics."""
        return hp.stats_tokens()

    def stats_dtype(self, hp: HParams) -> str:
        """Precision of those statistics (``float64`` or ``float32``)."""
        return hp.stats_dtype()

    def supports(self, family: str) -> bool:
        """Whether the editor supports the architecture family (a key of :data:`editscope.lm.archs.ARCHS`)."""
        return self.unsupported_because(family) is None

    def unsupported_because(self, family: str) -> str | None:
        """Why the editor refuses the architecture family, in words; None when it supports it."""
        arch = ARCHS.get(family, None)
        if arch is None:
            return "unknown architecture family"
        if self.needs_linear_residual and arch.mlp_post_norm is not None:
            return (f"it assumes the MLP output adds linearly to the residual stream, and {family} normalises it "
                    f"first ({arch.mlp_post_norm})")
        if self.families is not None and family not in self.families:
            return f"it is declared for {', '.join(sorted(self.families))} only"
        return None

    def check_model(self, bundle: Bundle) -> None:
        """A clear error, before any work, when the model's family is not supported."""
        why = self.unsupported_because(bundle.arch.family)
        if why is not None:
            raise EditscopeError(
                f"{self.name} does not support the {bundle.arch.family!r} architecture of {bundle.name} "
                f"(supported: {', '.join(f for f in sorted(ARCHS) if self.supports(f))}); {why}")

    def attach(self, plugins: Sequence[PluginLike], where: str = "plugins") -> list[Plugin]:
        """Validated plug-ins for this editor; an error when there are any and the editor does not optimise."""
        attached = attach(plugins, where)
        if attached and not self.optimises:
            raise EditscopeError(f"{where}: {self.name} does not optimise a loss, so plug-ins "
                                 f"({', '.join(p.name for p in attached)}) cannot be attached to it")
        return attached

    def display(self, plugins: Sequence[Plugin] = ()) -> str:
        """How results and tables name this editor with plug-ins (``ROME+APP``)."""
        return combined_label(self.label, plugins)

    def load_hparams(self, model: str | Bundle, path: str | Path | None = None,
                     overrides: dict | None = None, overrides_label: str = "--set") -> HParams:
        """Hyperparameters from ``path`` or ``configs/hparams/{method}/{model}.yaml``, validated (a bad override
        is named as ``{overrides_label} key=value``)."""
        n_layers = model.n_layers if isinstance(model, Bundle) else None
        model_name = model.name if isinstance(model, Bundle) else model
        if isinstance(model, Bundle):
            self.check_model(model)
        if path is None:  # shipped file, else derived from the architecture (warns), else an error naming --hparams
            arch = (model.arch.family, model.n_layers) if isinstance(model, Bundle) else None
            if isinstance(model, Bundle) and shipped_hparams_path(self.name, model_name) is None:
                # a local folder holding a registry model's weights (same fingerprint) gets that model's hparams
                model_name = registry_name_of(model.base_fingerprint) or model_name
            hp = resolve_hparams(self.name, self.hparams_class, model_name, arch, overrides, overrides_label)
        else:
            hp = load_yaml(path, self.hparams_class, overrides, n_layers, overrides_label)
        if isinstance(model, Bundle):
            self.param_names(model, hp)  # a matrix the family lacks (``modules: [gate]`` on GPT-2) fails before work
        return hp

    def apply(self, bundle: Bundle, requests: Sequence[EditRequest] | EditRequest, hparams: HParams | None = None,
              state: EditState | None = None, *, engine: ScoringEngine | None = None,
              runtime: EditRuntime | None = None, plugins: Sequence[PluginLike] = ()) -> Patch | StoredEdit:
        """Edit ``bundle.model`` in place and return the patch (``patch.revert(bundle)`` undoes it exactly).
        ``plugins``: names, ``(name, {hparam: value})`` pairs, :class:`PluginSpec` or :class:`Plugin` objects.
        ``runtime``: how to compute (None: the defaults, :meth:`EditRuntime.from_settings`); pass the same one to
        a sequence of edits so they share its template cache."""
        patch, update = self.compute_edit(bundle, requests, hparams, state, engine=engine, runtime=runtime,
                                          plugins=plugins)
        if self.kind != "weights":  # the store after this edit replaces the one in force
            patch.superseded = in_force(bundle, self.name)
        patch.apply(bundle, check=False)
        if state is not None:  # only now: a refused edit leaves the caller's state as it was
            state.commit(update)
        return patch

    def compute_patch(self, bundle: Bundle, requests: Sequence[EditRequest] | EditRequest,
                      hparams: HParams | None = None, state: EditState | None = None, *,
                      engine: ScoringEngine | None = None, runtime: EditRuntime | None = None,
                      plugins: Sequence[PluginLike] = ()) -> Patch | StoredEdit:
        """The patch (or memory or context edit) of an edit without applying it (the model and ``state`` are
        unchanged on return)."""
        return self.compute_edit(bundle, requests, hparams, state, engine=engine, runtime=runtime,
                                 plugins=plugins)[0]

    def compute_edit(self, bundle: Bundle, requests: Sequence[EditRequest] | EditRequest,
                     hparams: HParams | None = None, state: EditState | None = None, *,
                     engine: ScoringEngine | None = None, runtime: EditRuntime | None = None,
                     plugins: Sequence[PluginLike] = ()) -> tuple[Patch | StoredEdit, EditState]:
        """The patch of an edit and the state after it (the state update: a :meth:`EditState.fork` of ``state``
        that ``compute`` changed), neither applied; raises before returning when the edit is refused."""
        if isinstance(requests, EditRequest):
            requests = [requests]
        if not requests:
            raise EditscopeError("no edit requests")
        self.check_model(bundle)
        attached = self.attach(plugins)
        hp = hparams if hparams is not None else self.load_hparams(bundle)
        if not isinstance(hp, self.hparams_class):
            raise EditscopeError(f"{self.name}: hparams of type {type(hp).__name__}, expected "
                                 f"{self.hparams_class.__name__}")
        hp.check(f"<{self.name} hparams>", bundle.n_layers)
        state = state if state is not None else self.new_state()
        if not isinstance(state, self.state_class):
            raise EditscopeError(f"{self.name}: state of type {type(state).__name__}, expected "
                                 f"{self.state_class.__name__}")
        engine = engine or ScoringEngine(bundle)
        runtime = runtime or EditRuntime.from_settings()
        params = dict(bundle.model.named_parameters())
        t0 = time.perf_counter()
        report(f"{self.name}: editing {len(requests)} fact(s)")
        presolved = {} if self.presolve is None else {"presolved": self.presolve(bundle, hp, state)}
        update = state.fork()
        deltas, info = self.compute(bundle, list(requests), hp, update, engine=engine, runtime=runtime,
                                    extra_terms=[p.term() for p in attached], **presolved)
        info["runtime"] = runtime.settings.recorded()
        info["seconds"] = time.perf_counter() - t0
        if self.kind != "weights":  # compute returned the memory or context edit itself
            deltas.info.update(info, kind=self.kind)
            return deltas, update
        _check_finite(self.name, requests, deltas, info)
        unexpected = set(deltas) - set(self.param_names(bundle, hp))
        if unexpected:  # the declaration is what the runner and reports rely on
            raise EditscopeError(f"{self.name} wrote undeclared parameters {sorted(unexpected)} (bug: please report)")
        if attached:
            info["plugins"] = [p.to_dict() for p in attached]
        patch = Patch(
            deltas=deltas,
            method=self.name,
            hparams=hp.to_dict(),
            fingerprint=bundle.fingerprint,
            checksums={name: tensor_checksum(params[name]) for name in deltas},
            model_name=bundle.name,
            requests=[dict(prompt=r.prompt, subject=r.subject, target_new=r.target_new, target_true=r.target_true)
                      for r in requests],
            info=info,
            bases={name: params[name].detach().clone() for name in deltas},
        )
        return patch, update


def _non_finite(values: Any) -> list[str]:
    """Names of the tensors in ``values`` (a tensor, or lists/mappings of them) holding NaN or ±inf: each tensor is
    one leaf of :func:`editscope.finite.walk`, named with dots throughout (``v_star.0``)."""
    bad: list[str] = []

    def leaf(name: str, item: Any) -> Any:
        if isinstance(item, torch.Tensor) and not bool(torch.isfinite(item).all()):
            bad.append(name)
        return item

    walk(values, leaf, plain=False, join=lambda path, key: f"{path}.{key}" if path else str(key))
    return bad


def _check_finite(method: str, requests: Sequence[EditRequest], deltas: dict, info: dict) -> None:
    """An edit whose ΔW or vectors (v*, k*...) hold NaN/inf is refused before anything is applied or saved (and
    before a sequential state takes the edit's update)."""
    bad = _non_finite(deltas) + _non_finite(info.get("vectors", {}))
    if bad:
        shown = "; ".join(f"{r.subject!r} -> {r.target_new!r}" for r in requests[:3])
        more = f" (+{len(requests) - 3} more)" if len(requests) > 3 else ""
        raise EditscopeError(f"{method}: the edit of {shown}{more} produced non-finite values in "
                             f"{', '.join(bad[:4])}; nothing was applied (check the hparams: a learning rate too "
                             "large, a zero or tiny regularizer)")


EDITORS: Registry[Editor] = Registry("edit method", expected=Editor, name_of=lambda e: e.name,
                                     describe=lambda e: e.label)
"""Name -> :class:`Editor` of every known editing method (add one with :func:`register_editor`)."""


def register_editor(editor: Editor, *, aliases: Sequence[str] = (), replace: bool = False,
                    description: str | None = None) -> Editor:
    """Add an editor to :data:`EDITORS` under ``editor.name`` (tests and user extensions; a taken name is an
    error unless ``replace``)."""
    return EDITORS.register(editor, aliases=aliases, replace=replace, description=description)


def get_editor(method: str) -> Editor:
    """The editor named ``method`` (an error listing the available ones when unknown)."""
    return EDITORS.get(method)


for _editor in (
    Editor("rome", "ROME", rome.RomeHParams, rome.compute, optimises=True, presolve=key_statistics, cost="rome"),
    Editor("memit", "MEMIT", memit.MemitHParams, memit.compute, optimises=True,
           needs_linear_residual=True, presolve=key_statistics, cost="memit"),
    Editor("alphaedit", "AlphaEdit", alphaedit.AlphaEditHParams, alphaedit.compute, optimises=True,
           state_class=alphaedit.AlphaEditState, needs_linear_residual=True, presolve=alphaedit.presolve,
           cost="alphaedit"),
    Editor("prune", "PRUNE", prune.PruneHParams, prune.compute, optimises=True, state_class=prune.PruneState,
           needs_linear_residual=True, presolve=key_statistics, cost="memit"),
    Editor("rect", "RECT", rect.RectHParams, rect.compute, optimises=True, needs_linear_residual=True,
           presolve=key_statistics, cost="memit"),
    Editor("ft", "FT-L", ft.FTHParams, ft.compute, optimises=True, cost="ft"),
    Editor("evk_edit", "EVK-Edit", evk_edit.EvkEditHParams, evk_edit.compute, optimises=True,
           state_class=alphaedit.AlphaEditState, needs_linear_residual=True, presolve=alphaedit.presolve,
           cost="alphaedit"),
    Editor("kn", "KN", kn.KNHParams, kn.compute, optimises=False, cost="kn"),
    Editor("mend", "MEND", mend.MendHParams, mend.compute, optimises=True,  # its editing loss takes terms
           prepare=mend_prepare, cost="mend"),
    # one gradient and one solve per turn, no optimised loss; its lifelong normaliser is the sequential state
    Editor("ultraedit", "UltraEdit", ultraedit.UltraEditHParams, ultraedit.compute, optimises=False,
           state_class=ultraedit.UltraEditState, cost="ultraedit"),
    # a memory editor: a codebook beside one layer; the codebook is the sequential state
    Editor("grace", "GRACE", grace.GraceHParams, grace.compute, optimises=False, writes="",
           state_class=grace.GraceCodebook, kind="memory", reinstate=lambda b, hp, s: grace.edit_of(b, [], hp, s),
           cost="grace"),
    # a memory editor: side copies of one layer's weight and a router; the side memories are the sequential state
    Editor("wise", "WISE", wise.WiseHParams, wise.compute, optimises=False, writes="",
           state_class=wise.WiseMemory, kind="memory", reinstate=lambda b, hp, s: wise.edit_of(b, [], hp, s),
           cost="wise"),
    # context editors: the facts live in the text before each prompt; the store is the sequential state
    Editor("prompt", "PROMPT", prompt.PromptHParams, prompt.compute, optimises=False, writes="",
           state_class=ContextStore, kind="context", reinstate=lambda b, hp, s: prompt.edit_of(b, [], hp, s),
           cost="context"),
    Editor("ike", "IKE", ike.IkeHParams, ike.compute, optimises=False, writes="", state_class=ContextStore,
           kind="context", reinstate=lambda b, hp, s: ike.edit_of(b, [], hp, s), cost="context"),
    Editor("retrieval", "Retrieval", retrieval.RetrievalHParams, retrieval.compute, optimises=False, writes="",
           state_class=ContextStore, kind="context", reinstate=lambda b, hp, s: retrieval.edit_of(b, [], hp, s),
           cost="context"),
):
    register_editor(_editor)


def apply(bundle: Bundle, method: str, requests: Sequence[EditRequest] | EditRequest,
          hparams: HParams | None = None, state: EditState | None = None, **kwargs) -> Patch:
    """Edit with ``method`` (see :meth:`Editor.apply`)."""
    return get_editor(method).apply(bundle, requests, hparams, state, **kwargs)


@contextmanager
def edited(bundle: Bundle, method: str, requests: Sequence[EditRequest] | EditRequest,
           hparams: HParams | None = None, state: EditState | None = None, **kwargs) -> Iterator[Patch]:
    """Apply an edit for the duration of the block; the weights are restored bit-exactly on exit (also on
    error)."""
    patch = apply(bundle, method, requests, hparams, state, **kwargs)
    try:
        yield patch
    finally:
        patch.revert(bundle)
