"""Layer statistics as a shareable artefact: list the cache, export layers to one safetensors file, import it.

The cache itself is :mod:`editscope.stats.second_moment`'s (``cache_file``: one file per model fingerprint,
corpus digest, token budget, row length, precision (``stats_dtype``) and layer; metadata with the weights checksum
and a content checksum). An export file holds, per layer L, the tensors ``layer{L}.mom2`` and ``layer{L}.count`` and
in its metadata ``editscope-stats`` (format version), ``fingerprint``, ``mlp_size`` and ``layers`` (JSON: per layer
the cache file's own metadata), and the content digest of all of it (:mod:`editscope.integrity`: checked before
anything is imported; a file without one, exported by an earlier editscope, is refused unless
``--trust-unverified``, and the cache files it fills record where they came from). Import checks the file against
the loaded model — same fingerprint, [mlp, mlp] matrices, the weights checksum each layer was computed under equal to
the model's, content checksums, finite values, a matrix of the recorded precision — and writes each layer into the
cache through the same ``_save`` as a computed one, so the next edit reads it.
A corpus may be text files, a folder of ``.txt`` files, or one field of a JSONL file (extracted once to a text
file under ``home()/corpora`` named by its content digest, so the corpus digest is a function of the text).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from editscope.atomic import atomic_write
from editscope.data.corpus import Corpus
from editscope.errors import EditscopeError
from editscope.integrity import DIGEST_KEY, IntegrityError, seal, verify
from editscope.lm.bundle import Bundle
from editscope.paths import home
from editscope.stats.second_moment import (
    DEFAULT_STATS_DTYPE,
    STATS_DTYPES,
    _content_checksum,
    _save,
    cache_file,
    weights_checksum,
)

FORMAT = "1"


@dataclass(frozen=True)
class CachedStat:
    """One cached layer's statistics (what ``editscope stats list`` prints)."""

    path: str
    fingerprint: str
    model: str
    layer: int
    corpus: str
    token_budget: int
    seq_len: int
    tokens: int
    seconds: float
    bytes: int
    stats_dtype: str = DEFAULT_STATS_DTYPE


def corpus_from(paths: Sequence[str | Path], field: str | None = None) -> Corpus:
    """A :class:`Corpus` from text files, folders of ``.txt`` files, or (with ``field``) JSONL files whose
    records hold the text in ``field``."""
    if not paths:
        return Corpus.default()
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.txt"))
            if not found:
                raise EditscopeError(f"corpus folder {path} holds no .txt files")
            files.extend(found)
        elif not path.is_file():
            raise EditscopeError(f"corpus file not found: {path}")
        elif field is not None:
            files.append(_extract_jsonl(path, field))
        else:
            files.append(path)
    corpus = Corpus.from_files(files)
    corpus.check_text()  # a non-UTF-8 line fails here, before the model loads, not minutes into the statistics
    return corpus


def _extract_jsonl(path: Path, field: str) -> Path:
    """The ``field`` of every JSONL record, one paragraph per line, as a text file keyed by its content."""
    lines: list[str] = []
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                raise EditscopeError(f"{path}:line {number}: not valid UTF-8 JSON") from None
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                raise EditscopeError(f"{path}:line {number}: field {field!r} is missing or not a string")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise EditscopeError(f"{path}:line {number}: field {field!r}: holds a lone surrogate (not text)") \
                    from None
            lines.extend(p for p in (s.strip() for s in value.splitlines()) if p)
    text = "\n".join(lines) + "\n"
    digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
    out = home() / "corpora" / f"{path.stem}-{field}-{digest}.txt"
    if not out.is_file():
        atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return out


def _meta(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as fh:
        return {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}


def list_cached(fingerprint: str | None = None) -> list[CachedStat]:
    """Every readable file of the statistics cache (optionally of one model fingerprint), sorted."""
    root = home() / "stats"
    out = []
    for path in sorted(root.glob("*/*/layer*.safetensors")):
        try:
            meta = _meta(path)
        except Exception:  # noqa: BLE001 (a damaged file is listed by the compute that replaces it, not here)
            continue
        if fingerprint is not None and meta.get("fingerprint") != fingerprint:
            continue
        out.append(CachedStat(str(path), str(meta.get("fingerprint", path.parents[1].name)), str(meta.get("model", "")),
                              int(meta.get("layer", -1)), str(meta.get("corpus", "")),
                              int(meta.get("token_budget", 0)), int(meta.get("seq_len", 0)),
                              int(meta.get("tokens", 0)), float(meta.get("seconds", 0.0)), path.stat().st_size,
                              str(meta.get("stats_dtype", DEFAULT_STATS_DTYPE))))
    return out


def export_stats(fingerprint: str, out: str | Path, *, layers: Sequence[int] | None = None,
                 corpus: str | None = None, token_budget: int | None = None,
                 stats_dtype: str | None = None) -> list[CachedStat]:
    """Write the cached layers of ``fingerprint`` (optionally only ``layers`` / corpus digest ``corpus`` / token
    budget ``token_budget`` / precision ``stats_dtype``) to one safetensors file ``out``. One file holds one
    corpus/budget/row-length/precision setting: when the cache holds several for the chosen layers, the error lists
    them with the option that picks each."""
    chosen = [s for s in list_cached(fingerprint)
              if (layers is None or s.layer in layers) and (corpus is None or s.corpus == corpus)
              and (token_budget is None or s.token_budget == token_budget)
              and (stats_dtype is None or s.stats_dtype == stats_dtype)]
    if not chosen:
        what = (f"{' layers ' + str(list(layers)) if layers else ''}{' corpus ' + corpus if corpus else ''}"
                f"{' budget ' + str(token_budget) if token_budget else ''}")
        raise EditscopeError(f"no cached statistics for fingerprint {fingerprint}{what} (see 'editscope stats list')")
    by_setting: dict[tuple[str, int, int, str], list[int]] = {}
    for stat in chosen:
        by_setting.setdefault((stat.corpus, stat.token_budget, stat.seq_len, stat.stats_dtype), []).append(stat.layer)
    if len(by_setting) > 1:
        corpora, dtypes = {key[0] for key in by_setting}, {key[3] for key in by_setting}
        options = "; ".join(f"--budget {b}" + (f" --corpus-digest {c}" if len(corpora) > 1 else "")
                            + (f" --stats-dtype {t}" if len(dtypes) > 1 else "")
                            + f" (rows of {n} tokens; layers {sorted(ls)})"
                            for (c, b, n, t), ls in sorted(by_setting.items()))
        raise EditscopeError(f"the cache holds {len(by_setting)} statistics settings for these layers; pick one: "
                             f"{options}")
    if missing := sorted(set(layers or ()) - {s.layer for s in chosen}):
        raise EditscopeError(f"layers {missing} are not cached for fingerprint {fingerprint}")
    tensors: dict[str, torch.Tensor] = {}
    per_layer: dict[str, dict] = {}
    for stat in chosen:
        with safe_open(stat.path, framework="pt") as fh:
            meta = fh.metadata() or {}
            layer = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        try:  # a cache file is exported only as it was computed
            verify(stat.path, meta, layer, what="layer statistics", hint="", trust=False)
        except IntegrityError as exc:
            raise EditscopeError(f"{str(exc).removesuffix('; not using it')}; 'editscope stats compute' recomputes "
                                 "it") from None
        tensors[f"layer{stat.layer}.mom2"] = layer["mom2"].contiguous()
        tensors[f"layer{stat.layer}.count"] = layer["count"]
        per_layer[str(stat.layer)] = {k: v for k, v in _meta(Path(stat.path)).items() if k != DIGEST_KEY}
    dim = next(iter(tensors.values())).shape[0]
    metadata = seal({"editscope-stats": FORMAT, "fingerprint": fingerprint, "mlp_size": str(dim),
                     "layers": json.dumps(per_layer)}, tensors)
    out = Path(out)
    atomic_write(out, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    return chosen


def import_stats(bundle: Bundle, path: str | Path, *, trust_unverified: bool | None = None) -> list[Path]:
    """Validate an export file against ``bundle`` and write its layers into the cache; returns the cache files.
    The file's content digest is checked first; one without a digest is refused unless ``trust_unverified`` (None:
    the command's ``--trust-unverified``), and then each cache file written records ``unverified_source``."""
    path = Path(path)
    meta, tensors = _read_export(path)
    verified = verify(path, meta, tensors, what="statistics export", hint="export it again with 'editscope stats "
                      "export'", trust=trust_unverified)
    provenance = {} if verified else {"unverified_source": str(path)}
    per_layer = _export_layers(path, meta, bundle)
    written = []
    for layer, layer_meta in _layer_entries(path, per_layer):
        mom2, count = _checked_layer(f"{path}: layer {layer}", bundle, layer, layer_meta, tensors)
        target = cache_file(bundle.fingerprint, layer, str(layer_meta["corpus"]), int(layer_meta["token_budget"]),
                            int(layer_meta["seq_len"]), str(layer_meta.get("stats_dtype", DEFAULT_STATS_DTYPE)))
        _save(target, mom2, count, {k: v for k, v in layer_meta.items() if k not in ("content", DIGEST_KEY)}
              | provenance)
        written.append(target)
    return written


def _read_export(path: Path) -> tuple[dict, dict]:
    """The metadata and tensors of an export file (not yet verified)."""
    if not path.is_file():
        raise EditscopeError(f"{path}: file not found")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as exc:  # noqa: BLE001 (safetensors raises its own error types on a damaged file)
        raise EditscopeError(f"{path}: unreadable safetensors file ({type(exc).__name__})") from None
    if "editscope-stats" not in meta and "layers" not in meta:
        raise EditscopeError(f"{path}: not an editscope statistics export (format {meta.get('editscope-stats')!r})")
    return meta, tensors


def _export_layers(path: Path, meta: dict, bundle: Bundle) -> object:
    """The export's ``layers`` metadata (JSON), after its format and model fingerprint are checked."""
    try:
        per_layer = json.loads(meta["layers"])
    except (KeyError, ValueError) as exc:
        raise EditscopeError(f"{path}: not an editscope statistics export ({type(exc).__name__}: "
                             f"{str(exc)[:80]})") from None
    if meta.get("editscope-stats") != FORMAT:
        raise EditscopeError(f"{path}: not an editscope statistics export (format {meta.get('editscope-stats')!r})")
    if meta.get("fingerprint") != bundle.fingerprint:
        raise EditscopeError(f"{path}: statistics of model fingerprint {meta.get('fingerprint')}, but "
                             f"{bundle.name} has fingerprint {bundle.fingerprint}")
    return per_layer


def _checked_layer(where: str, bundle: Bundle, layer: int, layer_meta: dict,
                   tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """One layer's C and token count, checked against the model: range, shape, precision, content checksum,
    finite values, weights checksum, a positive integer count."""
    mom2, count = tensors.get(f"layer{layer}.mom2"), tensors.get(f"layer{layer}.count")
    if mom2 is None or count is None or count.numel() != 1:
        raise EditscopeError(f"{where}: tensors layer{layer}.mom2/.count missing")
    if not 0 <= layer < bundle.n_layers:
        raise EditscopeError(f"{where}: out of range, {bundle.name} has {bundle.n_layers} layers")
    dim = bundle.arch.mlp_size(bundle.config)
    if tuple(mom2.shape) != (dim, dim):
        raise EditscopeError(f"{where}: a {tuple(mom2.shape)} matrix, {bundle.name}'s MLP keys need {(dim, dim)}")
    _check_precision(where, layer_meta, mom2)
    if layer_meta.get("content") != _content_checksum(mom2):
        raise EditscopeError(f"{where}: content does not match its checksum (damaged file)")
    if not torch.isfinite(mom2).all():
        raise EditscopeError(f"{where}: non-finite values")
    if layer_meta.get("weights") != weights_checksum(bundle, layer):
        raise EditscopeError(f"{where}: computed for other weights than {bundle.name}'s (weights checksum)")
    if count.dtype.is_floating_point or count.dtype == torch.bool or int(count[0]) < 1:
        raise EditscopeError(f"{where}: tensor layer{layer}.count: expected a positive integer count")
    return mom2, int(count[0])


def _check_precision(where: str, layer_meta: dict, mom2: torch.Tensor) -> None:
    """The recorded ``stats_dtype`` (float64 when absent: exports before the setting) is known and is the matrix's."""
    name = layer_meta.get("stats_dtype", DEFAULT_STATS_DTYPE)
    if name not in STATS_DTYPES:
        raise EditscopeError(f"{where}: field 'stats_dtype': expected one of {', '.join(STATS_DTYPES)}, got "
                             f"{str(name)[:40]!r}")
    if mom2.dtype != STATS_DTYPES[name]:
        raise EditscopeError(f"{where}: a {mom2.dtype} matrix, but its field 'stats_dtype' says {name}")


_LAYER_KEYS: dict[str, type] = {"corpus": str, "token_budget": int, "seq_len": int, "content": str, "weights": str}


def _layer_entries(path: Path, per_layer: object) -> list[tuple[int, dict]]:
    """The ``layers`` metadata as (layer, entry) pairs, each entry checked for the keys the import reads."""
    where = f"{path}: metadata 'layers'"
    if not isinstance(per_layer, dict):
        raise EditscopeError(f"{where}: expected a JSON object of layer -> entry, got {type(per_layer).__name__}")
    out = []
    for key, entry in per_layer.items():
        if not (key.isascii() and key.isdigit()):
            raise EditscopeError(f"{where}: key {key[:40]!r}: not a layer number")
        if not isinstance(entry, dict):
            raise EditscopeError(f"{where}: layer {key}: expected an object, got {type(entry).__name__}")
        for name, kind in _LAYER_KEYS.items():
            value = entry.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                got = "is missing" if name not in entry else f"expected {kind.__name__}, got {type(value).__name__}"
                raise EditscopeError(f"{where}: layer {key}: field {name!r} {got}")
        out.append((int(key), entry))
    return sorted(out, key=lambda pair: pair[0])


def as_dicts(stats: Sequence[CachedStat]) -> list[dict]:
    return [asdict(s) for s in stats]
