"""Layer key statistics: the uncentered second moment C = E[k kᵀ] of the MLP key activation.

k is the input of a block's MLP down/out projection (hook point ``blocks.{i}.mlp_key``). ROME (Meng et al.
2022, eq. 2 and §3.1: "C = KKᵀ is a constant that we pre-cache by estimating the uncentered covariance of k
from a sample of Wikipedia text") and MEMIT (Meng et al. 2023, eq. 14, C₀ = K₀K₀ᵀ; the reference code uses
the *mean* ``mom2`` and multiplies it by ``mom2_update_weight``) both need C; AlphaEdit (Fang et al. 2025,
§3.2) projects onto its null space.

Here C is the mean over every token of a text corpus (default: wikitext-2 test then valid split from the
shared data) up to a token budget, accumulated in float64 (float32 products of ≤ 1024 tokens, :func:`add_outer`),
or with ``stats_dtype="float32"`` in a Kahan-compensated float32 sum (:class:`CompensatedSum`)::

    C = (1/N) Σ_t k_t k_tᵀ

The text is tokenized paragraph by paragraph (headings and blank lines skipped), concatenated and cut into
rows of ``seq_len`` tokens, so no token is padding. The forward stops after the last requested layer's MLP
key (a private exception raised from a hook), several layers share one pass, and the result is cached on disk
as safetensors under ``home()/"stats"`` keyed by model fingerprint, layer, corpus hash, budget, row length and
precision.

The fingerprint is :attr:`Bundle.fingerprint`, which names the weights as they are now (applied patches
included), so statistics of an edited model are never cached under the unedited model's key. Editors that
follow ROME/MEMIT's convention (C of the *unedited* model, also during sequential editing) pass
``weights="base"``: the applied patches are reverted for the computation (or the cache is read) and
re-applied bit-exactly. Weights changed outside patches keep the bundle's fingerprint; to catch them each
cache file also records a checksum of the weights the layer's keys depend on (everything but the blocks after
it, each parameter's digest computed once per process and again only after an in-place change), verified on
every read: a mismatch recomputes and overwrites the file with a
warning. The limit: such a change is caught when the cache is read, so until then the file under the unedited
fingerprint may hold values of the changed weights (never served for other weights).
A file that is unreadable (truncated), fails its content digest (every tensor and metadata entry:
:mod:`editscope.integrity`), has none (written by an earlier editscope), has the wrong shape or holds non-finite values
is recomputed the same way, with a warning line that says so. Files are written atomically (temp file + rename).
Both digests are computed once per file and process (:class:`_VerifiedFiles`): a later read of the same
file, unchanged since (inode, size, modification time) and not modified just before it was verified, skips
them. Every edit of ROME and the MEMIT family reads C again; on an 8B model that was ~8 GB hashed twice per
edit (a MEMIT edit of 4 requests took 50 s on an H100, docs/scale.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import warnings
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from editscope.atomic import atomic_write, file_lock
from editscope.data.corpus import Corpus
from editscope.errors import EditscopeError
from editscope.integrity import DIGEST_KEY, IntegrityError, seal, verify
from editscope.lm.bundle import Bundle
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import hooks
from editscope.paths import home
from editscope.stats.settings import DEFAULT_SEQ_LEN, DEFAULT_STATS_DTYPE, DEFAULT_TOKEN_BUDGET, STATS_DTYPE_NAMES

DEFAULT_BATCH_ROWS = 8
#: the torch dtype of each statistics precision a hparams file may name (:mod:`editscope.stats.settings`)
STATS_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in STATS_DTYPE_NAMES}


class _StopForward(Exception):
    """Raised from a hook after the last needed layer: the rest of the forward is not computed."""


def corpus_rows(engine: ScoringEngine, corpus: Corpus, token_budget: int, seq_len: int) -> torch.Tensor:
    """Token ids [n_rows, seq_len] holding the first ``token_budget`` tokens of the corpus (rounded down to
    whole rows; at least one row). Paragraphs are encoded by the engine, joined with a newline token."""
    if token_budget < 1 or seq_len < 1:
        raise EditscopeError("token budget and seq_len must be positive")
    newline = engine.tokenizer("\n", add_special_tokens=False)["input_ids"]
    need = max(seq_len, (token_budget // seq_len) * seq_len)
    stream = array("q")  # 8 bytes per token (a list of ints takes ~36): the budget's ids are the only O(budget) memory
    for text in corpus.paragraphs():
        stream.extend(engine.encode(text))
        stream.extend(newline)
        if len(stream) >= need:
            break
    n_rows = len(stream) // seq_len
    if n_rows == 0:
        raise EditscopeError(f"corpus too short: {len(stream)} tokens, need at least {seq_len}")
    n_rows = min(n_rows, need // seq_len)
    return torch.frombuffer(stream, dtype=torch.long)[: n_rows * seq_len].clone().view(n_rows, seq_len)


def stats_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of a statistics precision name; an unknown name is a one-line error naming the choices."""
    if name not in STATS_DTYPES:
        raise EditscopeError(f"statistics dtype must be one of {', '.join(STATS_DTYPES)}, got {name!r}")
    return STATS_DTYPES[name]


def cache_file(fingerprint: str, layer: int, corpus_digest: str, token_budget: int, seq_len: int,
               stats_dtype: str = DEFAULT_STATS_DTYPE) -> Path:
    """Where the statistics of one layer are cached. float64 keeps the folder name it had before the precision
    became a setting (so existing caches stay valid); float32 gets a ``-f32`` suffix."""
    stats_dtype_of(stats_dtype)
    suffix = "" if stats_dtype == "float64" else "-f32"
    folder = f"{corpus_digest}-b{token_budget}-s{seq_len}{suffix}"
    return home() / "stats" / fingerprint / folder / f"layer{layer}.safetensors"


#: per model object, per parameter name: (storage address, version counter, digest of its bytes)
_PARAM_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: prefix of the checksum format (per-parameter digests); a file with another format is recomputed once
CHECKSUM_FORMAT = "p1:"


def _param_digest(memo: dict, name: str, param: torch.Tensor) -> str:
    """blake2b of one parameter's bytes, recomputed only when the tensor changed: torch bumps a tensor's version
    counter on every in-place change (also under no_grad, also through ``.detach()`` views, as a patch's
    apply/revert does) and ``.data =`` swaps its storage address."""
    state = (param.data_ptr(), param._version)
    known = memo.get(name)
    if known is not None and known[:2] == state:
        return known[2]
    t = param.detach().contiguous().cpu()
    digest = hashlib.blake2b(t.view(torch.uint8).numpy().data if t.numel() else b"",  # host: t is .cpu() above
                             digest_size=16).hexdigest()
    memo[name] = (*state, digest)
    return digest


def weights_checksum(bundle: Bundle, layer: int) -> str:
    """Checksum of every parameter the MLP keys of ``layer`` depend on: all but those of later blocks (the final
    norm and LM head included, conservatively): blake2b over (name, dtype, shape, blake2b of the bytes) per
    parameter. Each parameter's digest is computed once per process and again only after it changed
    (:func:`_param_digest`), so an edit that changes one weight re-reads one weight, not the model (re-reading
    every weight cost ~1 s per layer per edit on SmolLM2)."""
    later = tuple(bundle.arch.block_path(i) + "." for i in range(layer + 1, bundle.n_layers))
    h = hashlib.blake2b(digest_size=16)
    memo = _PARAM_DIGESTS.setdefault(bundle.model, {})
    for name, param in bundle.model.named_parameters():
        if name.startswith(later):
            continue
        h.update(f"{name}:{param.dtype}{tuple(param.shape)}:{_param_digest(memo, name, param)};".encode())
    return CHECKSUM_FORMAT + h.hexdigest()


def _legacy_checksum(bundle: Bundle, layer: int) -> str:
    """The checksum files written before :data:`CHECKSUM_FORMAT` carry: blake2b over the same parameters' names,
    dtypes, shapes and bytes in one stream (read once per such file, which is then re-stamped)."""
    later = tuple(bundle.arch.block_path(i) + "." for i in range(layer + 1, bundle.n_layers))
    h = hashlib.blake2b(digest_size=16)
    for name, param in bundle.model.named_parameters():
        if name.startswith(later):
            continue
        t = param.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)  # host: t is .cpu() above
    return h.hexdigest()


def _content_checksum(mom2: torch.Tensor) -> str:
    """blake2b of the matrix's bytes: a file damaged after writing (or torn by a crash) is caught on read."""
    return hashlib.blake2b(mom2.contiguous().cpu().view(torch.uint8).numpy().data, digest_size=16).hexdigest()


class _VerifiedFiles:
    """Cache files whose seal and content checksum held when this process last read them, by path, with the
    (inode, size, modification time in ns) they had then: a write since (a recomputation, a byte flipped by hand,
    a replacement by rename) changes that stamp and the file is verified again. A file modified less than
    :attr:`racy_ns` before it was verified is not remembered (as git's "racily clean" index entries): a file
    system keeps modification times at a clock tick's resolution, so a second write within the same tick could
    leave the stamp as it was. At most ``limit`` paths (the oldest forgotten first). The limit of the check: a
    write that sets the stamp back to what it was (same inode, size and modification time) is not seen."""

    racy_ns = 2_000_000_000

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._stamps: dict[str, tuple[int, int, int]] = {}

    @staticmethod
    def stamp(path: Path) -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def holds(self, path: Path) -> bool:
        stamp = self.stamp(path)
        return stamp is not None and self._stamps.get(str(path)) == stamp

    def add(self, path: Path) -> None:
        if (stamp := self.stamp(path)) is None or time.time_ns() - stamp[2] < self.racy_ns:
            return
        self._stamps.pop(str(path), None)
        self._stamps[str(path)] = stamp
        while len(self._stamps) > self.limit:
            self._stamps.pop(next(iter(self._stamps)))

    def forget(self, path: Path) -> None:
        self._stamps.pop(str(path), None)


#: the statistics files verified in this process (see :class:`_VerifiedFiles`)
_VERIFIED = _VerifiedFiles()


def _open_sealed(path: Path) -> tuple[dict, dict, bool] | str:
    """The metadata and tensors of a cache file whose content digest holds, and whether it was verified before in
    this process (so its content checksum needs no recomputation either); else why it cannot be used."""
    before = _VERIFIED.holds(path)
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as exc:  # safetensors raises its own types on a damaged file
        return f"is unreadable ({type(exc).__name__}: {str(exc)[:80]})"
    if DIGEST_KEY not in meta:
        return "has no content digest (written by an earlier editscope)"
    if before and _VERIFIED.holds(path):  # the same stamp before and after the read: the bytes verified earlier
        return meta, tensors, True
    _VERIFIED.forget(path)
    try:
        verify(path, meta, tensors, what="layer statistics", hint="", trust=False)
    except IntegrityError as exc:
        detail = str(exc).removeprefix(f"{path}: layer statistics: ").removesuffix("; not using it")
        return f"is damaged: {detail}"
    return meta, tensors, False


def _fields(meta: dict, tensors: dict) -> tuple[torch.Tensor, int, object, object] | str:
    """(C, token count, weights checksum, content checksum) of a sealed file, else why it is unreadable."""
    try:
        return (tensors["mom2"], int(tensors["count"][0]),
                json.loads(meta["weights"]) if "weights" in meta else None,
                json.loads(meta["content"]) if "content" in meta else None)
    except Exception as exc:  # noqa: BLE001 (a sealed file of another shape: recomputed)
        return f"is unreadable ({type(exc).__name__}: {str(exc)[:80]})"


def _matrix_problem(mom2: torch.Tensor, content: object, dim: int, dtype: torch.dtype, trusted: bool = False) -> str:
    """Why a cached C cannot be used (its content checksum and finiteness unless ``trusted``, shape, precision), or
    "" when it can."""
    if not trusted and content != _content_checksum(mom2):
        return "does not match its content checksum (damaged or written by an older version)"
    if tuple(mom2.shape) != (dim, dim):
        return f"holds a {tuple(mom2.shape)} matrix, expected {(dim, dim)}"
    if mom2.dtype != dtype:
        return f"holds a {mom2.dtype} matrix, expected {dtype} (statistics dtype)"
    if not trusted and not torch.isfinite(mom2).all():  # trusted: these very bytes passed this check before
        return "holds non-finite values"
    return ""


def _foreign(meta: dict, expected: dict) -> str:
    """Why a sealed statistics file belongs to another setting than ``expected`` (its own record of the model
    fingerprint, layer, corpus, token budget, row length, dtype), or "" when it is this one's: a sound file copied
    into another setting's cache folder is not this setting's statistics."""
    for key, want in expected.items():
        if key in meta:
            try:
                got = json.loads(meta[key])
            except ValueError:
                return f"records an unreadable {key}"
            if got != want:
                return f"was built for {key} {got!r}, not {want!r} (a file of another setting)"
    return ""


def _read_cached(path: Path, checksum: str, dim: int, legacy: Callable[[], str] | None = None,
                 dtype: torch.dtype = torch.float64, expected: dict | None = None) -> tuple[torch.Tensor | None, str]:
    """The cached C of ``path`` if it is sound, else ``(None, why)``: unreadable or truncated file, another
    weights checksum, content not matching its own checksum, wrong shape or dtype, or non-finite values. A file
    stamped with the older whole-model checksum is compared with ``legacy()`` and, if sound, re-stamped in place."""
    opened = _open_sealed(path)
    if isinstance(opened, str):
        return None, opened
    meta, tensors, trusted = opened
    if why := _foreign(meta, expected or {}):
        return None, why
    fields = _fields(meta, tensors)
    if isinstance(fields, str):
        return None, fields
    mom2, count, weights, content = fields
    if weights is None:
        return None, "has no weights checksum (older cache)"
    restamp = not str(weights).startswith(CHECKSUM_FORMAT) and legacy is not None and weights == legacy()
    if weights != checksum and not restamp:
        return None, "was cached for other weights than the model's now (changed outside a Patch?)"
    if why := _matrix_problem(mom2, content, dim, dtype, trusted=trusted):
        return None, why
    if restamp:
        _save(path, mom2, count, {**{k: json.loads(v) for k, v in meta.items() if k != "content"}, "weights": checksum})
    _VERIFIED.add(path)
    return mom2, ""


def _save(path: Path, mom2: torch.Tensor, count: int, meta: dict) -> None:
    mom2 = mom2.contiguous()
    metadata = {k: json.dumps(v) for k, v in {**meta, "content": _content_checksum(mom2)}.items() if k != DIGEST_KEY}
    tensors = {"mom2": mom2, "count": torch.tensor([count], dtype=torch.int64)}
    metadata = seal(metadata, tensors)
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


#: tokens per float32 k kᵀ product before it is added to the running sum (see :func:`add_outer`)
OUTER_CHUNK = 1024


class CompensatedSum:
    """A float32 running sum of [d, d] matrices with Kahan compensation: ``total`` + ``comp`` carry what plain
    float32 additions would round away, so the sum's rounding error stays ~2 eps₃₂ relative whatever the number of
    terms (a plain float32 running sum of n similar terms drifts ~eps₃₂·√n typically, n·eps₃₂ at worst). Two
    float32 buffers: the memory of one float64 sum."""

    def __init__(self, dim: int, device: torch.device | str) -> None:
        self.total = torch.zeros(dim, dim, dtype=torch.float32, device=device)
        self.comp = torch.zeros(dim, dim, dtype=torch.float32, device=device)

    def add_(self, term: torch.Tensor) -> None:
        """total += term, compensated; ``term`` (float32, [d, d]) is used as scratch and overwritten."""
        # Kahan: y = x − c; t = s + y; c = (t − s) − y; s = t, in place on three buffers (no temporary):
        # comp takes t, total takes −c, then the two swap roles.
        y = term.sub_(self.comp)
        t = self.comp.copy_(self.total).add_(y)
        neg_c = self.total.sub_(t).add_(y)  # s − t is exact (Sterbenz), so this is −((t − s) − y)
        self.total, self.comp = t, neg_c.neg_()

    def mean_(self, count: int) -> torch.Tensor:
        """The sum divided by ``count``, in place; the compensation (below the sum's last bit) is dropped."""
        self.comp = torch.empty(0, dtype=torch.float32, device=self.total.device)
        return self.total.div_(count)


def add_outer(total: torch.Tensor | CompensatedSum, k: torch.Tensor, chunk: int = OUTER_CHUNK) -> None:
    """total += Σ_t k_t k_tᵀ over the tokens of ``k`` [..., d]: float32 products of ``chunk`` tokens at a time,
    summed into ``total`` (a float64 tensor, or a float32 :class:`CompensatedSum`). A float64 product of all tokens
    (as before) cost ~25 % of the statistics' time on 2 cores (float64 GEMM at half the float32 rate, plus the
    conversion); a float32 product over ≤ 1024 tokens rounds each entry at ~1e-7 of ‖C‖ (Frobenius, measured),
    below the float32 forward's own rounding of k, and the float64 (or compensated float32) sum across chunks keeps
    the error from growing with the token budget."""
    flat = k.detach().reshape(-1, k.shape[-1]).float()
    for start in range(0, flat.shape[0], chunk):
        part = flat[start:start + chunk]
        total.add_(part.T @ part)


def _new_sum(dim: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor | CompensatedSum:
    if dtype == torch.float32:
        return CompensatedSum(dim, device)
    return torch.zeros(dim, dim, dtype=torch.float64, device=device)


def accumulate(bundle: Bundle, rows: torch.Tensor, layers: Sequence[int], *, batch_rows: int = DEFAULT_BATCH_ROWS,
               progress: bool = True, stats_dtype: str = DEFAULT_STATS_DTYPE,
               ) -> tuple[dict[int, torch.Tensor | CompensatedSum], int]:
    """Sums Σ_t k_t k_tᵀ of the MLP keys at ``layers`` over all tokens of ``rows`` (on the model's device: a float64
    tensor, or a float32 :class:`CompensatedSum` for ``stats_dtype="float32"``), and the token count. One forward
    per batch of ``batch_rows`` rows, stopped after the deepest layer; memory is one sum per layer plus one batch's
    activations and one ``OUTER_CHUNK``-token k kᵀ product, whatever the token budget."""
    dtype = stats_dtype_of(stats_dtype)
    n_layers = bundle.n_layers
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise EditscopeError(f"layer {layer} out of range 0..{n_layers - 1}")
    layers = sorted(set(layers))
    last = layers[-1]
    dim = bundle.arch.mlp_size(bundle.config)
    sums = {layer: _new_sum(dim, dtype, bundle.device) for layer in layers}
    count = 0

    def adder(layer: int):
        def fn(k: torch.Tensor) -> None:
            add_outer(sums[layer], k)
            if layer == last:
                raise _StopForward
            return None

        return fn

    base = bundle.model.get_submodule(bundle.arch.base)
    bar = tqdm(total=int(rows.numel()), unit="tok", desc=f"key stats L{','.join(map(str, layers))}",
               disable=not progress, leave=False)
    with torch.no_grad(), hooks(bundle.model, bundle.arch, {f"blocks.{lay}.mlp_key": adder(lay) for lay in layers}):
        for start in range(0, rows.shape[0], batch_rows):
            batch = rows[start:start + batch_rows].to(bundle.device)
            with contextlib.suppress(_StopForward):
                base(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False)
            count += int(batch.numel())
            bar.update(int(batch.numel()))
    bar.close()
    return sums, count


def mean_of(total: torch.Tensor | CompensatedSum, count: int) -> torch.Tensor:
    """C = sum / count on the host: a new float64 tensor, or the float32 sum divided in place (no second copy)."""
    if isinstance(total, CompensatedSum):
        return total.mean_(count).cpu()
    return (total / count).cpu()


def second_moments(bundle: Bundle, layers: Sequence[int], *, corpus: Corpus | None = None,
                   token_budget: int = DEFAULT_TOKEN_BUDGET, seq_len: int = DEFAULT_SEQ_LEN,
                   batch_rows: int = DEFAULT_BATCH_ROWS, progress: bool = True, use_cache: bool = True,
                   weights: Literal["current", "base"] = "current",
                   stats_dtype: str = DEFAULT_STATS_DTYPE) -> dict[int, torch.Tensor]:
    """C = E[k kᵀ] ([mlp, mlp], in ``stats_dtype``: float64 by default) per layer; cached layers are read, the
    others computed in one pass.

    See the module docstring for the definition (ROME eq. 2's C; MEMIT eq. 14's C₀ up to the sample count).
    ``weights="current"``: C of the weights as they are now (patches applied to the bundle included);
    ``"base"``: C of the loaded weights, the convention of ROME/MEMIT/AlphaEdit for sequential editing.
    ``stats_dtype``: :data:`STATS_DTYPES` (float32: compensated float32 sums, docs/scale.md gives the error).
    """
    stats_dtype_of(stats_dtype)
    kwargs = dict(corpus=corpus, token_budget=token_budget, seq_len=seq_len, batch_rows=batch_rows,
                  progress=progress, use_cache=use_cache, stats_dtype=stats_dtype)
    if weights == "base":
        if not bundle.applied:
            return second_moments(bundle, layers, **kwargs)
        with bundle.unpatched():
            return second_moments(bundle, layers, **kwargs)
    if weights != "current":
        raise EditscopeError(f"weights must be 'current' or 'base', not {weights!r}")
    setting = _Setting(corpus or Corpus.default(), token_budget, seq_len, stats_dtype)
    layers = sorted(set(int(layer) for layer in layers))
    if not use_cache:
        return _compute(bundle, layers, setting, batch_rows, progress, None)
    checksums = {layer: weights_checksum(bundle, layer) for layer in layers}
    out, missing = _read_layers(bundle, layers, setting, checksums)
    if missing:
        # One builder per cache folder: a second process waits here, then reads what the first one wrote.
        lock = setting.path(bundle, 0).parent / ".build.lock"
        what = (f"layer statistics of {bundle.name}, layers {','.join(map(str, missing))}, "
                f"{token_budget} tokens of corpus {setting.corpus.digest[:12]} ({stats_dtype})")
        with file_lock(lock, what=what):
            found, missing = _read_layers(bundle, missing, setting, checksums, warn=False)
            out.update(found)
            if missing:
                out.update(_compute(bundle, missing, setting, batch_rows, progress, checksums))
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class _Setting:
    """What a cached C is keyed by besides the model and layer."""

    corpus: Corpus
    token_budget: int
    seq_len: int
    stats_dtype: str

    def path(self, bundle: Bundle, layer: int) -> Path:
        return cache_file(bundle.fingerprint, layer, self.corpus.digest, self.token_budget, self.seq_len,
                          self.stats_dtype)

    def record(self, bundle: Bundle, layer: int) -> dict:
        """What a cache file of this setting records about itself (checked on read)."""
        return dict(fingerprint=bundle.fingerprint, layer=layer, corpus=self.corpus.digest,
                    token_budget=self.token_budget, seq_len=self.seq_len, stats_dtype=self.stats_dtype)


def _read_layers(bundle: Bundle, layers: Sequence[int], setting: _Setting, checksums: dict[int, str], *,
                 warn: bool = True) -> tuple[dict[int, torch.Tensor], list[int]]:
    """The layers whose cache files are valid for the weights now, and the layers still to compute."""
    out: dict[int, torch.Tensor] = {}
    missing = []
    dtype = stats_dtype_of(setting.stats_dtype)
    for layer in layers:
        path = setting.path(bundle, layer)
        if path.is_file():
            cached, why = _read_cached(path, checksums[layer], bundle.arch.mlp_size(bundle.config),
                                       legacy=lambda layer=layer: _legacy_checksum(bundle, layer), dtype=dtype,
                                       expected=setting.record(bundle, layer))
            if cached is not None:
                out[layer] = cached
                continue
            if warn:
                warnings.warn(f"{path} {why}; recomputing", stacklevel=3)
        missing.append(layer)
    return out, missing


def _compute(bundle: Bundle, layers: list[int], setting: _Setting, batch_rows: int, progress: bool,
             checksums: dict[int, str] | None) -> dict[int, torch.Tensor]:
    """C for ``layers`` in one early-stopped pass over the corpus; cached when ``checksums`` is given."""
    t0 = time.perf_counter()
    corpus = setting.corpus
    rows = corpus_rows(ScoringEngine(bundle), corpus, setting.token_budget, setting.seq_len)
    sums, count = accumulate(bundle, rows, layers, batch_rows=batch_rows, progress=progress,
                             stats_dtype=setting.stats_dtype)
    seconds = time.perf_counter() - t0
    out = {}
    for layer in layers:
        out[layer] = mean_of(sums.pop(layer), count)  # as a cache read returns it; the sum is freed layer by layer
        if checksums is not None:
            meta = dict(fingerprint=bundle.fingerprint, model=bundle.name, layer=layer, corpus=corpus.digest,
                        corpus_files=[p.name for p in corpus.files], token_budget=setting.token_budget,
                        seq_len=setting.seq_len, stats_dtype=setting.stats_dtype, tokens=count, seconds=seconds,
                        layers_in_pass=layers, weights=checksums[layer])
            _save(setting.path(bundle, layer), out[layer], count, meta)
    return out


def second_moment(bundle: Bundle, layer: int, **kwargs) -> torch.Tensor:
    """C = E[k kᵀ] for one layer; keyword arguments as :func:`second_moments`."""
    return second_moments(bundle, [layer], **kwargs)[layer]
