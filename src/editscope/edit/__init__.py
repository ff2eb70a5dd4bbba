"""Editors (ROME, MEMIT, AlphaEdit, PRUNE, RECT, EVK-Edit, FT, KN, MEND, UltraEdit), their patches, hyperparameters
and objectives."""

from editscope.edit.hparams import HParams, VStarHParams, load_yaml, parse_overrides
from editscope.edit.objective import EssenceKL, NormPenalty, ObjectiveTerm, TargetNLL, VContext, VStep
from editscope.edit.patch import Patch
from editscope.edit.plugins import PLUGINS, Plugin, PluginHParams, PluginSpec, register_plugin
from editscope.edit.registry import EDITORS, Editor, apply, edited, get_editor, register_editor
from editscope.edit.runtime import EditRuntime, RuntimeSettings
from editscope.edit.session import EditSession
from editscope.edit.state import EditState, NoState

__all__ = [
    "EDITORS",
    "PLUGINS",
    "EditRuntime",
    "RuntimeSettings",
    "EditSession",
    "EditState",
    "Editor",
    "EssenceKL",
    "HParams",
    "NoState",
    "NormPenalty",
    "ObjectiveTerm",
    "Patch",
    "Plugin",
    "PluginHParams",
    "PluginSpec",
    "TargetNLL",
    "VContext",
    "VStarHParams",
    "VStep",
    "apply",
    "edited",
    "get_editor",
    "load_yaml",
    "parse_overrides",
    "register_editor",
    "register_plugin",
]
