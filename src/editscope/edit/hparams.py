"""Hyperparameters per editor: dataclasses validated on load from ``configs/hparams/{method}/{model}.yaml``.

Every field has a type; a YAML file (or ``--set key=value`` override) with an unknown key, a value of the
wrong type, a number outside the key's declared range (:attr:`Params.RANGES`) or an edit layer outside the model
is an :class:`EditscopeError` naming the file, the key and, for a range, the range.
"""

from __future__ import annotations

import dataclasses
import re
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from editscope import yamlio
from editscope.errors import EditscopeError
from editscope.finite import non_finite
from editscope.lm.archs import MLP_MATRICES
from editscope.paths import configs_dir
from editscope.ranges import Range
from editscope.stats.settings import DEFAULT_STATS_DTYPE, DEFAULT_TOKEN_BUDGET, STATS_DTYPE_NAMES
from editscope.typed import typed


def config_root() -> Path:
    """The shipped ``configs/hparams`` (package data: :func:`editscope.paths.configs_dir`)."""
    return configs_dir() / "hparams"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


TUNE_LAYERS = "causal-trace"
"""The ``TUNABLE`` grid of ``layers``: candidates from the layer curve, the published depth and a neighbourhood."""

PROVENANCE_KEY = "provenance"
"""The block of an hparams file that says where its values came from (DESIGN rule 13): read for display by
:func:`read_provenance`, never as a value (:func:`load_yaml` sets it aside)."""


@dataclass
class Params:
    """Typed, validated parameters (of an editor or a plug-in): ``from_dict`` rejects an unknown key or a value
    of the wrong type with an :class:`EditscopeError` naming the key; ``check`` rejects a number outside its
    declared range; subclasses add other value checks in ``check``.

    ``RANGES`` declares, per numeric key, the interval its value must lie in (:class:`Range` notation: ``"(0, 10]"``,
    ``"[1, 10000]"``, ``"[0, inf)"``). A subclass's ``RANGES`` adds to (and for a key it names, replaces) those of
    its bases; a key whose value is None (an optional setting left unset) is not checked. The bounds reject values
    that cannot mean anything (a negative threshold, a zero step count, a positive bound too small to change a
    float32 weight: ``"(0, inf)"`` is read as ``[1.1754944e-38, inf)``, see :mod:`editscope.ranges`) or that
    overflow or run for hours (a learning rate of 1e38, a billion steps), never values a published or shipped
    configuration uses."""

    RANGES: typing.ClassVar[dict[str, str]] = {}
    #: The few knobs ``editscope tune`` searches, with their grids (DESIGN rule 11: declared, not probed). A value
    #: is a tuple of candidate values, each inside the key's range; :data:`TUNE_LAYERS` for ``layers`` means the
    #: candidates come from the causal-trace layer curve and the published relative depth
    #: (:mod:`editscope.tune.space`). A subclass's ``TUNABLE`` adds to (and for a key it names, replaces) its bases';
    #: a key mapped to ``()`` is not tuned there.
    TUNABLE: typing.ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for text in cls.__dict__.get("RANGES", {}).values():
            Range.parse(text)  # a malformed declaration fails at import, not at the first check
        ranges = cls.ranges()
        for key, grid in cls.__dict__.get("TUNABLE", {}).items():  # a bad grid fails at import too
            if grid == TUNE_LAYERS:
                continue
            if not isinstance(grid, tuple):
                raise TypeError(f"{cls.__name__}.TUNABLE[{key!r}]: expected a tuple of values or TUNE_LAYERS")
            bad = [v for v in grid if key in ranges and v not in ranges[key]]
            if bad:
                raise ValueError(f"{cls.__name__}.TUNABLE[{key!r}]: {bad[0]} is outside the range {ranges[key]}")

    @classmethod
    def tunable(cls) -> dict[str, Any]:
        """The declared knobs in force for this class (its own over its bases'; knobs mapped to ``()`` left out)."""
        merged: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("TUNABLE", {}))
        return {key: grid for key, grid in merged.items() if grid != ()}

    @classmethod
    def ranges(cls) -> dict[str, Range]:
        """Every declared range in force for this class (its own over its bases')."""
        merged: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("RANGES", {}))
        return {key: Range.parse(text) for key, text in merged.items()}

    @classmethod
    def owner(cls) -> str:
        """Who these parameters belong to, for error messages."""
        return cls.__name__

    @classmethod
    def from_dict(cls, data: dict, where: str = "<hparams>") -> typing.Self:
        if not isinstance(data, dict):
            raise EditscopeError(f"{where}: expected a mapping of hyperparameters, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            if key not in names:
                raise EditscopeError(f"{where}: key {key!r}: unknown hyperparameter for {cls.owner()} "
                                     f"(known: {', '.join(sorted(names)) or 'none'})")
            if not typed(value, hints[key]):
                raise EditscopeError(f"{where}: key {key!r}: expected {_type_name(hints[key])}, got {value!r}")
            bad = next(non_finite(value, key), None)
            if bad:  # YAML's .nan / .inf are floats: no step size, weight or threshold may be one
                raise EditscopeError(f"{where}: key {bad[0]!r}: must be a finite number, got {bad[1]}")
        data = cls.implied(data)
        hp = cls(**{k: (float(v) if hints[k] is float else v) for k, v in data.items()})
        hp.check(where)
        return hp

    @classmethod
    def implied(cls, data: dict) -> dict:
        """``data`` with the keys its other keys imply filled in where it leaves them out (none by default)."""
        return data

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        """Value checks: every key with a declared range (:attr:`RANGES`) lies in it."""
        for key, rng in self.ranges().items():
            value = getattr(self, key)
            if value is not None and value not in rng:
                raise EditscopeError(f"{where}: key {key!r}: must be in {rng}, got {value}{rng.why(value)}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> typing.Self:
        data = self.to_dict()
        data.update(changes)
        return type(self).from_dict(data, "<replace>")


@dataclass
class HParams(Params):
    """Base of every editor's hyperparameters: the edited layers. ``stats_layers``/``stats_tokens`` declare the
    key statistics (:mod:`editscope.stats`) the editor will read, so a runner can compute them up front."""

    method: typing.ClassVar[str] = ""
    #: True for an editor that writes no layer (a context editor): with no shipped file its defaults hold on any
    #: model, with no derived-hparams warning
    LAYERLESS: typing.ClassVar[bool] = False
    #: which published choice the layers derived for a model without a shipped file follow
    #: (:func:`derived_layers`): ROME's single layer, MEMIT's window, the editor's own published layer per family
    #: (``own``: :attr:`OWN_LAYERS`), or None (no rule: a file is needed)
    LAYER_RULE: typing.ClassVar[typing.Literal["single", "window", "own"] | None] = None
    #: with ``LAYER_RULE = "own"``: the editor's published layer per architecture family (a family without one
    #: follows ``llama``'s)
    OWN_LAYERS: typing.ClassVar[dict[str, OwnLayer]] = {}
    #: the layers ``plan`` assumes on a model with neither a file nor a rule (:func:`plan_layers`): every layer, the
    #: last three, or None (no plan without a file)
    PLAN_LAYERS: typing.ClassVar[typing.Literal["all", "last3"] | None] = None
    layers: list[int] = field(default_factory=lambda: [0])

    @classmethod
    def owner(cls) -> str:
        return cls.method or cls.__name__

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        """Value checks; with ``n_layers`` also that every edit layer exists in the model."""
        super().check(where, n_layers)
        if not self.layers:
            raise EditscopeError(f"{where}: key 'layers': at least one layer is required")
        if len(set(self.layers)) != len(self.layers) or sorted(self.layers) != list(self.layers):
            raise EditscopeError(f"{where}: key 'layers': must be increasing without repeats, got {self.layers}")
        if n_layers is not None:
            bad = [layer for layer in self.layers if not 0 <= layer < n_layers]
            if bad:
                raise EditscopeError(f"{where}: key 'layers': layer {bad[0]} out of range 0..{n_layers - 1}")

    def stats_layers(self) -> list[int]:
        """Layers whose key second moment the editor reads (none by default)."""
        return []

    def stats_tokens(self) -> int:
        """Token budget of those statistics."""
        return DEFAULT_TOKEN_BUDGET

    def stats_dtype(self) -> str:
        """Precision the statistics are summed and held in (:data:`~editscope.stats.settings.STATS_DTYPE_NAMES`)."""
        return DEFAULT_STATS_DTYPE

    def protocol(self) -> dict[str, str]:
        """The named conventions these hparams compute under (recorded with every result; none by default)."""
        return {}

    def matrices(self) -> list[str] | None:
        """The MLP matrices an edit writes (keys of :data:`editscope.lm.archs.MLP_MATRICES`), for an editor with a
        ``modules`` key; None: the one its registration declares (``Editor.writes``), at each of ``layers``."""
        return None

    def written(self) -> list[tuple[int, str]] | None:
        """Every (layer, MLP matrix) an edit writes, layer by layer, for an editor with a ``modules`` key
        (:func:`module_targets`); None: its registration's matrix at each of ``layers``."""
        return None


#: What an editor with a ``modules`` key writes unless told otherwise: the MLP's output projection at each layer.
DEFAULT_MODULES = ("down",)

Modules = list[str] | dict[str, list[int]]
"""An editor's ``modules`` key: the MLP matrices written at each of its ``layers`` (``[gate, up]``), or each matrix
with a layer set of its own (``{gate: [11, 12], up: [18, 19]}``: the reference's LLaMA-3 choice edits gate and up in
different blocks), ``layers`` then being their union (filled in when left out: :func:`implied_layers`)."""


def default_modules() -> list[str]:
    return list(DEFAULT_MODULES)


def implied_layers(data: dict) -> dict:
    """``data`` with ``layers`` = the union of the per-matrix layer sets of its ``modules`` mapping, where the
    mapping is given and ``layers`` is not."""
    modules = data.get("modules")
    if isinstance(modules, dict) and "layers" not in data and all(isinstance(v, list) for v in modules.values()):
        return {**data, "layers": sorted({layer for layers in modules.values() for layer in layers})}
    return data


def check_modules(modules: Modules, layers: list[int], where: str) -> None:
    """``modules`` names MLP matrices (gate, up, down), at least one, none twice; a mapping gives each a non-empty
    layer set, increasing, whose union is ``layers``. One line naming the key otherwise (a matrix the model's family
    lacks is refused when the edit meets the model; a layer it lacks by the ``layers`` check)."""
    names = list(modules)
    if not names:
        raise EditscopeError(f"{where}: key 'modules': at least one of {', '.join(MLP_MATRICES)} is required")
    bad = [m for m in names if m not in MLP_MATRICES]
    if bad:
        raise EditscopeError(f"{where}: key 'modules': {bad[0]!r} is not one of {', '.join(MLP_MATRICES)}")
    if len(set(names)) != len(names):
        raise EditscopeError(f"{where}: key 'modules': a matrix is named twice in {modules}")
    if not isinstance(modules, dict):
        return
    for name, own in modules.items():
        if not own or sorted(set(own)) != list(own):
            raise EditscopeError(f"{where}: key 'modules.{name}': its layers must be increasing without repeats, at "
                                 f"least one, got {own}")
    union = sorted({layer for own in modules.values() for layer in own})
    if list(layers) != union:
        raise EditscopeError(f"{where}: key 'layers': with a layer set per matrix in 'modules' it is their union "
                             f"{union} (or leave it out), got {layers}")


def module_targets(modules: Modules, layers: list[int]) -> list[tuple[int, str]]:
    """Every (layer, matrix) ``modules`` writes, layer by layer, matrices in their given order."""
    if isinstance(modules, dict):
        return [(layer, m) for layer in layers for m, own in modules.items() if layer in own]
    return [(layer, m) for layer in layers for m in modules]


def without_default_modules(data: dict) -> dict:
    """``data`` without its ``modules`` key while it holds the default (what rows and patches made before the key
    existed recorded: they keep their bytes, and an absent key reads as the down projection)."""
    if data.get("modules") == list(DEFAULT_MODULES):
        del data["modules"]
    return data


class ModulesKey:
    """For the hparams of an editor with a ``modules`` key (FT, UltraEdit; put before :class:`HParams` in the
    bases): ``layers`` implied by a per-matrix mapping, the matrices and (layer, matrix) pairs an edit writes, and
    the key left out of the record while it holds the default."""

    modules: Modules
    layers: list[int]

    @classmethod
    def implied(cls, data: dict) -> dict:
        return implied_layers(data)

    def matrices(self) -> list[str]:
        return list(self.modules)

    def written(self) -> list[tuple[int, str]]:
        return module_targets(self.modules, self.layers)

    def to_dict(self) -> dict:
        """The fields, without ``modules`` while it holds the default (rows made before it existed keep their
        bytes)."""
        return without_default_modules(super().to_dict())  # type: ignore[misc]


#: Editor conventions (DESIGN rule 10): presets of the three switches where the reference code computes otherwise
#: than the paper's equations read literally. ``kl_at``: where the essence KL reads its distributions (``next``:
#: after "{subject} is a", ROME eq. 4; ``subject``: at the subject's last token, kmeng01/rome ``compute_v``).
#: ``update_key``: the key ROME's update is solved on (``k_star``: the template-averaged k*, eq. 2; ``bare``: the
#: bare prompt's key in the residual and denominator, ``compute_v``'s ``cur_input``). ``key_average``: how MEMIT's
#: keys are averaged over templates (``flat``: uniformly, eq. 18; ``grouped``: within each template group, then
#: across groups, kmeng01/memit ``compute_ks``).
CONVENTIONS: dict[str, dict[str, str]] = {
    "paper": {"kl_at": "next", "update_key": "k_star", "key_average": "flat"},
    "reference": {"kl_at": "subject", "update_key": "bare", "key_average": "grouped"},
}
SWITCH_VALUES: dict[str, tuple[str, ...]] = {"kl_at": ("next", "subject"), "update_key": ("k_star", "bare"),
                                             "key_average": ("flat", "grouped")}


def check_convention(hp: Any, where: str, presets: Mapping[str, Any], switches: Mapping[str, Sequence[str]]) -> None:
    """``hp.convention`` names one of ``presets`` and every switch ``hp`` sets explicitly (not None) takes one of its
    ``switches`` values: one line naming the key otherwise."""
    if hp.convention not in presets:
        raise EditscopeError(f"{where}: key 'convention': must be one of {', '.join(presets)}, got {hp.convention!r}")
    for key, allowed in switches.items():
        value = getattr(hp, key)
        if value is not None and value not in allowed:
            raise EditscopeError(f"{where}: key {key!r}: must be one of {', '.join(allowed)}, got {value!r}")


@dataclass
class VStarHParams(HParams):
    """Shared by editors that optimise a target value v* (ROME eq. 4; MEMIT eq. 16).

    ``context_templates`` is a list of ``[n_tokens, n_prefixes]``: prefixes generated by seeded top-5 sampling
    from the starts "The", "Therefore", "Because", "I", "You" (as the MEMIT reference), plus the bare prompt.
    ``mom2_tokens`` is the token budget of the key statistics (:mod:`editscope.stats`), ``mom2_dtype`` their
    precision (``float64``, or ``float32``: half the memory, C within ~1e-7 relative; docs/scale.md). ``template_start``
    (optional) is text put before each start word while sampling, not kept in the prefix: a model that needs a
    document-start token the tokenizer does not add (SmolLM2: "<|endoftext|>") samples fluent prefixes with it.

    ``convention`` names the protocol (DESIGN rule 10): ``paper`` (default) reads ROME eq. 2-4 / MEMIT eq. 16-18
    literally; ``reference`` computes as kmeng01/rome and kmeng01/memit do (essence KL at the subject's last
    token, ROME's update on the bare prompt's key, MEMIT's keys averaged per template group). It is a preset of
    the switches ``kl_at``, ``update_key`` and ``key_average`` (:data:`CONVENTIONS`); a switch given explicitly
    overrides the preset. :meth:`protocol` gives the values in force (recorded in every results row).
    """

    v_lr: float = 0.5
    v_steps: int = 20
    v_weight_decay: float = 0.5
    clamp_norm_factor: float = 4.0
    kl_factor: float = 0.0625
    stop_loss: float = 0.05
    context_templates: list[list[int]] = field(default_factory=lambda: [[10, 5]])
    template_seed: int = 0
    mom2_tokens: int = DEFAULT_TOKEN_BUDGET
    mom2_dtype: str = DEFAULT_STATS_DTYPE
    template_start: str | None = None
    convention: str = "paper"
    kl_at: str | None = None
    update_key: str | None = None
    key_average: str | None = None

    #: v_lr/v_steps: Adam on v* (shipped 0.1-0.5, 5-25 steps); clamp_norm_factor: ‖δ‖ ≤ c·‖v₀‖ (0.75-4; large =
    #: no clamp); kl_factor/v_weight_decay: loss-term weights (0 = term off); stop_loss: the early-stop loss (0 =
    #: never stop early); mom2_tokens: the statistics' token budget.
    RANGES = {"v_lr": "(0, 10]", "v_steps": "[1, 10000]", "v_weight_decay": "[0, 1e6]",
              "clamp_norm_factor": "(0, 1e6]", "kl_factor": "[0, 1e6]", "stop_loss": "[0, 1e6]",
              "template_seed": "[0, 1e18]", "mom2_tokens": "[1, 1e12]"}
    #: the knobs the v* papers and their reproductions move per model (ROME §3, MEMIT appendix B)
    TUNABLE = {"layers": TUNE_LAYERS, "v_lr": (0.1, 0.5), "clamp_norm_factor": (0.75, 4.0),
               "kl_factor": (0.0625, 0.25)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        check_convention(self, where, CONVENTIONS, SWITCH_VALUES)
        if self.mom2_dtype not in STATS_DTYPE_NAMES:
            raise EditscopeError(f"{where}: key 'mom2_dtype': must be one of {', '.join(STATS_DTYPE_NAMES)}, "
                                 f"got {self.mom2_dtype!r}")
        for spec in self.context_templates:
            if len(spec) != 2 or min(spec) < 1:
                raise EditscopeError(f"{where}: key 'context_templates': entries are [n_tokens, n_prefixes] >= 1, "
                                     f"got {spec}")

    def stats_layers(self) -> list[int]:
        return list(self.layers)

    def stats_tokens(self) -> int:
        return self.mom2_tokens

    def stats_dtype(self) -> str:
        return self.mom2_dtype

    def switches(self) -> dict[str, str]:
        """The convention switches in force: the preset of ``convention``, overridden by any switch given."""
        preset = CONVENTIONS.get(self.convention, CONVENTIONS["paper"])
        return {key: getattr(self, key) or preset[key] for key in SWITCH_VALUES}

    def protocol(self) -> dict[str, str]:
        return {"convention": self.convention, **self.switches()}


def hparams_path(method: str, model: str) -> Path:
    return config_root() / method / f"{model}.yaml"


TINY_HPARAMS = "tiny"
"""The hparams file name every ``tiny-*`` test model reads when it has no file of its own."""


def shipped_hparams_path(method: str, model: str) -> Path | None:
    """The shipped hparams file of ``method`` for ``model``: ``{method}/{model}.yaml`` (``org/name`` for a hub
    id), else the file of a paper model named by hub id or folder name (:data:`editscope.lm.hub.HPARAMS_NAMES`),
    else for a tiny test model (``tiny-*``) the method's ``tiny.yaml`` (one file for every tiny model); None when
    there is none."""
    from editscope.lm.hub import hparams_name

    path = hparams_path(method, model)
    if path.is_file():
        return path
    alias = hparams_name(model)
    if alias is not None and hparams_path(method, alias).is_file():
        return hparams_path(method, alias)
    if model.startswith("tiny-") and hparams_path(method, TINY_HPARAMS).is_file():
        return hparams_path(method, TINY_HPARAMS)
    return None


# -- hparams derived from the architecture and depth -----------------------------------------


@dataclass(frozen=True)
class LayerReference:
    """The layers the original code edits on one published model of a family: ROME's single MLP layer (found by
    causal tracing, ROME §2/§3) and MEMIT's window of consecutive early-middle MLP layers (first, last)."""

    model: str
    depth: int
    single: int
    window: tuple[int, int]
    source: str


@dataclass(frozen=True)
class OwnLayer:
    """The one layer an editor's published config edits on one model: ``layer`` of ``depth``, from ``source``."""

    model: str
    depth: int
    layer: int
    source: str


#: Published layer choices per architecture family (ArchMap.family). A family without its own (gemma2, gemma3, qwen3,
#: phi3, olmo2, smollm3) uses ``llama``'s: the closest published pre-norm rotary decoder. GPT-NeoX's (Pythia's
#: family) are GPT-NeoX-20B's: ROME's layer from the ROME config in kmeng01/memit; MEMIT's window from the MEMIT config
#: for GPT-NeoX-20B in JoveReCode/OrthoEdit, a MEMIT-based repository (kmeng01/memit ships no MEMIT file for NeoX).
LAYER_REFERENCES: dict[str, LayerReference] = {
    "gpt2": LayerReference("GPT-2 XL", 48, 17, (13, 17),
                           "kmeng01/rome hparams/ROME/gpt2-xl.json, kmeng01/memit hparams/MEMIT/gpt2-xl.json"),
    "gptj": LayerReference("GPT-J 6B", 28, 5, (3, 8), "kmeng01/rome hparams/ROME/EleutherAI_gpt-j-6B.json, "
                                                      "kmeng01/memit hparams/MEMIT/EleutherAI_gpt-j-6B.json"),
    "llama": LayerReference("Llama-3-8B", 32, 5, (4, 8), "jianghoucheng/AlphaEdit hparams/ROME/Llama3-8B.json, "
                                                         "hparams/MEMIT/Llama3-8B.json"),
    "gpt_neox": LayerReference("GPT-NeoX-20B", 44, 15, (6, 10),
                               "kmeng01/memit hparams/ROME/EleutherAI_gpt-neox-20b.json, "
                               "JoveReCode/OrthoEdit hparams/MEMIT/EleutherAI_gpt-neox-20b.json"),
}
DEFAULT_REFERENCE_FAMILY = "llama"

def noting_derived(load: Callable[[], Any]) -> tuple[Any, str | None]:
    """``load()`` (hparams), its warnings shown as usual, and the :class:`DerivedHParamsWarning` message when the
    hparams were derived from the architecture (None: a shipped or given file): what an edit then reports."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hp = load()
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return hp, next((str(w.message) for w in caught if issubclass(w.category, DerivedHParamsWarning)), None)


class DerivedHParamsWarning(UserWarning):
    """Hyperparameters were derived (no shipped file for the model): says which layers and how to override."""


def scaled_layer(layer: int, ref_depth: int, n_layers: int) -> int:
    """``floor(layer · n_layers / ref_depth)``: the layer at the same relative depth. From GPT-2 XL's 17 of 48
    this gives ROME's own published choices for GPT-2 medium (8 of 24) and large (12 of 36)."""
    return layer * n_layers // ref_depth


def derived_layers(cls: type[HParams], family: str, n_layers: int) -> tuple[list[int], str] | None:
    """The edit layers of the editor whose hparams class is ``cls`` on a ``family`` model of ``n_layers`` layers,
    by proportional depth from the family's published choice (:data:`LAYER_REFERENCES`) of the class's
    ``LAYER_RULE`` (or the editor's own published layer, ``own``), with a sentence saying how; None without a rule.
    The MEMIT-based editors follow MEMIT's window
    (their original configs share MEMIT's layers); FT follows ROME's layer, as editscope's shipped FT configs do
    (the published FT configs disagree: layer 0 in ROME's FT-L, 21 in MEMIT's GPT-J FT-W and AlphaEdit's Llama-3
    FT); KN and MEND declare no rule."""
    rule = cls.LAYER_RULE
    if rule is None or n_layers < 1:
        return None
    if rule == "own":
        own = cls.OWN_LAYERS.get(family, cls.OWN_LAYERS[DEFAULT_REFERENCE_FAMILY])
        editor = (cls.method or cls.__name__).upper()
        how = (f"floor(layer * {n_layers} / {own.depth}) from {editor}'s layer {own.layer} of {own.depth} on "
               f"{own.model} ({own.source})")
        return [scaled_layer(own.layer, own.depth, n_layers)], how
    ref = LAYER_REFERENCES.get(family, LAYER_REFERENCES[DEFAULT_REFERENCE_FAMILY])
    if rule == "single":
        layers = [scaled_layer(ref.single, ref.depth, n_layers)]
        published = f"ROME's layer {ref.single} of {ref.depth} on {ref.model}"
    else:
        lo, hi = (scaled_layer(x, ref.depth, n_layers) for x in ref.window)
        layers = list(range(lo, hi + 1))
        published = f"MEMIT's layers {ref.window[0]}-{ref.window[1]} of {ref.depth} on {ref.model}"
    how = f"floor(layer * {n_layers} / {ref.depth}) from {published} ({ref.source})"
    return layers, how


def plan_layers(cls: type[HParams], n_layers: int) -> list[int] | None:
    """The layers a memory plan assumes for the editor of ``cls`` on a model of ``n_layers`` layers that has neither
    a hparams file nor a :attr:`~HParams.LAYER_RULE` (:attr:`~HParams.PLAN_LAYERS`); None: the editor declares none."""
    if cls.PLAN_LAYERS == "all":
        return list(range(n_layers))
    if cls.PLAN_LAYERS == "last3":
        return list(range(max(0, n_layers - 3), n_layers))
    return None


def _validate(cls: type[HParams], data: dict, where: str, overrides: dict | None, n_layers: int | None,
              overrides_label: str) -> HParams:
    hp = cls.from_dict(data, where)
    if not overrides:
        hp.check(where, n_layers)
        return hp
    try:
        hp = cls.from_dict({**data, **overrides}, where)
        hp.check(where, n_layers)
    except EditscopeError as exc:
        blamed = re.match(re.escape(where) + r": key '([^'.\[]+)", str(exc))
        if blamed and blamed.group(1) in overrides:
            key = blamed.group(1)
            shown = yaml.safe_dump(overrides[key], default_flow_style=True, width=200).removesuffix("...\n").strip()
            raise EditscopeError(str(exc).replace(where, f"{overrides_label} {key}={shown} (over {where})", 1)) \
                from None
        raise
    return hp


def resolve_hparams(method: str, cls: type[HParams], model: str, arch: tuple[str, int] | None = None,
                    overrides: dict | None = None, overrides_label: str = "--set") -> HParams:
    """The hparams of ``method`` for ``model`` when no file is given: the shipped file
    (:func:`shipped_hparams_path`), else defaults derived from the architecture ``arch = (family, n_layers)``
    (layers by :func:`derived_layers`, every other key ``cls``'s default) with a :class:`DerivedHParamsWarning`,
    else an error naming ``--hparams``."""
    n_layers = arch[1] if arch else None
    path = shipped_hparams_path(method, model)
    if path is not None:
        return load_yaml(path, cls, overrides, n_layers, overrides_label)
    if cls.LAYERLESS:  # nothing about it depends on the model's depth
        return _validate(cls, {}, f"<{method} hparams>", overrides, n_layers, overrides_label)
    derived = derived_layers(cls, *arch) if arch else None
    if derived is None:
        folder = config_root() / method
        have = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
        why = ("no derivation rule for this method" if arch else "the model's depth is unknown here")
        raise EditscopeError(f"no hparams for {method} on model {model!r} ({hparams_path(method, model)}; {why}); "
                             f"shipped: {', '.join(have) or 'none'}; pass --hparams FILE")
    layers, how = derived
    where = f"<{method} hparams derived for {model}>"
    hp = _validate(cls, {"layers": layers}, where, overrides, n_layers, overrides_label)
    warnings.warn(f"no shipped {method} hparams for {model!r}: derived layers {layers} by {how}; every other key "
                  f"is {method}'s default. Override with --set layers=[...] (or run config 'overrides') or pass "
                  "--hparams FILE", DerivedHParamsWarning, stacklevel=3)
    return hp


def load_yaml(path: str | Path, cls: type[HParams], overrides: dict | None = None,
              n_layers: int | None = None, overrides_label: str = "--set") -> HParams:
    """Read and validate one hparams file (``yaml.safe_load``), then apply ``overrides``. A problem with an
    overridden key names the override (``--set layers=[7]``; ``overrides_label`` says where overrides came
    from), not the file."""
    path = Path(path)
    data = read_hparams_file(path)
    provenance = data.pop(PROVENANCE_KEY, None)
    if provenance is not None and not isinstance(provenance, dict):
        raise EditscopeError(f"{path}: key {PROVENANCE_KEY!r}: expected a mapping, got {type(provenance).__name__}")
    return _validate(cls, data, str(path), overrides, n_layers, overrides_label)


def read_hparams_file(path: str | Path) -> dict:
    """The mapping an hparams file holds (its ``provenance`` block included), unvalidated; a file that is missing,
    a folder, not UTF-8, not YAML or not a mapping is one line naming it."""
    path = Path(path)
    data = yamlio.load_file(path, "hparams", "an") or {}
    if not isinstance(data, dict):
        raise EditscopeError(f"{path}: expected a mapping of hyperparameters")
    return data


def read_provenance(path: str | Path) -> dict | None:
    """The ``provenance:`` block of an hparams file (None when it has none): for display only."""
    try:
        data = yamlio.load_file(Path(path), "hparams", "an") or {}
    except (OSError, EditscopeError):
        return None
    block = data.get(PROVENANCE_KEY) if isinstance(data, dict) else None
    return block if isinstance(block, dict) else None


def parse_key_value(item: str, where: str) -> tuple[str, Any]:
    """``"key=value"`` -> (key, YAML-typed value); ``where`` names the option in errors."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise EditscopeError(f"{where}: {item!r} is not key=value")
    try:
        return key.strip(), yamlio.load(value)
    except yaml.YAMLError as exc:
        raise EditscopeError(f"{where}: value of {key.strip()!r} is not valid YAML") from exc


def parse_overrides(items: list[str] | None) -> dict:
    """``["key=value", ...]`` with YAML-typed values (``v_lr=0.1``, ``layers=[3,4]``)."""
    return dict(parse_key_value(item, f"--set {item!r}") for item in items or [])
