"""Editors (ROME, MEMIT, AlphaEdit, PRUNE, RECT, EVK-Edit, FT, KN, MEND, UltraEdit), their patches, hyperparameters
and objectives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from editscope.lazy import lazy_exports

#: public name -> the module that defines it (loaded on first use, PEP 562: a plan or a config check reads the
#: hparams and budget modules without loading every editor, torch and transformers)
_WHERE = {
    "HParams": "editscope.edit.hparams",
    "VStarHParams": "editscope.edit.hparams",
    "load_yaml": "editscope.edit.hparams",
    "parse_overrides": "editscope.edit.hparams",
    "EssenceKL": "editscope.edit.objective",
    "NormPenalty": "editscope.edit.objective",
    "ObjectiveTerm": "editscope.edit.objective",
    "TargetNLL": "editscope.edit.objective",
    "VContext": "editscope.edit.objective",
    "VStep": "editscope.edit.objective",
    "Patch": "editscope.edit.patch",
    "PLUGINS": "editscope.edit.plugins",
    "Plugin": "editscope.edit.plugins",
    "PluginHParams": "editscope.edit.plugins",
    "PluginSpec": "editscope.edit.plugins",
    "register_plugin": "editscope.edit.plugins",
    "EDITORS": "editscope.edit.registry",
    "Editor": "editscope.edit.registry",
    "apply": "editscope.edit.registry",
    "edited": "editscope.edit.registry",
    "get_editor": "editscope.edit.registry",
    "register_editor": "editscope.edit.registry",
    "EditRuntime": "editscope.edit.runtime",
    "RuntimeSettings": "editscope.edit.runtime",
    "EditSession": "editscope.edit.session",
    "EditState": "editscope.edit.state",
    "NoState": "editscope.edit.state",
}

if TYPE_CHECKING:
    from editscope.edit.hparams import HParams, VStarHParams, load_yaml, parse_overrides
    from editscope.edit.objective import EssenceKL, NormPenalty, ObjectiveTerm, TargetNLL, VContext, VStep
    from editscope.edit.patch import Patch
    from editscope.edit.plugins import PLUGINS, Plugin, PluginHParams, PluginSpec, register_plugin
    from editscope.edit.registry import EDITORS, Editor, apply, edited, get_editor, register_editor
    from editscope.edit.runtime import EditRuntime, RuntimeSettings
    from editscope.edit.session import EditSession
    from editscope.edit.state import EditState, NoState


__getattr__ = lazy_exports(__name__, _WHERE)

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
