"""What an edit costs before it runs: predicted peak memory, term by term, and predicted seconds per edit.

Everything is computed from a model's ``config.json`` (no weights are read: the parameter count comes from the
model built on PyTorch's meta device) and an editor's hyperparameters. Memory is counted in bytes per term:

``runtime``
    the process before any model: Python, torch, transformers and editscope imported (:data:`RUNTIME_HOST`,
    measured on this CPU); on a GPU the CUDA context and kernels' workspace (:data:`RUNTIME_CUDA`).
``weights``
    parameters × bytes of the dtype (tied embeddings once). editscope loads a model in float32 on the host and
    then converts it (:func:`editscope.lm.device.place`), so the *load* phase holds parameters × 4 bytes on the
    host whatever the dtype (term ``load``), and in another dtype the converted weights besides: the float32 file's
    pages stay resident while the copy is made (Qwen2.5-Coder-1.5B in bfloat16 on the CPU: 10,668 MiB measured,
    runtime + float32 + bfloat16 = 10,609 MiB). A registry model whose copy in that dtype is cached
    (:func:`editscope.lm.loading.prepare`, made by its first load in the dtype; ``converted``) is read as stored:
    its load is the weights alone.
``statistics``
    computing the key second moment C of the edited layers (:mod:`editscope.stats.second_moment`) in one pass: per
    layer a float64 sum d_ff² × 8 and its mean (another d_ff² × 8 while the sums are alive), or with the statistics
    precision ``mom2_dtype: float32`` a float32 sum and its compensation (2 × d_ff² × 4, the mean taken in place),
    one float32 k kᵀ chunk (d_ff² × 4) and one no-grad forward batch (``batch_rows × seq_len`` tokens). Skipped
    when C is cached.
``C``
    the C of every edited layer the editor holds while it solves (d_ff² × 8 per layer; × 4 in float32). The solves
    convert it to float64 one layer at a time (term ``solve``).
``projector``
    AlphaEdit / EVK-Edit: the null-space projector P and the accumulated K_p K_pᵀ per layer (2 × d_ff² × 8).
``solve``
    transient float64 matrices of the largest solve: ROME the LU copy of C (1 × d_ff² × 8); MEMIT λC, K Kᵀ, their
    sum and LU (3 ×); AlphaEdit the SVD of C (A's copy, U, Vᵀ, gesdd's 4n² workspace, the kept columns: 8 ×).
``patch``
    per edited weight (d × d_ff): the float32 ΔW, the pre-edit copy of W a patch carries (``bases``, in the
    model's dtype) and the float64 result of the solve.
``vstar``
    the z / v* optimisation (or FT's training forward): activations kept for backward of every token of the
    batched rows through the blocks after the first edited layer, plus float32 logits, log-softmax and their
    gradient over the vocabulary. The batch is as many requests as ``vstar_batch`` and the engine's token
    budget allow (:func:`editscope.edit.objective.optimise.request_groups`).
``ig``
    KN's integrated gradients: ``steps`` one-token rows per searched layer, as many layers per forward/backward as
    its 1,024-token budget allows, through every block, with the prompt's keys/values copied per row.
``mend``
    MEND's editor networks (float32 low-rank MLPs, float64 normalisers) and the edited weights' gradients.
``optimizer``
    FT: gradient, Adam's two moments and the pre-edit copy of each trained weight; WISE: W'_v, its gradient, the
    gradient mask and two bounds.
``codebook``
    GRACE: one entry per request (key, its float64 search copy and norm, value, radius), in rooms up to twice the
    rows (:func:`_grace`).
``side memory``
    WISE: the memories in force after the plan's requests from an empty memory, held and stacked in the edit
    (:func:`_wise`). Context editors (PROMPT, IKE, retrieval) add no term: an edit stores text.

The peak is the largest of three phases that do not overlap: load (runtime + load, and the weights in another
dtype), statistics (runtime + weights + statistics) and edit (runtime + weights + C + projector + the larger of the
solve and the optimisation).

Time per edit is a FLOP count divided by the device's matmul rate at the edit's own shapes (:func:`measure_rates`
measures it in about a second, or the caller passes rates): forward and input-gradient matmuls of the v*/z steps
(4 × the block's parameters per token and layer), the logits, the key forwards, and the float64 solves at the
device's float64 rate. It is the time of the matmuls alone at the rate measured for the edit's row count (small
rows run slower than large ones, DESIGN "cost of an edit"); kernel launches, Python and the optimiser's small
operations are not counted (on SmolLM2 with one CPU thread it landed within 0.5-2x of the measured time,
docs/scale.md).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from editscope.errors import EditscopeError

MiB = 2 ** 20
GiB = 2 ** 30

#: resident memory of the process beside the weights once a model has run a forward: Python, torch, transformers and
#: editscope imported (248 MiB; 312 MiB with the runner), the tokenizer, model code and the compute kernels' pages
#: (measured on this CPU, torch 2.13 / transformers 5.24: SmolLM2 loaded and one forward, 951 MiB RSS - 513 MiB of
#: weights)
RUNTIME_HOST = 440 * MiB
#: GPU memory taken before any tensor: CUDA context, cuBLAS workspace, the caching allocator's slack
RUNTIME_CUDA = 600 * MiB
#: bytes per element of the dtypes editscope runs models in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
#: bytes per entry of C by statistics precision (the hparams key ``mom2_dtype``)
STATS_BYTES = {"float64": 8, "float32": 4}

#: the engine's token budget per forward (ScoringEngine's default; the v*/z groups use it: rows × widest row)
ENGINE_TOKEN_BUDGET = 2048
#: what one CounterFact-style request adds to a row beyond its context prefix: the prompt (~12 tokens with the
#: subject) and the target (~3); the suffix each v*/z step runs per rewrite row (the subject's last token to the
#: target's last: ~6) and per essence row ("{subject} is a": ~3)
PROMPT_TOKENS, TARGET_TOKENS, SUFFIX_TOKENS, ESSENCE_TOKENS = 12, 3, 6, 3
#: values kept for backward per token and block, in units of the hidden size d and the MLP width d_ff. The weights do
#: not require grad, so no matmul keeps its input; what is kept is the norms' inputs (and their float32 copies), the
#: queries and attention output (d each), and the MLP's elementwise operands (gate, up, activation: 3 d_ff gated; the
#: GELU input and output: 2 d_ff). Checked against KN's measured SmolLM2 edit (its 18,000 row-blocks dominate it)
ACT_D, ACT_FF_GATED, ACT_FF_PLAIN = 6, 3, 2
#: KN's integrated-gradient rows per forward (editscope.locate.attribution.knowledge_neurons' token_budget)
KN_TOKEN_BUDGET = 1024
#: statistics pass: rows per batch and tokens per row (editscope.stats.second_moment defaults)
STATS_BATCH_ROWS, STATS_SEQ_LEN = 8, 256
#: flops of a full SVD of an n × n matrix with both singular vector sets (gesdd, order of magnitude)
SVD_FLOPS_PER_N3 = 12.0


# -- the model's shape ---------------------------------------------------------------------------------------------
#: the largest size a plan accepts per config key group: ten times the largest published model's (GPT-3/PaLM-class
#: 96-118 layers, hidden 18,432, vocabularies ~256k); beyond, a config is a typo, and a plan that loops over layers
#: or allocates per hidden unit would run for minutes
SIZE_LIMITS = {"num_hidden_layers": 1_000, "n_layer": 1_000, "num_layers": 1_000, "hidden_size": 200_000,
               "n_embd": 200_000, "d_model": 200_000, "intermediate_size": 1_000_000, "n_inner": 1_000_000,
               "ffn_dim": 1_000_000, "vocab_size": 10_000_000, "num_attention_heads": 10_000, "n_head": 10_000}


def _first(config, keys: tuple[str, ...], where: str) -> int | None:
    """The first of ``keys`` the config sets, checked to be a positive integer (a zero or negative size would plan
    nonsense, a float would be truncated) no larger than :data:`SIZE_LIMITS` allows; None when it sets none."""
    for key in keys:
        value = getattr(config, key, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EditscopeError(f"{where}: config key {key!r}: expected a positive integer, got {value!r}")
        limit = SIZE_LIMITS.get(key)
        if limit is not None and value > limit:
            raise EditscopeError(f"{where}: config key {key!r}: {value:,} is beyond what a plan accepts ({limit:,}: "
                                 "ten times the largest published model's); a typo?")
        return value
    return None


#: what a plan reads from a model's own config.json (any key of each group): transformers would fill a missing one
#: with its class default, the size of some other model
_REQUIRED_SIZES = {"layer count": ("num_hidden_layers", "n_layer", "num_layers"),
                   "hidden size": ("hidden_size", "n_embd", "d_model"),
                   "attention head count": ("num_attention_heads", "n_head"), "vocabulary size": ("vocab_size",),
                   "MLP width": ("intermediate_size", "n_inner", "ffn_dim")}
#: keys that may be null when present (GPT-2's ``n_inner: null`` is its rule, 4 x hidden)
_NULLABLE = frozenset({"intermediate_size", "n_inner", "ffn_dim"})


def _check_config_file(path: Path) -> None:
    """A folder's ``config.json`` is a JSON object that names the model type and the sizes a plan reads (also under
    ``text_config``); otherwise one line naming the file and the key."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise EditscopeError(f"{path}: not readable JSON ({type(exc).__name__}); expected a model's config") from None
    if not isinstance(raw, dict):
        raise EditscopeError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    if not isinstance(raw.get("model_type"), str) or not raw["model_type"]:
        raise EditscopeError(f"{path}: key 'model_type': expected the model's type (a string, e.g. 'llama'), got "
                             f"{raw.get('model_type')!r}")
    scopes = [raw] + ([raw["text_config"]] if isinstance(raw.get("text_config"), dict) else [])
    for what, keys in _REQUIRED_SIZES.items():
        if not any(scope.get(k) is not None or (k in _NULLABLE and k in scope) for scope in scopes for k in keys):
            raise EditscopeError(f"{path}: names no {what} (key {' or '.join(repr(k) for k in keys)}); a plan "
                                 "needs the model's own value")


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a causal LM that its edit costs depend on, from its config (see :func:`model_shape`).
    ``family`` is editscope's architecture family (None: editscope has no map for this model_type, so it cannot edit
    it; the numbers are still predicted)."""

    name: str
    model_type: str
    family: str | None
    n_layers: int
    hidden: int
    mlp: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    n_params: int
    gated: bool
    tied: bool

    @property
    def block_params(self) -> int:
        """Parameters of one block (all but the embeddings and an untied LM head, spread over the blocks)."""
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return max(1, (self.n_params - embed) // self.n_layers)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_config(name_or_path: str):
    """The transformers config of a registry name, a local folder or a hub id whose ``config.json`` is in the local
    hub cache (fetched when the hub is reachable and ``HF_HUB_OFFLINE`` is not set). No weights are read. A config
    transformers cannot read is a one-line error naming it."""
    try:
        return _read_config(name_or_path)
    except EditscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 (transformers' and huggingface_hub's errors for a config they refuse)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise EditscopeError(f"{name_or_path}: cannot read its config.json ({type(exc).__name__}: {first})") from None


def _read_config(name_or_path: str):
    from transformers import AutoConfig

    from editscope.lm.loading import GGUF_MODELS, is_prepared

    text = str(name_or_path or "").strip()
    if not text:
        raise EditscopeError("model name is empty")
    if text.startswith("tiny-"):
        from editscope.lm.tiny import TINY_FAMILIES, _configs

        family = text[len("tiny-"):]
        if family not in TINY_FAMILIES:
            raise EditscopeError(f"no tiny model for family {family!r}; available: {', '.join(TINY_FAMILIES)}")
        return _configs()[family]()
    if text in GGUF_MODELS:
        if not is_prepared(text):
            raise EditscopeError(f"model {text!r} is not converted yet (its config comes from the conversion): run "
                                 f"editscope models prepare {text}")
        return AutoConfig.from_pretrained(GGUF_MODELS[text].folder(text))
    path = Path(text).expanduser()
    if path.is_dir():
        if path.joinpath("config.json").is_file():
            _check_config_file(path / "config.json")
            return AutoConfig.from_pretrained(path)
        raise EditscopeError(f"{path}: not a Hugging Face model folder (no config.json)")
    from editscope.lm.hub import _offline, is_hub_id

    if not is_hub_id(text):
        raise EditscopeError(f"unknown model {text!r}: not a registry name, a folder holding config.json or a hub id")
    try:
        from huggingface_hub import hf_hub_download

        config_file = hf_hub_download(text, "config.json", local_files_only=_offline())
    except Exception as exc:  # noqa: BLE001 (offline, not cached, gated or unknown repo)
        why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise EditscopeError(f"model {text!r}: no config.json in the local hub cache ({why}); copy the model's "
                             "config.json into a folder and pass --model DIR") from None
    return AutoConfig.from_pretrained(Path(config_file).parent)


def count_parameters(config, where: str = "") -> int:
    """Parameters of the model ``config`` describes (tied weights once), built on the meta device: no memory, no
    weights. A model type transformers cannot build is an error naming it (and ``where`` the config came from)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 (whatever a model class raises on a config it cannot build)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        prefix = f"{where}: " if where else ""
        kind = getattr(config, "model_type", None)
        raise EditscopeError(f"{prefix}transformers cannot build model_type {kind!r} from this config: "
                             f"{first}") from None
    return sum(p.numel() for p in model.parameters())


def shape_of_config(config, name: str = "") -> ModelShape:
    """:class:`ModelShape` of a transformers config (any model_type transformers knows)."""
    from editscope.lm.archs import arch_for_config

    text = getattr(config, "text_config", None)
    config = text if text is not None and getattr(config, "num_hidden_layers", None) is None else config
    try:
        family: str | None = arch_for_config(config).family
    except EditscopeError:
        family = None
    where = name or str(config.model_type)
    n_layers = _first(config, ("num_hidden_layers", "n_layer", "num_layers"), where)
    hidden = _first(config, ("hidden_size", "n_embd", "d_model"), where)
    vocab = _first(config, ("vocab_size",), where)
    if n_layers is None or hidden is None or vocab is None:
        raise EditscopeError(f"{where}: config has no layer count, hidden size or vocabulary size")
    mlp = _first(config, ("intermediate_size", "n_inner", "ffn_dim"), where) or 4 * hidden
    n_heads = _first(config, ("num_attention_heads", "n_head"), where) or 1
    n_kv = _first(config, ("num_key_value_heads",), where) or n_heads
    head_dim = _first(config, ("head_dim",), where) or hidden // n_heads
    act = str(getattr(config, "hidden_act", None) or getattr(config, "activation_function", "") or "")
    gated = config.model_type not in ("gpt2", "gptj", "gpt_neox", "opt", "gpt_neo", "bloom", "falcon") \
        and act not in ("gelu_new",)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return ModelShape(name=name or str(getattr(config, "_name_or_path", "") or config.model_type),
                      model_type=str(config.model_type), family=family, n_layers=n_layers, hidden=hidden, mlp=mlp,
                      n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, vocab=vocab,
                      n_params=count_parameters(config, where), gated=gated, tied=tied)


def model_shape(name_or_path: str) -> ModelShape:
    """:class:`ModelShape` of a registry name, local folder or cached hub id (see :func:`read_config`)."""
    return shape_of_config(read_config(name_or_path), str(name_or_path))


# -- hyperparameters ---------------------------------------------------------------------------------------------
def plan_hparams(method: str, shape: ModelShape, model: str, path: str | None = None,
                 overrides: Mapping[str, Any] | None = None):
    """The hparams an edit of ``model`` with ``method`` would use: ``path``, else the shipped file, else the derived
    defaults (layers by relative depth; families without a published reference take LLaMA's). An editor with no
    derivation rule plans with the layers its hparams class declares for that case (``PLAN_LAYERS``: KN all layers,
    as Dai et al.; MEND the last three, its default edit layers), with a note saying so. Returns (hparams, note)."""
    import warnings

    from editscope.edit.hparams import DerivedHParamsWarning, load_yaml, plan_layers, resolve_hparams
    from editscope.edit.registry import get_editor

    editor = get_editor(method)
    overrides = dict(overrides or {})
    if path is not None:
        return load_yaml(path, editor.hparams_class, overrides or None, shape.n_layers), f"hparams from {path}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DerivedHParamsWarning)
        try:
            hp = resolve_hparams(method, editor.hparams_class, model, (shape.family or "llama", shape.n_layers),
                                 overrides or None)
        except EditscopeError:
            layers = plan_layers(editor.hparams_class, shape.n_layers)
            if layers is None:
                raise
            hp = editor.hparams_class.from_dict({"layers": layers, **overrides}, f"<{method} defaults>")
            return hp, f"no {method} hparams for this model: {method}'s defaults with layers {_span(layers)}"
    derived = [str(w.message) for w in caught if issubclass(w.category, DerivedHParamsWarning)]
    return hp, (f"derived hparams: layers {_span(hp.layers)}" if derived else "shipped hparams")


def _span(layers) -> str:
    layers = list(layers)
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ",".join(map(str, layers))


def converted_cached(model: str, dtype: str | None) -> bool:
    """Whether ``model`` loads from a cache already in ``dtype`` (a registry model's lower-precision folder,
    :func:`editscope.lm.loading.prepare`): its load then reads the weights as stored, not float32 first."""
    from editscope.lm.device import resolve_dtype
    from editscope.lm.loading import GGUF_MODELS, is_prepared

    precision = resolve_dtype(dtype)
    return precision != resolve_dtype("float32") and model in GGUF_MODELS and is_prepared(model, precision)


def stats_cached(model: str, hp, dtype: str | None) -> bool:
    """Whether a statistics cache folder for this model exists at the hparams' budget (a registry or folder model
    whose fingerprint is known without loading, in ``dtype`` the fingerprint :func:`editscope.lm.device.place`
    gives it; otherwise False: the plan then counts the statistics pass)."""
    from pathlib import Path

    from editscope.lm.device import precision_fingerprint, resolve_dtype
    from editscope.lm.loading import FINGERPRINT_FILE, GGUF_MODELS
    from editscope.paths import home

    if not hp.stats_layers():
        return False
    suffix = "-f32" if hp.stats_dtype() == "float32" else ""
    folder = GGUF_MODELS[model].folder(model) if model in GGUF_MODELS else Path(model).expanduser()
    stamp = folder / FINGERPRINT_FILE
    if not stamp.is_file():
        return False
    fingerprint, precision = stamp.read_text().strip(), resolve_dtype(dtype)
    if precision != resolve_dtype("float32"):
        fingerprint = precision_fingerprint(fingerprint, precision)
    root = home() / "stats" / fingerprint
    budget = f"-b{hp.stats_tokens()}-"
    if not root.is_dir():
        return False
    return any(budget in d.name and d.name.endswith(suffix) and (suffix or not d.name.endswith("-f32"))
               and all((d / f"layer{la}.safetensors").is_file() for la in hp.stats_layers())
               for d in root.glob("*") if d.is_dir())


# -- the prediction ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """One memory term: ``name`` (see the module docstring), bytes, the phase it belongs to (load, statistics,
    edit; ``all`` for the runtime), where it lives (``device``: the model's device; ``host``) and how it was
    counted."""

    name: str
    bytes: int
    phase: str
    where: str
    how: str

    def during(self, phase: str) -> bool:
        """Whether the term is held during ``phase`` (``phase`` may list several, comma-separated)."""
        return self.phase == "all" or phase in self.phase.split(",")


@dataclass(frozen=True)
class Rates:
    """Matmul rates in FLOP/s: ``matmul`` in the model's dtype at the edit's row shape, ``fp64`` for the solves, and
    how they were obtained (``measured`` or ``given``)."""

    matmul: float
    fp64: float
    how: str = "given"


@dataclass
class Plan:
    """A predicted edit: memory terms, phases, peak, available memory, time and advice (see :func:`plan_edit`)."""

    model: ModelShape
    method: str
    dtype: str
    device: str
    requests: int
    vstar_batch: int | None
    stats_cached: bool
    hparams_note: str
    layers: list[int]
    terms: list[Term]
    editable: bool
    held: int = 0  # edits already in the editor's state (a memory editor's codebook or memories)
    converted: bool = False  # the weights are read from a cache already in ``dtype`` (no float32 load)
    notes: list[str] = field(default_factory=list)
    available: int | None = None
    host_available: int | None = None
    flops: dict[str, float] = field(default_factory=dict)
    rates: Rates | None = None
    advice: list[str] = field(default_factory=list)
    #: tokens of one batched v*/z (or training) forward: the row count of the matmuls the time is counted at
    batch_tokens: int = 1

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def phases(self, where: str = "device") -> dict[str, int]:
        """Bytes per phase on ``where`` (``device``; ``host`` is the same as device on a CPU)."""
        places = {"device", "host"} if not self.on_cuda else {where}
        out = {}
        for phase in ("load", "statistics", "edit"):
            out[phase] = sum(t.bytes for t in self.terms if t.where in places and t.during(phase))
        return out

    @property
    def peak(self) -> int:
        return max(self.phases("device").values())

    @property
    def host_peak(self) -> int:
        return max(self.phases("host").values())

    @property
    def peak_phase(self) -> str:
        phases = self.phases("device")
        return max(phases, key=phases.get)

    def biggest(self) -> Term:
        """The largest term of the peak phase on the device (the one to act on first)."""
        places = {"device", "host"} if not self.on_cuda else {"device"}
        return max((t for t in self.terms if t.where in places and t.during(self.peak_phase)),
                   key=lambda t: t.bytes)

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits the available memory (None: not known)."""
        if self.available is None:
            return None
        ok = self.peak <= self.available
        if self.on_cuda and self.host_available is not None:
            ok = ok and self.host_peak <= self.host_available
        return ok

    def seconds(self) -> dict[str, float] | None:
        """Predicted seconds of each counted computation (None without rates)."""
        if self.rates is None:
            return None
        return {k: v / (self.rates.fp64 if k.endswith("fp64") else self.rates.matmul) for k, v in self.flops.items()}

    def seconds_per_edit(self) -> float | None:
        secs = self.seconds()
        if secs is None:
            return None
        return sum(v for k, v in secs.items() if not k.startswith("once"))

    def seconds_first_edit(self) -> float | None:
        """Seconds of the first edit of a run: per edit plus what is computed once (statistics not cached,
        AlphaEdit's projectors)."""
        secs = self.seconds()
        return None if secs is None else sum(secs.values())

    def to_dict(self) -> dict[str, Any]:
        secs = self.seconds()
        return {
            "model": self.model.to_dict(), "method": self.method, "dtype": self.dtype, "device": self.device,
            "requests": self.requests, "held": self.held, "vstar_batch": self.vstar_batch or "auto",
            "stats_cached": self.stats_cached, "converted": self.converted,
            "hparams": self.hparams_note, "layers": self.layers, "editable": self.editable, "notes": self.notes,
            "terms": [asdict(t) for t in self.terms], "phases": self.phases("device"),
            "host_phases": self.phases("host") if self.on_cuda else None,
            "peak_bytes": self.peak, "peak_phase": self.peak_phase, "biggest": self.biggest().name,
            "available_bytes": self.available, "host_available_bytes": self.host_available, "fits": self.fits,
            "flops": self.flops, "rates": asdict(self.rates) if self.rates else None,
            "seconds": secs, "seconds_per_edit": self.seconds_per_edit(),
            "seconds_first_edit": self.seconds_first_edit(), "advice": self.advice,
        }


def _act_per_token_layer(shape: ModelShape, context: int) -> int:
    """Values kept for backward per token and block (see :data:`ACT_D`), attention probabilities over ``context``
    keys included."""
    ff = ACT_FF_GATED if shape.gated else ACT_FF_PLAIN
    return ACT_D * shape.hidden + ff * shape.mlp + 2 * shape.n_heads * context


def vstar_tokens(hp, requests: int, vstar_batch: int | None) -> tuple[int, int, int, int]:
    """(requests per batched forward, padded row tokens per request, suffix tokens per request, row width) of the
    v*/z optimisation of ``requests`` requests (see :data:`PROMPT_TOKENS`)."""
    specs = getattr(hp, "context_templates", None) or [[10, 5]]
    prefixes = sum(int(n) for _, n in specs)
    width = max(int(t) for t, _ in specs) + PROMPT_TOKENS + TARGET_TOKENS
    rows = prefixes + 1 + 1  # the context prefixes, the bare prompt, the essence row
    per_request = rows * width
    cap = max(1, ENGINE_TOKEN_BUDGET // per_request)
    group = min(requests, cap if vstar_batch is None else min(cap, vstar_batch))
    suffix = (prefixes + 1) * SUFFIX_TOKENS + ESSENCE_TOKENS
    return max(1, group), per_request, suffix, width


@dataclass(frozen=True)
class _Edit:
    """What every editor's terms are computed from (see :func:`plan_edit`)."""

    shape: ModelShape
    method: str
    hp: Any
    b: int  # bytes per parameter / activation in the model's dtype
    requests: int
    layers: list[int]
    stats_dtype: str
    group: int
    per_request: int
    suffix: int
    width: int
    held: int = 0  # edits already in the editor's sequential state

    @property
    def targets(self) -> list[tuple[int, str]]:
        """Every (layer, MLP matrix) written (the down projection at each layer unless the hparams name others)."""
        return self.hp.written() or [(layer, "down") for layer in self.layers]

    @property
    def matrices(self) -> list[str]:
        """The MLP matrices written (the down projection unless the hparams name others)."""
        return list(dict.fromkeys(m for _, m in self.targets))

    @property
    def n_edit(self) -> int:
        """Edited weight matrices (gate, up and down projections are all d x d_ff)."""
        return len(self.targets)

    @property
    def after(self) -> int:
        """Blocks the optimisation runs through (and back)."""
        return self.shape.n_layers - self.layers[0]


class NoPlan(EditscopeError):
    """The method has no memory model here (a plan would be another editor's)."""


def plan_edit(shape: ModelShape, method: str, hp, *, dtype: str = "float32", device: str = "cpu", requests: int = 1,
              vstar_batch: int | None = None, stats_cached: bool = False, hparams_note: str = "",
              rates: Rates | None = None, available: int | None = None,
              host_available: int | None = None, held: int = 0, converted: bool = False) -> Plan:
    """The predicted memory terms and FLOPs of one edit of ``requests`` requests with ``method`` and ``hp`` (see the
    module docstring for every term). ``stats_cached``: C is on disk already (no statistics pass). ``held``: edits
    already in the editor's sequential state (a memory editor's codebook or side memories grow with them).
    ``converted``: the weights are read from a cache already in ``dtype`` (:func:`converted_cached`)."""
    from editscope.edit.registry import get_editor

    if dtype not in DTYPE_BYTES or dtype == "float64":
        raise EditscopeError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    if requests < 1:
        raise EditscopeError(f"requests must be >= 1, got {requests}")
    if held < 0:
        raise EditscopeError(f"held must be >= 0, got {held}")
    editor = get_editor(method)
    kind = editor.cost  # the editor declares its cost model; never another editor's plan
    if kind is None:
        raise NoPlan(f"no plan for {method}: the editor declares no cost model (Editor.cost), so editscope has no "
                     f"memory model of its {editor.kind} edit (its run is not checked against the memory available)")
    if kind not in COST_MODELS:
        raise EditscopeError(f"{method}: cost model {kind!r} is not one of {', '.join(sorted(COST_MODELS))}")
    b = DTYPE_BYTES[dtype]
    group, per_request, suffix, width = vstar_tokens(hp, requests, vstar_batch)
    edit = _Edit(shape, method, hp, b, requests, sorted(hp.layers), editor.stats_dtype(hp), group, per_request,
                 suffix, width, held)
    terms: list[Term] = [
        Term("runtime", RUNTIME_HOST, "all", "host", "Python, libraries, tokenizer, kernels (measured)"),
        # converted from float32, the weights are made while the float32 load is still resident (module docstring)
        Term("weights", shape.n_params * b, "statistics,edit" if dtype == "float32" or converted
             else "load,statistics,edit", "device", f"{shape.n_params:,} parameters x {b} B"),
        Term("load", shape.n_params * b, "load", "host", f"the {dtype} cache, read as it is stored")
        if converted else Term("load", shape.n_params * 4, "load", "host",
                               "editscope loads float32 on the host, then converts"),
    ]
    if str(device).startswith("cuda"):
        terms.append(Term("runtime", RUNTIME_CUDA, "all", "device", "CUDA context, cuBLAS workspace, allocator slack"))
    editable, notes = _family_notes(shape, method, editor)
    flops: dict[str, float] = {}
    stats_layers = editor.stats_layers(hp)
    if stats_layers and not stats_cached:
        _statistics(edit, stats_layers, editor.stats_tokens(hp), terms, flops)
    COST_MODELS[kind](edit, terms, flops)
    plan = Plan(model=shape, method=method, dtype=dtype, device=str(device), requests=requests, converted=converted,
                vstar_batch=vstar_batch, stats_cached=stats_cached, hparams_note=hparams_note, layers=edit.layers,
                terms=terms, editable=editable, notes=notes, available=available, host_available=host_available,
                flops=flops, rates=rates, batch_tokens=group * suffix, held=held)
    plan.advice = advice(plan, hp)
    return plan


def _family_notes(shape: ModelShape, method: str, editor) -> tuple[bool, list[str]]:
    """Whether ``editor`` can edit the model's family, and the notes that say why not."""
    if shape.family is None:
        return False, [f"editscope has no architecture map for model_type {shape.model_type!r}: it cannot edit this "
                       "model yet (the numbers are predicted from the config)"]
    if not editor.supports(shape.family):
        return False, [f"{method} does not support the {shape.family!r} family (its MLP output is not added linearly "
                       "to the residual stream)"]
    return True, []


def _statistics(edit: _Edit, stats_layers: list[int], budget: int, terms: list[Term], flops: dict) -> None:
    """The statistics pass: per layer a float64 sum and mean, or a float32 sum and compensation; one chunk; a batch."""
    shape, ff, n_s = edit.shape, edit.shape.mlp, len(stats_layers)
    batch_tokens = STATS_BATCH_ROWS * STATS_SEQ_LEN
    act = (batch_tokens * (4 * shape.hidden + 3 * ff) * edit.b
           + STATS_BATCH_ROWS * shape.n_heads * STATS_SEQ_LEN ** 2 * 4)
    per = STATS_BYTES[edit.stats_dtype]
    pair = "(sum + mean)" if edit.stats_dtype == "float64" else "(sum + compensation)"
    terms.append(Term("statistics", 2 * n_s * ff * ff * per + ff * ff * 4 + act, "statistics", "device",
                      f"{n_s} layer(s) x {pair} x d_ff^2 x {per} B + one float32 kk^T chunk + one "
                      f"{STATS_BATCH_ROWS}x{STATS_SEQ_LEN}-token no-grad batch"))
    upto = max(stats_layers) + 1
    flops["once: statistics"] = budget * (2.0 * shape.block_params * upto)
    flops["once: statistics"] += budget * 2.0 * ff * ff * n_s  # kk^T products (float32)


_SOLVES = {"rome": "LU copy of C", "memit": "lambda C, K K^T, sum, LU",
           "alphaedit": "SVD of C: A's copy, U, V^T, gesdd's 4 n^2 workspace, the kept columns"}


def _patch(edit: _Edit, terms: list[Term]) -> None:
    """The patch of an editor that writes whole matrices (KN writes rows of neurons: none)."""
    shape = edit.shape
    terms.append(Term("patch", edit.n_edit * shape.hidden * shape.mlp * (4 + edit.b + 8), "edit", "device",
                      f"{edit.n_edit} edited weight(s) x (float32 ΔW + the pre-edit copy a patch carries + the "
                      "float64 solve result)"))


def _vstar_editor(kind: str):
    """ROME, MEMIT (and PRUNE, RECT), AlphaEdit (and EVK-Edit): C, projector, solve, the v*/z optimisation."""

    def terms_of(edit: _Edit, terms: list[Term], flops: dict) -> None:
        shape, ff, n_edit = edit.shape, edit.shape.mlp, edit.n_edit
        uses_c = kind != "rome" or bool(getattr(edit.hp, "mom2_adjustment", True))  # ROME without C⁻¹: no C
        held = (1 if kind == "rome" else n_edit) if uses_c else 0
        per = STATS_BYTES[edit.stats_dtype]
        terms.append(Term("C", held * ff * ff * per, "edit", "device",
                          f"{held} layer(s) x d_ff^2 x {per} B ({edit.stats_dtype})"))
        if kind == "alphaedit":
            terms.append(Term("projector", 2 * n_edit * ff * ff * 8, "edit", "device",
                              f"{n_edit} layer(s) x (P + K_p K_p^T) x d_ff^2 x 8 B"))
        solve = {"rome": 1 if uses_c else 0, "memit": 3, "alphaedit": 8}[kind]
        solve_term = Term("solve", solve * ff * ff * 8, "edit", "device", f"{solve} x d_ff^2 x 8 B ({_SOLVES[kind]})")
        tokens = edit.group * edit.suffix
        act = tokens * edit.after * _act_per_token_layer(shape, edit.width) * edit.b
        vstar = Term("vstar", act + tokens * shape.vocab * 4 * 3, "edit", "device",
                     f"{edit.group} request(s) per forward x {edit.suffix} suffix tokens through {edit.after} blocks "
                     "+ float32 logits x 3")
        # the optimisation and the solve do not overlap: keep the larger as the edit phase's transient
        smaller = vstar if vstar.bytes < solve_term.bytes else solve_term
        terms.extend(replace(t, phase="edit (not at peak)") if t is smaller else t for t in (solve_term, vstar))
        steps = int(getattr(edit.hp, "v_steps", 20))
        per_token = 4.0 * shape.block_params * edit.after + 4.0 * shape.hidden * shape.vocab
        flops["v*/z optimisation"] = math.ceil(edit.requests / edit.group) * steps * tokens * per_token
        flops["keys and initial forwards"] = (3.0 * edit.requests * edit.per_request * 2.0 * shape.block_params
                                              * shape.n_layers)
        n3 = float(ff) ** 3
        flops["solve fp64"] = {"rome": edit.requests * (2.0 / 3.0) * n3 if uses_c else 0.0,
                               "memit": n_edit * ((2.0 / 3.0) * n3 + 2.0 * ff * ff * edit.requests),
                               "alphaedit": n_edit * ((2.0 / 3.0) * n3 + 2.0 * n3)}[kind]
        if kind == "alphaedit":
            flops["once: projector fp64"] = n_edit * SVD_FLOPS_PER_N3 * n3
        _patch(edit, terms)

    return terms_of


def _ultraedit(edit: _Edit, terms: list[Term], flops: dict) -> None:
    shape = edit.shape
    n_in = {m: shape.mlp if m == "down" else shape.hidden for m in edit.matrices}  # each matrix's key width
    widest = max(n_in.values())
    terms.append(Term("solve", 3 * widest * widest * 8, "edit", "device",
                      "3 x in^2 x 8 B (K^T K + I and its LU, float64; in = d_ff for down, d for gate/up)"))
    tokens = edit.requests * (PROMPT_TOKENS + TARGET_TOKENS)
    terms.append(Term("vstar", tokens * edit.after * _act_per_token_layer(shape, edit.width) * edit.b
                      + tokens * shape.vocab * 12, "edit", "device", "one forward/backward of the edit prompts"))
    flops["forward/backward"] = tokens * (6.0 * shape.block_params * edit.after)
    flops["solve fp64"] = sum((2.0 / 3.0) * float(n_in[m]) ** 3 for _, m in edit.targets)
    _patch(edit, terms)


def _ft(edit: _Edit, terms: list[Term], flops: dict) -> None:
    shape, b, n_edit = edit.shape, edit.b, edit.n_edit
    weight = shape.hidden * shape.mlp
    terms.append(Term("optimizer", 4 * n_edit * weight * b, "edit", "device",
                      f"{n_edit} weight(s) x (grad + Adam m, v + pre-edit copy) x {b} B"))
    tokens = edit.requests * (PROMPT_TOKENS + TARGET_TOKENS)
    act = tokens * edit.after * _act_per_token_layer(shape, PROMPT_TOKENS + TARGET_TOKENS) * b
    terms.append(Term("vstar", act + tokens * shape.vocab * 12, "edit", "device",
                      f"{tokens} row tokens through {edit.after} blocks + float32 logits x 3"))
    steps = int(getattr(edit.hp, "steps", 25))
    flops["training steps"] = steps * tokens * (4.0 * shape.block_params * edit.after
                                                + 4.0 * shape.hidden * shape.vocab + 2.0 * weight * n_edit)
    _patch(edit, terms)


def _kn(edit: _Edit, terms: list[Term], flops: dict) -> None:
    shape, b, n_edit = edit.shape, edit.b, edit.n_edit
    steps = int(getattr(edit.hp, "steps", 20))
    per_forward = min(n_edit, max(1, KN_TOKEN_BUDGET // steps))
    rows = per_forward * steps
    prompt = PROMPT_TOKENS
    # per row and block: its activations, and the prompt's keys/values copied per row (the cache's concat, kept
    # for backward by the attention; SDPA takes grouped keys/values as they are)
    kv = prompt * 2 * shape.n_kv_heads * shape.head_dim * b
    act = rows * edit.after * (_act_per_token_layer(shape, prompt) * b + kv)
    terms.append(Term("ig", act + rows * shape.vocab * 4 * 3, "edit", "device",
                      f"{rows} one-token rows ({per_forward} layer(s) x {steps} steps) through "
                      f"{edit.after} blocks, keys/values of a {prompt}-token prompt per row, logits"))
    n_prompts = len(getattr(edit.hp, "prefixes", [""]))
    chunks = math.ceil(n_edit / per_forward)
    flops["integrated gradients"] = n_prompts * chunks * rows * (4.0 * shape.block_params * shape.n_layers
                                                                 + 4.0 * shape.hidden * shape.vocab)


def _mend(edit: _Edit, terms: list[Term], flops: dict) -> None:
    shape, b, n_edit, hp = edit.shape, edit.b, edit.n_edit, edit.hp
    d, ff = shape.hidden, shape.mlp
    rank = int(getattr(hp, "rank", 64))
    dim = d + ff
    nets = (1 if getattr(hp, "shared", True) else n_edit) * (4 * rank * dim + dim) * 4 \
        + n_edit * (4 * dim + 1) * 4 + n_edit * 3 * dim * 8
    grads = n_edit * d * ff * (b + 4)
    tokens = edit.requests * (PROMPT_TOKENS + TARGET_TOKENS)
    act = tokens * edit.after * _act_per_token_layer(shape, PROMPT_TOKENS + TARGET_TOKENS) * b
    terms.append(Term("mend", nets + grads, "edit", "device",
                      f"editor networks (rank {rank}, dim {dim}) + {n_edit} weight gradient(s) and float32 ΔW"))
    terms.append(Term("vstar", act + tokens * shape.vocab * 12, "edit", "device",
                      "one forward/backward of the edit prompt"))
    flops["forward/backward"] = tokens * (6.0 * shape.block_params * edit.after + 4.0 * d * shape.vocab)
    _patch(edit, terms)


def _grace(edit: _Edit, terms: list[Term], flops: dict) -> None:
    """GRACE (Hartvigsen et al. 2023, Algorithm 1): a codebook of at most one entry per request (float32 key of
    width d_ff and its float64 search copy with its squared norm, float32 value of width d, float64 radius), in
    rooms up to twice the rows; each value trained on its prompt and target through the blocks from its layer on,
    the head at the target positions only. No weight is written (no patch)."""
    shape, n = edit.shape, edit.requests
    row, entries = shape.mlp * (4 + 8) + 8 + shape.hidden * 4 + 8, edit.held + n
    terms.append(Term("codebook", 2 * entries * row, "edit", "host",
                      f"{entries} entries x (key d_ff x (4 + 8) B + norm + value d x 4 B + radius) x 2 (spare room)"))
    tokens = n * (PROMPT_TOKENS + TARGET_TOKENS)
    act = tokens * edit.after * _act_per_token_layer(shape, PROMPT_TOKENS + TARGET_TOKENS) * edit.b
    terms.append(Term("vstar", act + n * TARGET_TOKENS * shape.vocab * 4 * 3, "edit", "device",
                      f"{n} request row(s) through {edit.after} blocks + float32 logits x 3 at the targets"))
    steps = edit.hp.n_iter  # at most: a value stops once its loss is below stop_loss
    flops["keys forward"] = n * PROMPT_TOKENS * 2.0 * shape.block_params * (edit.layers[0] + 1)
    flops["value training (at most n_iter steps)"] = steps * (tokens * 4.0 * shape.block_params * edit.after
                                                              + n * TARGET_TOKENS * 4.0 * shape.hidden * shape.vocab)


def _wise(edit: _Edit, terms: list[Term], flops: dict) -> None:
    """WISE (Wang et al. 2024, §2.3): the side memories in force after ``requests`` edits from an empty memory
    (shards saved every ``save_freq`` edits, merged every ``merge_freq``; the current shard and its mask) and the
    edit's stacked copy of them; one edit's training (W'_v, its gradient, gradient mask and bounds: 5 float32 d x
    d_ff) on the edit's rows (one per context template) and one irrelevant row: the module's inputs and outputs
    recorded for every row, the edit rows through the blocks after the layer, the head at the targets."""
    shape, hp, n = edit.shape, edit.hp, edit.held + edit.requests  # n: the edits in the memory after this one
    weight = shape.hidden * shape.mlp
    merged, saved, current = hp.memories_after(n)
    memories = saved + merged + current
    terms.append(Term("side memory", memories * weight * 4 * 2 + current * weight, "edit", "host",
                      f"{memories} side memor(ies) x d x d_ff x 4 B, held and stacked in the edit, + the shard's "
                      "mask (1 B)"))
    terms.append(Term("optimizer", 5 * weight * 4, "edit", "device",
                      "W'_v, its gradient, the gradient mask and two bounds: 5 x d x d_ff x 4 B"))
    edit_rows = 1 + sum(int(k) for _, k in hp.context_templates)
    width = max(int(t) for t, _ in hp.context_templates) + PROMPT_TOKENS + TARGET_TOKENS
    tokens = edit_rows * width
    after = edit.after - 1  # the blocks after the side memory's
    recorded = (edit_rows + 1) * width * (shape.mlp + 2 * shape.hidden) * 4
    act = tokens * after * _act_per_token_layer(shape, width) * edit.b
    terms.append(Term("vstar", recorded + act + edit_rows * TARGET_TOKENS * shape.vocab * 4 * 3, "edit", "device",
                      f"{edit_rows} edit rows of {width} tokens through {after} blocks, the module's input and "
                      "outputs for every row, float32 logits x 3 at the targets"))
    steps = hp.n_iter
    flops["side memory training (at most n_iter steps)"] = edit.requests * steps * (
        tokens * 4.0 * shape.block_params * after + (edit_rows + 1) * width * 4.0 * weight
        + edit_rows * TARGET_TOKENS * 4.0 * shape.hidden * shape.vocab)
    flops["keys forward"] = edit.requests * (edit_rows + 1) * width * 2.0 * shape.block_params * (edit.layers[0] + 1)


def _context(edit: _Edit, terms: list[Term], flops: dict) -> None:
    """PROMPT, IKE, retrieval: an edit stores text; nothing beyond the runtime and the weights. Their cost is in
    scoring (longer prompts), which no plan counts."""


#: the editor-specific memory terms and FLOPs of each cost model an editor may declare (``Editor.cost``)
COST_MODELS = {"rome": _vstar_editor("rome"), "memit": _vstar_editor("memit"), "alphaedit": _vstar_editor("alphaedit"),
                "ultraedit": _ultraedit, "ft": _ft, "kn": _kn, "mend": _mend, "grace": _grace, "wise": _wise,
                "context": _context}


def _float32_stats_saving(plan: Plan, hp) -> int:
    """Bytes of the peak phase that ``mom2_dtype: float32`` saves (0 when the statistics are float32 already): half
    of C in the edit phase, half of the float64 sum and mean per layer in the statistics pass."""
    if hp.stats_dtype() != "float64":
        return 0
    per_layer = plan.model.mlp ** 2 * 4
    if plan.peak_phase == "statistics":
        return 2 * len(hp.stats_layers()) * per_layer
    held = next((t.bytes for t in plan.terms if t.name == "C"), 0)
    return held // 2 if plan.peak_phase == "edit" else 0


def advice(plan: Plan, hp) -> list[str]:
    """What to change when the plan does not fit (empty when it fits or nothing is known), each with its saving."""
    if plan.fits is not False:
        return []
    out = []
    over = plan.peak - (plan.available or 0)
    gb = lambda n: f"{n / GiB:.1f} GiB"  # noqa: E731
    if plan.dtype == "float32":  # the bfloat16 plan's own peak: on a CPU its load holds both copies, often more
        half = plan_edit(plan.model, plan.method, hp, dtype="bfloat16", device=plan.device, requests=plan.requests,
                         vstar_batch=plan.vstar_batch, stats_cached=plan.stats_cached, held=plan.held,
                         converted=converted_cached(plan.model.name, "bfloat16"))
        if (saved := plan.peak - half.peak) > 0:
            out.append(f"--dtype bfloat16: weights and activations in half the bytes (-{gb(saved)})")
    vstar = next((t for t in plan.terms if t.name == "vstar" and t.during("edit")), None)
    group = vstar_tokens(hp, plan.requests, plan.vstar_batch)[0]
    if vstar is not None and group > 1:
        out.append(f"--vstar-batch 1: one request per v*/z forward instead of {group} "
                   f"(-{gb(vstar.bytes - vstar.bytes // group)})")
    per_layer = {t.name: t.bytes // len(plan.layers) for t in plan.terms if t.name in ("C", "projector")}
    if per_layer.get("C") and len(plan.layers) > 1:  # the plan's own terms: whatever editor holds C per layer
        out.append(f"fewer edited layers ({len(plan.layers)} now, --set layers=[...]): each holds "
                   f"{gb(sum(per_layer.values()))} of C{', P and K_p K_p^T' if 'projector' in per_layer else ''}")
    if plan.peak_phase == "statistics":
        out.append("compute the statistics once where they fit (editscope stats compute) and import them "
                   "(editscope stats import): the statistics pass is the peak; a smaller statistics budget "
                   "(mom2_tokens) shortens that pass but does not shrink C")
    if plan.peak_phase == "load":
        out.append(f"the load is the peak: editscope reads the model in float32 on the host before converting "
                   f"it to {plan.dtype} ({gb(plan.model.n_params * 4)}, held while the converted copy is made), "
                   "whatever its folder stores (a registry model's cached copy in the dtype, editscope models "
                   "prepare NAME --dtype, is read as stored); this needs a machine with more host memory")
    if saved := _float32_stats_saving(plan, hp):
        out.append(f"statistics in float32 (--set mom2_dtype=float32): halves C and the statistics pass's sums "
                   f"(-{gb(saved)}; C within ~1e-7 relative of float64's, docs/scale.md; the solves and the projector "
                   "stay float64)")
    out.append(f"the plan is {gb(over)} over the {gb(plan.available or 0)} available")
    return out


# -- the device ------------------------------------------------------------------------------------------------------
def available_memory(device: str) -> tuple[int | None, int | None]:
    """(free bytes on ``device``, available host bytes): ``torch.cuda.mem_get_info`` on a GPU; psutil's (else
    /proc/meminfo's) available memory on the host."""
    host = None
    try:
        import psutil

        host = int(psutil.virtual_memory().available)
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
        except OSError:
            host = None
    if str(device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None, host
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free), host
    return host, host


def peak_rss() -> int:
    """This process's peak resident set size in bytes, counted from its ``exec``: ``VmHWM`` of /proc/self/status.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the peak of the memory image an ``exec`` replaces into
    it, and Python's ``subprocess`` starts children by vfork + exec, so a child's ``ru_maxrss`` is at least its
    parent's peak so far (a test worker that has just converted a GGUF). Where there is no /proc, ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _time_matmul(a, b_, min_seconds: float, sync) -> float:
    """FLOP/s of ``a @ b_`` repeated for at least ``min_seconds`` (after one warm-up)."""
    a @ b_
    sync()
    reps, t0 = 0, time.perf_counter()
    while True:
        a @ b_
        reps += 1
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            break
    return 2.0 * a.shape[0] * a.shape[1] * b_.shape[1] * reps / elapsed


def measure_rates(device: str, dtype: str, shape: ModelShape, rows: int = 256, min_seconds: float = 0.25) -> Rates:
    """The device's matmul rate at the edit's shape ([rows, d] @ [d, d_ff] in ``dtype``) and its float64 rate (a
    square matmul of d_ff, at most 2,048 on a CPU); about a second in all."""
    import torch

    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    dt = getattr(torch, dtype)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(rows, shape.hidden, device=dev, dtype=dt, generator=gen)
    w = torch.randn(shape.hidden, shape.mlp, device=dev, dtype=dt, generator=gen)
    matmul = _time_matmul(a, w, min_seconds, sync)
    n = min(shape.mlp, 2048 if dev.type == "cpu" else 8192)
    x = torch.randn(n, n, device=dev, dtype=torch.float64, generator=gen)
    fp64 = _time_matmul(x, x, min_seconds, sync)
    return Rates(matmul=matmul, fp64=fp64, how=f"measured on {device}: {dtype} [{rows}x{shape.hidden}]@"
                                                 f"[{shape.hidden}x{shape.mlp}], float64 [{n}x{n}]^2")


# -- rendering ---------------------------------------------------------------------------------------------------
def _size(n: int) -> str:
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.0f} MiB"


def render(plan: Plan) -> str:
    """The plan as text: the terms by phase, the peak against what is available, time per edit, advice."""
    m = plan.model
    lines = [f"{m.name}: {m.model_type} ({'editscope family ' + m.family if m.family else 'no editscope family'}), "
             f"{m.n_params / 1e9:.2f}B parameters, {m.n_layers} layers, hidden {m.hidden}, MLP {m.mlp}, "
             f"vocab {m.vocab}",
             f"{plan.method} {f'on layers {_span(plan.layers)}' if plan.layers else 'on no layer'} "
             f"({plan.hparams_note}); {plan.requests} request(s)"
             f"{f' after {plan.held} held' if plan.held else ''}, vstar_batch {plan.vstar_batch or 'auto'}; "
             f"{plan.dtype} on {plan.device}"
             + ("; statistics cached" if plan.stats_cached else "; statistics computed"
                if any(t.name == "statistics" for t in plan.terms) else "")]
    lines += [f"note: {n}" for n in plan.notes]
    lines.append("")
    lines.append(f"{'term':<11} {'phase':<19} {'where':<6} {'size':>12}  how")
    for t in plan.terms:
        lines.append(f"{t.name:<11} {t.phase:<19} {t.where:<6} {_size(t.bytes):>12}  {t.how}")
    phases = plan.phases("device")
    lines.append("")
    lines.append("phases: " + ", ".join(f"{k} {_size(v)}" for k, v in phases.items()))
    avail = f" of {_size(plan.available)} available" if plan.available is not None else ""
    verdict = {True: "fits", False: "DOES NOT FIT", None: "available memory unknown"}[plan.fits]
    lines.append(f"peak {_size(plan.peak)} ({plan.peak_phase}; biggest term: {plan.biggest().name}){avail}: {verdict}")
    if plan.on_cuda:
        havail = f" of {_size(plan.host_available)}" if plan.host_available is not None else ""
        lines.append(f"host peak {_size(plan.host_peak)}{havail} "
                     f"({'the cached copy' if plan.converted else 'the float32 load'})")
    secs = plan.seconds()
    if secs is not None:
        lines.append("")
        lines.append(f"time ({plan.rates.how}: {plan.rates.matmul / 1e9:,.3g} GFLOP/s, "
                     f"float64 {plan.rates.fp64 / 1e9:,.3g} GFLOP/s):")
        for k, v in secs.items():
            if plan.flops[k]:
                lines.append(f"  {k:<28} {plan.flops[k] / 1e12:10.3f} TFLOP  {v:10.2f} s")
        lines.append(f"  per edit (matmuls only) {plan.seconds_per_edit():.2f} s; the first edit "
                     f"{plan.seconds_first_edit():.2f} s")
    if plan.advice:
        lines.append("")
        lines.append("to fit:")
        lines += [f"  - {a}" for a in plan.advice]
    return "\n".join(lines)


def to_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2)
