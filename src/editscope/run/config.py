"""Experiment configs: a YAML file (``yaml.safe_load``) validated into :class:`RunConfig`.

Schema (every key but ``model`` (or ``models``), ``methods`` and the dataset(s) is optional)::

    model: smollm2-135m          # registry name, local HF folder or hub id org/name
    models: [smollm2-135m, gemma3-270m]  # instead of model: one ordinary run per entry (each entry as model:)
                                 # into OUTPUT/<slug>/ (editscope.run.models); each entry once
    device: auto                 # cpu | cuda | cuda:N | auto (default: cuda if available, else cpu); --device wins
    dtype: float32               # float32 | bfloat16 | float16 (default float32); --dtype overrides it
    runtime:                     # how edits are computed (editscope.edit.runtime); --forward/--vstar-batch win
      forward: fast              # fast | full | plain (default: $EDITSCOPE_FORWARD, else fast)
      vstar_batch: auto          # auto | N: requests per batched v*/z forward (default: $EDITSCOPE_VSTAR_BATCH)
    seed: 0                      # seeds every edit (derived per dataset/method/group: resumable, shardable)
    output: runs/demo            # output directory (relative to the working directory)
    mode: single                 # single | {batch: N} | {sequential: N} | probe_only
                                 # | {sequential_batches: {batch: B, rounds: T, checkpoints: k, reprobe: N}}
                                 #   (checkpoints: every k-th round, or a list of rounds, e.g. [1, 2, 5, 10,
                                 #   20] for a log scale; a checkpoint probes the cases edited since the last
                                 #   one and re-probes the earlier ones: all up to N (1000), beyond a fixed
                                 #   random sample of N;
                                 #   sampled: true -> only the batch just written and that sample, at every
                                 #   checkpoint and at the end: a long stream's evaluation stays bounded;
                                 #   orders: K -> every block also in K-1 seeded permutations, each its own
                                 #   chain labelled LABEL~orderK; summaries add the spread across orders;
                                 #   threads: [1, 2] -> each order's chain once per torch thread count,
                                 #   labelled ...~threadsN: a second source of spread)
    save_patches: false          # also write each edit's patch (safetensors) under OUTPUT/patches/
    chat_template: false         # wrap prompts in the tokenizer's chat template (instruct models); --chat-template
    lm_eval:                     # sequential_batches only: lm-evaluation-harness tasks at chain checkpoints
      tasks: [my_task]           # (editscope.run.lmeval; needs pip install 'editscope[lmeval]')
      include_path: tasks/       # folder of task YAMLs, relative to this file
      checkpoints: [0, 100, 200] # edits applied; default: 0, every checkpoint round and the last round
      limit: 100                 # documents per task (lm-eval's --limit); also num_fewshot, batch_size
    methods:                     # a name, or a mapping; [none] = probe_only (pre-edit measurements only)
      - rome
      - name: memit
        label: memit-fast        # how results name it (default: name, plus "+plugin" per plug-in); unique
        hparams: hp/memit.yaml   # default configs/hparams/{name}/{model}.yaml; relative to this file
        overrides: {v_steps: 10}
        plugins:                 # loss-term plug-ins (editscope.edit.plugins), optimising editors only
          - {name: app, alpha: 0.02}   # the plug-in's name plus its hparams
          - {name: evk_align, from: tune-out/tuned.yaml}  # values editscope tune chose (relative to this file)
    plugin_modules: [my.plugins] # Python modules imported first (they register plug-ins, editors, suites...)
    datasets:                    # one block per dataset; or the keys dataset/slice/suites at top level
      - dataset: counterfact     # registered name or JSON file (relative to this file), or a mapping
                                 # {hf: NAME, split: train, name: CONFIG}: HF datasets, optional (data.hf)
        label: cf                # default: the dataset; must be unique
        slice: {offset: 0, limit: 10}
        suites: [counterfact, {name: one_to_n, options: {k: 5}}]

Every problem is an :class:`~editscope.errors.EditscopeError` naming the file and the key, e.g.
``demo.yaml: key 'methods[1].name': unknown edit method 'romee'; available: rome, memit, ...``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from editscope import yamlio
from editscope.data.hf import hf_source, is_hf_source
from editscope.data.hf import label as hf_label
from editscope.errors import EditscopeError
from editscope.finite import non_finite
from editscope.paths import config_path
from editscope.run.lmeval import LmEvalSpec, parse_spec
from editscope.run.plan import (
    ORDER_MARK,
    REPROBE,
    THREADS_MARK,
    Batch,
    Lifelong,
    Mode,
    ProbeOnly,
    Sequential,
    Single,
    chain_labels,
    mode_from_dict,
)
from editscope.typed import typed as fits  # _Checker.typed is the method of that name

if TYPE_CHECKING:
    from editscope.edit.runtime import RuntimeSettings

TOP_KEYS = {"model", "models", "seed", "output", "mode", "save_patches", "methods", "datasets", "dataset", "slice",
            "suites", "plugin_modules", "device", "dtype", "runtime", "chat_template", "lm_eval"}
METHOD_KEYS = {"name", "label", "hparams", "overrides", "plugins"}
BLOCK_KEYS = {"dataset", "label", "slice", "suites"}
SLICE_KEYS = {"offset", "limit"}
SUITE_KEYS = {"name", "options"}
MODES = ("single", "batch", "sequential", "sequential_batches", "probe_only")
SEQ_BATCH_KEYS = {"batch", "rounds", "checkpoints", "reprobe", "sampled", "orders", "threads"}
NO_EDIT = "none"  # the method name of probe-only runs (``methods: [none]``)
#: fields of a config left out of its canonical form while at their default (they came after the first digests;
#: an unset one keeps an older config's digest)
SINCE = {"since": "omitted at default"}
#: the types of a stored config's keys (run.json's ``config``: :meth:`RunConfig.from_run_json`)
_STORED_REQUIRED = ("model", "methods", "blocks", "mode", "group_size")
"""Keys every stored config has (what resume, inspect and report read without a default)."""
_STORED_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,), "models": (list,), "methods": (list,), "blocks": (list,), "mode": (str,), "seed": (int,),
    "output": (str,), "save_patches": (bool,), "plugin_modules": (list,), "device": (str, type(None)),
    "dtype": (str, type(None)), "runtime": (dict,), "chat_template": (bool,), "lm_eval": (dict, type(None)),
    "group_size": (int,), "batch": (int,), "rounds": (int,), "checkpoints": (int, list), "reprobe": (int,)}


@dataclass(frozen=True)
class MethodSpec:
    """One method entry. ``plugins`` holds ``{"name": plug-in, **hparams}`` mappings (validated at load)."""

    name: str
    label: str
    hparams: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    plugins: tuple[dict[str, Any], ...] = ()

    def attached_plugins(self) -> list:
        """The plug-ins as :class:`~editscope.edit.plugins.Plugin` objects for this method's editor."""
        from editscope.edit.registry import get_editor

        return get_editor(self.name).attach([(p["name"], {k: v for k, v in p.items() if k != "name"})
                                             for p in self.plugins], f"method {self.label!r}: plugins")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plugins"] = [dict(p) for p in self.plugins]
        if not self.plugins:  # configs without plug-ins keep the digest they had before plug-ins existed
            data.pop("plugins")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MethodSpec:
        return cls(**{**data, "plugins": tuple(dict(p) for p in data.get("plugins", ()))})


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockSpec:
    dataset: str
    label: str
    offset: int = 0
    limit: int | None = None
    suites: tuple[SuiteSpec, ...] = ()


@dataclass(frozen=True)
class RunConfig:
    """A validated experiment config (see the module docstring)."""

    model: str
    methods: tuple[MethodSpec, ...]
    blocks: tuple[BlockSpec, ...]
    #: what is edited per group, and which rows are written (:mod:`editscope.run.plan`)
    mode: Mode = Single()
    seed: int = 0
    output: str = "runs/run"
    save_patches: bool = False
    plugin_modules: tuple[str, ...] = field(default=(), metadata=SINCE)
    #: where the model runs (editscope.lm.device); None: $EDITSCOPE_DEVICE, else auto
    device: str | None = field(default=None, metadata=SINCE)
    dtype: str | None = field(default=None, metadata=SINCE)  # the model weights' precision; None: float32
    #: runtime settings the config gives (editscope.edit.runtime); the values in force, with the environment's
    #: defaults filled in, are what run.json and the digest record (:meth:`digest`'s ``runtime``)
    runtime: tuple[tuple[str, Any], ...] = field(default=(), metadata=SINCE)
    #: prompts wrapped in the tokenizer's chat template (editscope.lm.engine.ChatFormat)
    chat_template: bool = field(default=False, metadata=SINCE)
    #: lm-evaluation-harness tasks at chain checkpoints (editscope.run.lmeval)
    lm_eval: LmEvalSpec | None = field(default=None, metadata=SINCE)
    #: the config's ``models`` list (``model`` is then ""): one single-model run per entry (:meth:`for_model`)
    models: tuple[str, ...] = field(default=(), metadata=SINCE)
    #: where the config was read from (the YAML file, or parse_config's ``where``), for messages about its keys; not
    #: part of what is computed (left out of :meth:`to_dict`, the digest and equality)
    source: str = field(default="", compare=False)

    @property
    def where(self) -> str:
        """What a message about this config's keys names: its file, else (a config rebuilt from a run.json) its
        output directory."""
        return self.source or self.output

    def for_model(self, model: str) -> RunConfig:
        """The single-model config of one ``models`` entry: what ``model: ENTRY`` in the same file would give (so
        its digest, and its run directory, are those of that single-model run)."""
        return replace(self, model=model, models=())

    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON form (stored in run.json; equal configs give equal dicts). One rule keeps older digests:
        a field marked :data:`SINCE` is left out while at its default; the mode writes its own keys."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "source" or (f.metadata.get("since") and value == f.default):
                continue
            data |= value.to_dict() if f.name == "mode" else {f.name: _plain(f.name, value)}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict` (no validation: the dict comes from a run.json this package wrote)."""
        return cls(
            model=data["model"],
            methods=tuple(MethodSpec.from_dict(m) for m in data["methods"]),
            blocks=tuple(BlockSpec(**{**b, "suites": tuple(SuiteSpec(**s) for s in b["suites"])})
                         for b in data["blocks"]),
            mode=mode_from_dict(data), seed=data["seed"], output=data["output"],
            save_patches=data["save_patches"], plugin_modules=tuple(data.get("plugin_modules", ())),
            device=data.get("device"), dtype=data.get("dtype"), runtime=tuple(data.get("runtime", {}).items()),
            chat_template=bool(data.get("chat_template", False)),
            lm_eval=LmEvalSpec.from_dict(data["lm_eval"]) if data.get("lm_eval") else None,
            models=tuple(data.get("models", ())),
        )

    @classmethod
    def from_run_json(cls, data: Any, path: str | Path) -> RunConfig:
        """:meth:`from_dict` of the ``config`` a run.json at ``path`` holds, after checking the types of its keys: a
        damaged file (an edit by hand, a torn copy) is one line naming the file and the key, not a traceback. The
        run's ``plugin_modules`` are imported first: what they registered (a model family, an editor, a suite) is
        needed to read the run again, and the run records them so that no reader has to be told."""
        check_stored_config(data, path)
        if modules := data.get("plugin_modules"):
            from editscope.edit.plugins import import_plugin_modules

            try:
                import_plugin_modules([str(m) for m in modules])
            except EditscopeError as exc:
                raise EditscopeError(f"{path}: field 'config.plugin_modules': {exc}") from None
        try:
            return cls.from_dict(data)
        except KeyError as exc:
            raise EditscopeError(f"{path}: field 'config': key {exc} is missing; the file is damaged") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise EditscopeError(f"{path}: field 'config': {str(exc)[:120]}; the file is damaged") from None

    @cached_property
    def settings(self) -> RuntimeSettings:
        """The runtime settings in force: the config's ``runtime`` keys, the environment's defaults for the others
        (:meth:`~editscope.edit.runtime.RuntimeSettings.resolve`), parsed once per config."""
        from editscope.edit.runtime import RuntimeSettings

        return RuntimeSettings.resolve(dict(self.runtime), where=f"{self.where}: runtime")

    def block_labels(self) -> list[str]:
        """The labels of the blocks a run edits, in order: each block's, then its other edit orders' (``orders``)."""
        mode = self.mode
        return [label for b in self.blocks
                for label, _k, _t in chain_labels(b.label, getattr(mode, "orders", 1), getattr(mode, "threads", ()))]

    def digest(self, runtime: dict[str, Any] | None = None, *, without: tuple[str, ...] = ()) -> str:
        """Identity of what is computed: everything but the output directory and the device, with ``runtime`` (the
        runtime settings recorded with results; None: :attr:`settings`) where they differ from the defaults (so
        older runs keep their digest).
        ``without``: fields left out too (``("methods",)``: what the unedited model's probes depend on)."""
        from editscope.edit.runtime import DEFAULT_SETTINGS

        data = self.to_dict()
        for name in ("output", "device", "runtime", *without):
            data.pop(name, None)
        changed = {k: v for k, v in (runtime or self.settings.recorded()).items() if DEFAULT_SETTINGS.get(k) != v}
        if changed:
            data["runtime"] = changed
        return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=12).hexdigest()


def _plain(name: str, value: Any) -> Any:
    """Config field ``name``'s value as JSON."""
    if name == "runtime":
        return dict(value)
    if name == "blocks":
        return [{**asdict(b), "suites": [asdict(s) for s in b.suites]} for b in value]
    if name == "methods":
        return [m.to_dict() for m in value]
    if hasattr(value, "to_dict"):  # lm_eval
        return value.to_dict()
    return list(value) if isinstance(value, tuple) else value


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, key: str, problem: str) -> EditscopeError:
        return EditscopeError(f"{self.where}: key {key!r}: {problem}")

    def keys(self, data: dict, allowed: set[str], prefix: str) -> None:
        for key in data:
            if key not in allowed:
                raise self.fail(f"{prefix}{key}", f"unknown key (known: {', '.join(sorted(allowed))})")

    def typed(self, value: Any, annotation: Any, key: str, what: str) -> Any:
        if not fits(value, annotation):
            raise self.fail(key, f"expected {what}, got {type(value).__name__} {value!r}")
        return value

    def text(self, value: Any, key: str) -> str:
        value = self.typed(value, str, key, "a string")
        if not value.strip():
            raise self.fail(key, "must not be empty")
        return value

    def count(self, value: Any, key: str, minimum: int) -> int:
        value = self.typed(value, int, key, "an integer")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value


def _resolve(path: str, base: Path | None) -> str:
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None and (base / p).exists():
        return str((base / p).resolve())
    return str(p.resolve()) if p.exists() else path


def parse_config(data: Any, *, where: str = "<config>", base_dir: Path | None = None,
                 methods: Iterable[str] | None = None, suites: Iterable[str] | None = None,
                 datasets: Iterable[str] | None = None) -> RunConfig:
    """Validate a config mapping. ``methods``/``suites``/``datasets`` are the known names (default: the
    registries); a dataset that is not a registered name must be an existing file.

    Sections are checked in order -- top-level keys and non-finite numbers, model, run settings, mode,
    plug-in modules, methods, dataset blocks -- so the first problem reported is the first one in that order."""
    c = _Checker(where)
    if not isinstance(data, dict):
        raise EditscopeError(f"{where}: expected a mapping of config keys, got {type(data).__name__}")
    c.keys(data, TOP_KEYS, "")
    bad = next(non_finite(data), None)
    if bad:  # YAML's .nan/.inf anywhere (overrides, plug-in hparams, suite options) are refused up front
        raise c.fail(bad[0], f"must be a finite number, got {bad[1]}")
    model, models = _model(c, data, base_dir)
    settings = _settings(c, data)
    runtime = _runtime(c, data)
    mode = _mode(c, data.get("mode", "single"))
    plugin_modules = _plugin_modules(c, data)
    # the known names are read after plugin_modules are imported: a module there may register editors, suites
    # and datasets as well as plug-ins
    known_methods, known_suites, known_datasets = _known(methods, suites, datasets)
    mode, method_specs = _methods(c, data, mode, known_methods, base_dir)
    blocks = [_block(c, raw, prefix, known_datasets, known_suites, base_dir) for raw, prefix in _raw_blocks(c, data)]
    _unique(c, [b.label for b in blocks], "datasets", "dataset")
    if getattr(mode, "orders", 1) > 1 or getattr(mode, "threads", ()):
        for i, b in enumerate(blocks):
            for mark, what in ((ORDER_MARK, "other edit orders"), (THREADS_MARK, "chains run under a thread count")):
                if mark in b.label:
                    raise c.fail(f"datasets[{i}].label", f"{b.label!r}: '{mark}' marks the blocks of {what}; choose "
                                                         "another label")
    chat_template = c.typed(data.get("chat_template", False), bool, "chat_template", "true or false")
    lm_eval = parse_spec(data["lm_eval"], c.fail, base_dir, mode.name) if data.get("lm_eval") is not None else None
    config = RunConfig(model=model, models=models, methods=method_specs, blocks=tuple(blocks), mode=mode,
                       **settings, runtime=runtime, plugin_modules=plugin_modules, chat_template=chat_template,
                       lm_eval=lm_eval, source=where)
    return config


def _known(methods: Iterable[str] | None, suites: Iterable[str] | None,
           datasets: Iterable[str] | None) -> tuple[list[str], list[str], list[str]]:
    """The known method, suite and dataset names: as given, else the registries."""
    if methods is None:
        from editscope.edit.registry import EDITORS

        methods = EDITORS
    if suites is None:
        from editscope.run.suites import available_suites

        suites = available_suites()
    if datasets is None:
        from editscope.data import DATASETS

        datasets = DATASETS
    return list(methods), list(suites), list(datasets)


def _model(c: _Checker, data: dict, base_dir: Path | None) -> tuple[str, tuple[str, ...]]:
    """``model``, or ``models`` (then ``model`` is ""): each a registry name or ``tiny-*`` as is, else a path
    resolved against the config's folder. Nothing is loaded: validating a config needs no weights."""
    if ("model" in data) == ("models" in data):
        raise c.fail("model", "give either 'model' (one model) or 'models' (a list), not both" if "model" in data
                     else "required (or a 'models' list)")
    if "model" in data:
        return _model_entry(c, data["model"], "model", base_dir), ()
    raw = c.typed(data["models"], list, "models", "a list of models")
    if not raw:
        raise c.fail("models", "at least one model is required")
    models = tuple(_model_entry(c, m, f"models[{i}]", base_dir) for i, m in enumerate(raw))
    slugs = [model_slug(m).casefold() for m in models]  # casefold: one folder on case-insensitive file systems
    for i, slug in enumerate(slugs):
        if slug in slugs[:i]:
            first = slugs.index(slug)
            what = "appears twice" if models[first] == models[i] else f"has the output folder of {raw[first]!r}"
            raise c.fail(f"models[{i}]", f"{raw[i]!r} {what} (each model once)")
    return "", models


def _model_entry(c: _Checker, raw: Any, key: str, base_dir: Path | None) -> str:
    model = c.text(raw, key)
    from editscope.lm.loading import registry_names

    if model not in registry_names() and not model.startswith("tiny-"):
        model = _resolve(model, base_dir)
    return model



def check_stored_config(data: Any, path: str | Path) -> None:
    """The ``config`` of a run.json at ``path`` has the types its readers (resume, inspect, report) rely on: one line
    naming the file and the key otherwise (the file was damaged or edited by hand)."""
    if not isinstance(data, dict):
        raise EditscopeError(f"{path}: field 'config': expected an object, got {type(data).__name__}; the file "
                             "is damaged")
    for key in _STORED_REQUIRED:
        if key not in data and not (key == "model" and "models" in data):
            raise EditscopeError(f"{path}: field 'config.{key}' is missing; the file is damaged")
    for key, kinds in _STORED_TYPES.items():
        value = data.get(key)
        if key in data and (not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)):
            raise EditscopeError(f"{path}: field 'config.{key}': expected {' or '.join(k.__name__ for k in kinds)}"
                                 f", got {type(value).__name__}; the file is damaged")
    every = data.get("checkpoints")
    if isinstance(every, list) and not all(isinstance(r, int) and not isinstance(r, bool) for r in every):
        raise EditscopeError(f"{path}: field 'config.checkpoints': expected a list of round numbers, got {every!r}; "
                             "the file is damaged")
    for key in ("methods", "blocks"):  # each an object with its label (what results rows name it by)
        if not all(isinstance(x, dict) and isinstance(x.get("label"), str) for x in data.get(key, [])):
            raise EditscopeError(f"{path}: field 'config.{key}': expected a list of objects with a 'label'; the file "
                                 "is damaged")


_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def model_slug(model: str) -> str:
    """The folder name of one ``models`` entry's run: the entry itself when it is a safe file name (registry names,
    ``tiny-*``), else its last path parts made safe plus a hash of the whole entry (``org/name`` and ``org_name``,
    or two folders of one name, get different folders)."""
    if _SAFE.fullmatch(model) and len(model) <= 100:
        return model
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(Path(model).parts[-2:])).strip("._-")[:60] or "model"
    return f"{tail}-{hashlib.blake2b(model.encode(), digest_size=4).hexdigest()}"


def _settings(c: _Checker, data: dict) -> dict[str, Any]:
    """``seed``, ``output``, ``save_patches``, ``device`` and ``dtype`` (RunConfig fields of the same names)."""
    seed = c.count(data.get("seed", 0), "seed", 0)
    output = c.text(data.get("output", "runs/run"), "output")
    save_patches = c.typed(data.get("save_patches", False), bool, "save_patches", "true or false")
    device = c.text(data["device"], "device") if "device" in data else None
    if device is not None and not re.fullmatch(r"cpu|auto|cuda(:\d+)?", device):
        raise c.fail("device", f"expected cpu, cuda, cuda:N or auto, got {device!r}")
    dtype = c.text(data["dtype"], "dtype") if "dtype" in data else None
    if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
        raise c.fail("dtype", f"expected float32, bfloat16 or float16, got {dtype!r}")
    return {"seed": seed, "output": output, "save_patches": save_patches, "device": device, "dtype": dtype}


def _runtime(c: _Checker, data: dict) -> tuple[tuple[str, Any], ...]:
    """``runtime``: the edit runtime settings the config fixes (:mod:`editscope.edit.runtime`)."""
    from editscope.edit.objective.forward import FORWARDS
    from editscope.edit.runtime import DEFAULT_SETTINGS, parse_vstar_batch

    raw = c.typed(data.get("runtime", {}), dict, "runtime", "a mapping")
    c.keys(raw, set(DEFAULT_SETTINGS), "runtime.")
    if "forward" in raw and raw["forward"] not in FORWARDS:
        raise c.fail("runtime.forward", f"must be one of {', '.join(FORWARDS)}, got {raw['forward']!r}")
    if "vstar_batch" in raw:
        try:
            parse_vstar_batch(raw["vstar_batch"])
        except EditscopeError:
            raise c.fail("runtime.vstar_batch", f"must be auto or a positive integer, got {raw['vstar_batch']!r}"
                         ) from None
    return tuple((k, raw[k]) for k in DEFAULT_SETTINGS if raw.get(k) is not None)


def _mode(c: _Checker, raw: Any) -> Mode:
    """``mode``: 'single', 'probe_only', {batch: N}, {sequential: N} or {sequential_batches: {...}}."""
    expected = ("expected 'single', 'probe_only', {batch: N}, {sequential: N} or "
                "{sequential_batches: {batch: B, rounds: T, checkpoints: k}}")
    if isinstance(raw, str):
        if raw not in ("single", "probe_only"):
            raise c.fail("mode", f"{expected}, got {raw!r}")
        return Single() if raw == "single" else ProbeOnly()
    if not (isinstance(raw, dict) and len(raw) == 1):
        raise c.fail("mode", f"{expected}, got {raw!r}")
    (mode, n), = raw.items()
    if mode not in ("batch", "sequential", "sequential_batches"):
        raise c.fail(f"mode.{mode}", f"unknown mode (known: {', '.join(MODES)})")
    if mode != "sequential_batches":
        return (Batch if mode == "batch" else Sequential)(c.count(n, f"mode.{mode}", 1))
    c.typed(n, dict, "mode.sequential_batches", "a mapping {batch: B, rounds: T, checkpoints: k}")
    c.keys(n, SEQ_BATCH_KEYS, "mode.sequential_batches.")
    for key in ("batch", "rounds"):
        if key not in n:
            raise c.fail(f"mode.sequential_batches.{key}", "required")
    batch = c.count(n["batch"], "mode.sequential_batches.batch", 1)
    rounds = c.count(n["rounds"], "mode.sequential_batches.rounds", 1)
    checkpoints = _checkpoint_rounds(c, n.get("checkpoints", 0) or 0, rounds)
    reprobe = c.count(n.get("reprobe", REPROBE), "mode.sequential_batches.reprobe", 1)
    sampled = c.typed(n.get("sampled", False), bool, "mode.sequential_batches.sampled", "true or false")
    orders = c.count(n.get("orders", 1), "mode.sequential_batches.orders", 1)
    threads = _thread_counts(c, n.get("threads", []))
    # one group = one sequence of edits from the unedited model
    return Lifelong(batch, rounds, checkpoints, reprobe, sampled, orders, threads)


def _thread_counts(c: _Checker, raw: Any) -> tuple[int, ...]:
    """``threads``: distinct positive torch thread counts, each order's chain run once under each."""
    key = "mode.sequential_batches.threads"
    counts = c.typed(raw, list, key, "a list of torch thread counts, e.g. [1, 2]")
    out = tuple(c.count(t, f"{key}[{i}]", 1) for i, t in enumerate(counts))
    if len(set(out)) != len(out):
        raise c.fail(key, f"a thread count is listed twice in {list(out)}")
    return out


def _checkpoint_rounds(c: _Checker, raw: Any, rounds: int) -> int | tuple[int, ...]:
    """``mode.sequential_batches.checkpoints``: every k-th round (an int >= 0), or the rounds listed (1-based,
    increasing, at most ``rounds``; a log scale follows the first rounds closely and a long stream sparsely)."""
    key = "mode.sequential_batches.checkpoints"
    if not isinstance(raw, list):
        return c.count(raw, key, 0)
    for i, r in enumerate(raw):
        c.count(r, f"{key}[{i}]", 1)
        if r > rounds:
            raise c.fail(f"{key}[{i}]", f"round {r} is after the last round ({rounds})")
        if i and r <= raw[i - 1]:
            raise c.fail(f"{key}[{i}]", f"rounds must increase, got {raw[i - 1]} then {r}")
    return tuple(raw)


def _plugin_modules(c: _Checker, data: dict) -> tuple[str, ...]:
    """``plugin_modules``: module names, imported now so that what they register (plug-ins, editors, suites,
    datasets) is known to ``methods`` and the dataset blocks."""
    modules = c.typed(data.get("plugin_modules", []) or [], list, "plugin_modules", "a list of module names")
    for i, module in enumerate(modules):
        c.text(module, f"plugin_modules[{i}]")
    from editscope.edit.plugins import import_plugin_modules

    try:
        import_plugin_modules(modules)
    except EditscopeError as exc:
        raise c.fail("plugin_modules", str(exc)) from exc
    return tuple(modules)


def _methods(c: _Checker, data: dict, mode: Mode, known: list[str],
             base_dir: Path | None) -> tuple[Mode, tuple[MethodSpec, ...]]:
    """``methods``, and the mode they imply: ``methods: [none]`` (or leaving methods out under probe_only) is a
    probe-only run, whose groups are ``PROBE_GROUP`` cases and whose one method is ``none``."""
    if "methods" not in data and mode.name != "probe_only":
        raise c.fail("methods", "required (a list of edit methods)")
    raw_methods = c.typed(data.get("methods", [NO_EDIT]), list, "methods", "a list")
    if not raw_methods:
        raise c.fail("methods", "at least one method is required")
    if NO_EDIT in raw_methods or {"name": NO_EDIT} in raw_methods:  # probe-only: pre-edit measurements, no edit
        if raw_methods not in ([NO_EDIT], [{"name": NO_EDIT}]):
            raise c.fail("methods", f"{NO_EDIT!r} (probe only: no edit) cannot be combined with edit methods")
        if mode.name not in ("single", "probe_only"):
            raise c.fail("mode", f"methods: [{NO_EDIT}] measures the unedited model only; mode must be probe_only")
        mode = ProbeOnly()
    elif mode.name == "probe_only":
        raise c.fail("methods", f"mode probe_only edits nothing: give methods: [{NO_EDIT}] or leave methods out")
    if mode.name == "probe_only":
        return mode, (MethodSpec(NO_EDIT, NO_EDIT),)
    specs = tuple(_method(c, m, f"methods[{i}]", known, base_dir) for i, m in enumerate(raw_methods))
    _unique(c, [m.label for m in specs], "methods", "method")
    return mode, specs


def _method(c: _Checker, m: Any, key: str, known: list[str], base_dir: Path | None) -> MethodSpec:
    """One entry of ``methods``: a name, or {name, label, hparams, overrides, plugins}."""
    if isinstance(m, str):
        m = {"name": m}
    c.typed(m, dict, key, "a method name or a mapping")
    c.keys(m, METHOD_KEYS, f"{key}.")
    if "name" not in m:
        raise c.fail(f"{key}.name", "required")
    name = c.text(m["name"], f"{key}.name")
    if name not in known:
        raise c.fail(f"{key}.name", f"unknown edit method {name!r}; available: {', '.join(known)}")
    plugins = _plugins(c, m.get("plugins", []) or [], name, f"{key}.plugins", base_dir)
    label = c.text(m.get("label", "+".join([name, *(p["name"] for p in plugins)])), f"{key}.label")
    hp = m.get("hparams")
    if hp is not None:
        hp_path = Path(_resolve(c.text(hp, f"{key}.hparams"), base_dir))
        if not hp_path.is_file():
            raise c.fail(f"{key}.hparams", f"file not found: {hp}")
        hp = str(hp_path)
    overrides = c.typed(m.get("overrides", {}) or {}, dict, f"{key}.overrides", "a mapping")
    return MethodSpec(name, label, hp, dict(overrides), plugins)


def _unique(c: _Checker, labels: list[str], key: str, what: str) -> None:
    """Labels name rows of the results: a repeated one is an error naming it."""
    dup = next((x for x in labels if labels.count(x) > 1), None)
    if dup:
        raise c.fail(key, f"{what} label {dup!r} appears twice (give one a different 'label')")


def _raw_blocks(c: _Checker, data: dict) -> list[tuple[Any, str]]:
    """(raw block, key prefix) pairs: the ``datasets`` list, or one block of top-level dataset/slice/suites."""
    if "datasets" not in data:
        if "dataset" not in data:
            raise c.fail("dataset", "required (or a 'datasets' list)")
        return [({k: data[k] for k in ("dataset", "slice", "suites") if k in data}, "")]
    for key in ("dataset", "slice", "suites"):
        if key in data:
            raise c.fail(key, "give either 'datasets' (a list of blocks) or top-level dataset/slice/suites")
    raw_blocks = c.typed(data["datasets"], list, "datasets", "a list of dataset blocks")
    if not raw_blocks:
        raise c.fail("datasets", "at least one dataset block is required")
    return [(raw, f"datasets[{i}].") for i, raw in enumerate(raw_blocks)]


def _block(c: _Checker, raw: Any, prefix: str, known_datasets: list[str], known_suites: list[str],
           base_dir: Path | None) -> BlockSpec:
    """One dataset block: {dataset, label, slice, suites}."""
    c.typed(raw, dict, prefix.rstrip(".") or "datasets", "a mapping")
    c.keys(raw, BLOCK_KEYS, prefix)
    if "dataset" not in raw:
        raise c.fail(f"{prefix}dataset", "required")
    dataset = _dataset(c, raw["dataset"], f"{prefix}dataset", known_datasets, base_dir)
    default = hf_label(dataset) if is_hf_source(dataset) else dataset if dataset in known_datasets else \
        Path(dataset).stem
    label = c.text(raw.get("label", default), f"{prefix}label")
    offset, limit = _slice(c, raw.get("slice", {}) or {}, f"{prefix}slice")
    suites = _suites(c, raw.get("suites"), f"{prefix}suites", known_suites)
    return BlockSpec(dataset, label, offset, limit, suites)


def _dataset(c: _Checker, raw: Any, key: str, known: list[str], base_dir: Path | None) -> str:
    """A block's ``dataset``: a registered name, an HF source ({hf: NAME, split: ...}) or an existing file
    (resolved against the config's folder)."""
    if isinstance(raw, dict):  # {hf: NAME, split: ...}: HF datasets, optional (editscope.data.hf)
        spec = dict(raw)
        if isinstance(spec.get("hf"), str) and Path(_resolve(spec["hf"], base_dir)).is_dir():
            spec["hf"] = str(Path(_resolve(spec["hf"], base_dir)))  # a save_to_disk folder next to the config
        try:
            dataset = hf_source(spec)
        except ValueError as exc:
            raise c.fail(key, str(exc)) from None
    else:
        dataset = c.text(raw, key)
    if dataset not in known and not is_hf_source(dataset):
        path = Path(_resolve(dataset, base_dir))
        if not path.is_file():
            raise c.fail(key, f"unknown dataset {dataset!r}: not a registered name ({', '.join(known)}) and no "
                         "such file")
        dataset = str(path)
    return dataset


def _slice(c: _Checker, raw: Any, key: str) -> tuple[int, int | None]:
    """A block's ``slice``: (offset, limit or None)."""
    sl = c.typed(raw, dict, key, "a mapping with offset and limit")
    c.keys(sl, SLICE_KEYS, f"{key}.")
    offset = c.count(sl.get("offset", 0), f"{key}.offset", 0)
    limit = sl.get("limit")
    if limit is not None:
        limit = c.count(limit, f"{key}.limit", 1)
    return offset, limit


def _named(c: _Checker, entry: Any, key: str, what: str, keys: set[str] | None = None) -> tuple[dict, str]:
    """A list entry given as a name or as a mapping with ``name`` (suites, plug-ins): the mapping and its name,
    checked in that order (a mapping, its ``keys`` when given, then the name)."""
    if isinstance(entry, str):
        entry = {"name": entry}
    c.typed(entry, dict, key, what)
    if keys is not None:
        c.keys(entry, keys, f"{key}.")
    if "name" not in entry:
        raise c.fail(f"{key}.name", "required")
    return entry, c.text(entry["name"], f"{key}.name")


def _suites(c: _Checker, raw: Any, key: str, known: list[str]) -> tuple[SuiteSpec, ...]:
    """A block's ``suites``: names or {name, options}, each suite once, options checked by the suite."""
    from editscope.run.suites import option_problem

    raw_suites = c.typed(raw, list, key, "a list of suite names")
    if not raw_suites:
        raise c.fail(key, "at least one suite is required")
    specs = []
    for j, s in enumerate(raw_suites):
        skey = f"{key}[{j}]"
        s, name = _named(c, s, skey, "a suite name or a mapping {name, options}", SUITE_KEYS)
        if name not in known:
            raise c.fail(f"{skey}.name", f"unknown suite {name!r}; available: {', '.join(known) or 'none'}")
        options = c.typed(s.get("options", {}) or {}, dict, f"{skey}.options", "a mapping")
        problem = option_problem(name, options)
        if problem:
            raise c.fail(f"{skey}.options.{problem[0]}", problem[1])
        specs.append(SuiteSpec(name, dict(options)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise c.fail(key, "a suite appears twice in one dataset block")
    return tuple(specs)


def _plugins(c: _Checker, raw: Any, method: str, key: str, base_dir: Path | None) -> tuple[dict[str, Any], ...]:
    """A method's ``plugins: [{name: X, hparam: value, ...}]``, validated against the plug-in registry and the
    editor's declaration (plug-ins need an optimising editor); hparams are stored complete (defaults filled; a
    ``from:`` tuned file, relative to the config's folder, resolved into its values)."""
    from editscope.edit.plugins import FROM_KEY, get_plugin
    from editscope.edit.registry import EDITORS

    raw = c.typed(raw, list, key, "a list of plug-ins ({name: X, hparam: value, ...})")
    out = []
    for i, entry in enumerate(raw):
        ekey = f"{key}[{i}]"
        entry, name = _named(c, entry, ekey, "a plug-in name or a mapping {name: X, hparam: value, ...}")
        values = {k: v for k, v in entry.items() if k != "name"}
        if isinstance(values.get(FROM_KEY), str):
            values[FROM_KEY] = _resolve(values[FROM_KEY], base_dir)
        try:
            spec = get_plugin(name)
            plugin = spec.attach(values, f"{c.where}: key {ekey!r}")
        except EditscopeError as exc:
            msg = str(exc)
            raise (EditscopeError(msg) if msg.startswith(c.where) else c.fail(f"{ekey}.name", msg)) from exc
        out.append(plugin.to_dict())
    names = [p["name"] for p in out]
    if len(set(names)) != len(names):
        raise c.fail(key, "a plug-in appears twice")
    if out and method in EDITORS and not EDITORS[method].optimises:
        raise c.fail(key, f"{method} does not optimise a loss, so plug-ins cannot be attached to it")
    return tuple(out)


def load_config(path: str | Path, **known: Iterable[str] | None) -> RunConfig:
    """Read and validate a YAML config file (see :func:`parse_config` for ``known``); a shipped config may be
    named as ``demo`` or ``configs/demo.yaml`` (:func:`editscope.paths.config_path`)."""
    path = config_path(path)
    data = yamlio.load_file(path, "config")
    return parse_config(data, where=str(path), base_dir=path.resolve().parent, **known)
