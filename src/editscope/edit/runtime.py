"""How edits are computed, as opposed to what is computed: the settings an editor's caller owns.

:class:`RuntimeSettings` are the settings, frozen once parsed:
- ``forward``: the forward strategy of the v*/z optimisation (:mod:`editscope.edit.objective.forward`: ``fast``,
  ``full``, ``plain``). The strategies agree to float rounding, so ΔW moves in its last bits;
- ``vstar_batch``: how many requests' v*/z share one batched forward per step (None: as many as fit the engine's
  token budget in a MEMIT-family batch edit; N: at most N, also across the cases of runner ``mode: single``,
  where N > 1 optimises a window of N cases' first requests on the unedited model together; 1: one at a time).
  Batching changes ΔW in its last bits too.

An :class:`EditRuntime` is the state of a run's edits under those settings:
- the context-template cache (prefixes generated once per model from the model as it is then, as ROME/MEMIT's
  template cache) and the open window of independent edits: state of a run, never of a scoring engine;
- ``diagnostics``: whether editors also report what costs extra time and changes no update (the condition number of
  their linear solve, ``edit_info["solve_cond"]``); the runner turns it on when a suite of the run shows such
  quantities (:attr:`~editscope.suites.base.Suite.edit_info_curves`: the ``weights`` suite). Not a setting: rows
  carry the values, and results do not depend on it.

The caller parses the settings once from config keys (run config ``runtime:``, ``editscope edit
--forward/--vstar-batch``, Python arguments); ``EDITSCOPE_FORWARD`` and ``EDITSCOPE_VSTAR_BATCH`` only supply
defaults. :meth:`RuntimeSettings.recorded` are the values in force: the runner writes them into ``run.json`` and the
config digest and refuses a resume under other values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from editscope.edit.objective.forward import FORWARDS, ForwardStrategy, forward_strategy
from editscope.errors import EditscopeError

#: the settings' defaults when neither the caller nor the environment gives one
DEFAULT_SETTINGS: dict[str, Any] = {"forward": "fast", "vstar_batch": "auto"}
#: environment variables that supply a setting's default
ENV = {"forward": "EDITSCOPE_FORWARD", "vstar_batch": "EDITSCOPE_VSTAR_BATCH"}


def parse_vstar_batch(value: Any, where: str = "vstar_batch") -> int | None:
    """``auto`` (or None) -> None; a positive integer (or its text) -> itself; anything else is an error."""
    if value is None or value == "auto":
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise EditscopeError(f"{where}: must be auto or a positive integer, got {value!r}")
    return int(text)


@dataclass(frozen=True)
class RuntimeSettings:
    """The settings in force (see the module docstring), parsed once into frozen values: a run config's
    (:attr:`editscope.run.config.RunConfig.settings`), a command's flags or a Python caller's."""

    forward: str = "fast"
    vstar_batch: int | None = None

    def __post_init__(self) -> None:
        if self.forward not in FORWARDS:
            raise EditscopeError(f"forward: must be one of {', '.join(FORWARDS)}, got {self.forward!r}")
        object.__setattr__(self, "vstar_batch", parse_vstar_batch(self.vstar_batch))

    @classmethod
    def resolve(cls, settings: Mapping[str, Any] | None = None, where: str = "runtime") -> RuntimeSettings:
        """The settings from ``settings`` (keys of :data:`DEFAULT_SETTINGS`; a missing or None one from its
        environment variable, else its default). An unknown key or a bad value is a one-line error."""
        settings = dict(settings or {})
        unknown = set(settings) - set(DEFAULT_SETTINGS)
        if unknown:
            raise EditscopeError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))} "
                                 f"(known: {', '.join(DEFAULT_SETTINGS)})")
        values = {}
        for key, default in DEFAULT_SETTINGS.items():
            value, source = settings.get(key), f"{where}.{key}"
            if value is None and os.environ.get(ENV[key]):
                value, source = os.environ[ENV[key]].strip(), ENV[key]
            values[key] = default if value is None else value
            if key == "forward" and values[key] not in FORWARDS:
                raise EditscopeError(f"{source}: must be one of {', '.join(FORWARDS)}, got {values[key]!r}")
            if key == "vstar_batch":
                values[key] = parse_vstar_batch(values[key], source)
        return cls(**values)

    @property
    def strategy(self) -> ForwardStrategy:
        return forward_strategy(self.forward)

    def recorded(self) -> dict[str, Any]:
        """The values in force, as recorded with results (``vstar_batch``: ``"auto"`` or N)."""
        return {"forward": self.forward, "vstar_batch": self.vstar_batch or "auto"}


@dataclass
class EditRuntime:
    """The state of a sequence of edits under frozen :class:`RuntimeSettings` (see the module docstring): what a
    run's edits share and nothing else: the context-template cache, the open window of independent edits, and
    whether editors report their costly diagnostics."""

    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    #: generated context templates, keyed by (model name, template spec, seed, start)
    templates: dict = field(default_factory=dict, repr=False)
    #: the window of independent edits runner ``mode: single`` opens (objective.solve.independent_edits)
    window: Any = field(default=None, repr=False)
    #: report the diagnostics that cost extra time (module docstring); fixed when the runtime is made
    diagnostics: bool = False

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None = None, where: str = "runtime") -> EditRuntime:
        """A fresh runtime under :meth:`RuntimeSettings.resolve` of ``settings``."""
        return cls(RuntimeSettings.resolve(settings, where))
