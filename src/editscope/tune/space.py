"""The search space: the knobs an editor and its plug-ins declare (``TUNABLE`` on their hparams classes), their
grids, and the candidate layers (from the causal-trace layer curve of facts the model knows, the published
relative depth and a small neighbourhood)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from editscope.edit.hparams import TUNE_LAYERS, derived_layers
from editscope.edit.registry import get_editor
from editscope.errors import EditscopeError


@dataclass(frozen=True)
class Candidate:
    """One point of the grid: editor hparams overrides and, per attached plug-in, its hparams overrides."""

    hparams: tuple[tuple[str, Any], ...]
    plugins: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    @property
    def id(self) -> str:
        """A short stable name (also the candidate's run directory under ``candidates/``)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return "c-" + hashlib.blake2b(text.encode(), digest_size=4).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"hparams": dict(self.hparams), "plugins": {name: dict(kv) for name, kv in self.plugins}}

    def label(self) -> str:
        """``layers=[4] v_lr=0.5 app.alpha=0.2``: what the candidate sets."""
        parts = [f"{k}={_short(v)}" for k, v in self.hparams]
        parts += [f"{p}.{k}={_short(v)}" for p, kv in self.plugins for k, v in kv]
        return " ".join(parts) or "(base)"


def _short(value: Any) -> str:
    return json.dumps(value).replace(" ", "") if isinstance(value, list) else f"{value:g}" \
        if isinstance(value, float) else str(value)


def layer_candidates(method: str, family: str, n_layers: int, curve: Sequence[float] | None, current: list[int],
                     neighbourhood: int = 1) -> tuple[list[list[int]], dict[str, Any]]:
    """Candidate ``layers`` values and how they were found. A single-layer method (``current`` has one layer):
    the curve's peak past layer 0 (layer 0's MLP effect is an embedding artefact: restoring it restores the
    corrupted subject embedding itself), the layer at the published relative depth, the current layer, and each
    ±``neighbourhood``. A window method: windows of the current width placed at the published position, centred
    on the peak, and the current one, each shifted by ±``neighbourhood``."""
    derived = derived_layers(get_editor(method).hparams_class, family, n_layers)
    published = derived[0] if derived else None
    peak = None
    if curve is not None and len(curve) > 1 and np.isfinite(np.asarray(curve[1:], dtype=float)).any():
        peak = 1 + int(np.nanargmax(np.asarray(curve[1:], dtype=float)))
    width = len(current)
    anchors: list[int] = []
    if width == 1:
        anchors = [x for x in (peak, published[0] if published else None, current[0]) if x is not None]
        starts = anchors
    else:
        starts = [current[0]]
        if published:
            starts.append(published[0] if len(published) == width else max(0, published[len(published) // 2]
                                                                             - width // 2))
        if peak is not None:
            starts.append(peak - width // 2)
        anchors = starts
    found: list[list[int]] = []
    for start in starts:
        for shift in range(-neighbourhood, neighbourhood + 1):
            s = min(max(0, start + shift), max(0, n_layers - width))
            layers = list(range(s, s + width))
            if layers[-1] < n_layers and layers not in found:
                found.append(layers)
    found.sort()
    why = {"peak_past_layer_0": peak, "published": published, "shipped_or_base": current,
           "neighbourhood": neighbourhood, "how": derived[1] if derived else "no published rule for this method"}
    return found, why


def parse_grid(items: Sequence[str]) -> dict[str, tuple]:
    """``["v_lr=0.1,0.5", "layers=[3];[4]", "app.alpha=0.02,0.2"]`` -> grids (values YAML-typed; ``layers``
    values separated by ``;``)."""
    from editscope import yamlio

    out: dict[str, tuple] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise EditscopeError(f"--grid {item!r}: expected KEY=V1,V2,... (layers: --grid 'layers=[3];[4,5]')")
        parts = raw.split(";") if key.strip() == "layers" else raw.split(",")
        try:
            values = tuple(yamlio.load(p) for p in parts)
        except Exception as exc:  # noqa: BLE001 (any YAML problem is the same one-line error)
            raise EditscopeError(f"--grid {item!r}: a value is not valid YAML") from exc
        if key.strip() == "layers":
            values = tuple([v] if isinstance(v, int) else v for v in values)
        out[key.strip()] = values
    return out


def knob_grids(hparams_tunable: dict[str, Any], plugin_tunable: dict[str, dict[str, Any]], *,
               knobs: Sequence[str] | None, grid: dict[str, tuple], layers: list[list[int]] | None,
               tune_editor: bool) -> dict[str, tuple]:
    """The grid of each searched knob (``key`` for the editor, ``plugin.key`` for a plug-in): the declared ones
    (by default the editor's when no plug-in is attached, else the plug-ins' only), narrowed to ``knobs`` when
    given, with ``grid`` replacing declared values and ``layers`` the causal-trace candidates."""
    declared: dict[str, Any] = dict(hparams_tunable) if tune_editor or knobs else {}
    for name, tunable in plugin_tunable.items():
        declared.update({f"{name}.{k}": v for k, v in tunable.items()})
    allowed = dict(hparams_tunable) | {f"{n}.{k}": v for n, t in plugin_tunable.items() for k, v in t.items()}
    chosen = list(knobs) if knobs else list(declared)
    for key in list(chosen) + list(grid):
        if key not in allowed:
            raise EditscopeError(f"--knobs/--grid: {key!r} is not a declared knob (declared: "
                                 f"{', '.join(allowed) or 'none'})")
    out: dict[str, tuple] = {}
    for key in chosen:
        if key in grid:
            out[key] = grid[key]
        elif allowed[key] == TUNE_LAYERS:
            if layers is None:
                raise EditscopeError("layers: no candidate layers (give --grid 'layers=[3];[4]')")
            out[key] = tuple(layers)
        else:
            out[key] = tuple(allowed[key])
    for key, values in grid.items():  # a --grid key not in --knobs is searched too
        out.setdefault(key, values)
    return out


def candidates(grids: dict[str, tuple]) -> list[Candidate]:
    """The product of the grids, in declaration order (the first knob varies slowest)."""
    keys = list(grids)
    out = []
    for values in itertools.product(*(grids[k] for k in keys)):
        editor = tuple((k, v) for k, v in zip(keys, values, strict=True) if "." not in k)
        plugins: dict[str, list[tuple[str, Any]]] = {}
        for k, v in zip(keys, values, strict=True):
            if "." in k:
                name, _, field = k.partition(".")
                plugins.setdefault(name, []).append((field, v))
        out.append(Candidate(editor, tuple((n, tuple(kv)) for n, kv in plugins.items())))
    return out


__all__ = ["Candidate", "candidates", "knob_grids", "layer_candidates", "parse_grid"]
