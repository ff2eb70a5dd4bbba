"""A patch: the ΔW per parameter an editor produced, able to apply itself, revert bit-exactly, and round-trip
through safetensors.

Bit-exactness without a copy of W: floating-point ``(W + Δ) - Δ`` is not always ``W`` (0.04 % of the entries of a
float32 matrix for |Δ| ≈ 1e-4·|W|, 30 % for |Δ| ≈ |W|), so :meth:`Patch.apply` computes ``(W + Δ) - Δ`` once and
keeps the original values of only the entries where it differs (flat index + value, :class:`_Restore`; a dense
copy only where that would be smaller). :meth:`Patch.revert` subtracts Δ (the same elementwise operation, so the
same result) and writes those entries back: bit-exact, and an applied patch holds ΔW plus a few per cent of W
instead of ΔW plus W (otherwise 100 sequential MEMIT edits hold 100 copies of five MLP matrices). Revert
assumes the edited parameters still hold what apply left (a Bundle enforces the order of patches). A patch records the
fingerprint of the model it was computed on and a checksum of each edited parameter's pre-edit bytes;
applying it onto a model with another fingerprint (or with those parameters in another state, e.g. before
the earlier patches of a sequence were applied) is an :class:`~editscope.errors.EditscopeError`.

A saved patch also records a checksum of each ΔW's own bytes (metadata ``delta_checksums``) and of each base
tensor's (the pre-edit ``checksums``): :meth:`Patch.load` refuses a file whose tensors do not match them (altered or
corrupted bytes) or whose ΔW holds NaN/inf, naming the file and the tensor, before anything can be applied. The whole
file — every tensor and every metadata entry (``requests``, ``hparams``, ``info``...) — is covered by its content
digest (:mod:`editscope.integrity`), checked first; a file without one (saved by an earlier editscope, or with the
digest removed) is refused unless the caller trusts unverified files (``--trust-unverified``), and then its ΔW is still
checked against ``delta_checksums`` where present and for NaN/inf.

Applied to a :class:`Bundle`, a patch is recorded on it (:meth:`Bundle.record_apply` / ``record_revert``) so
``bundle.fingerprint`` names the edited weights; a patch computed on an edited bundle (sequential editing)
records that edited fingerprint and applies only on top of the same earlier patches.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from editscope.atomic import atomic_write
from editscope.errors import EditscopeError
from editscope.integrity import seal, verify
from editscope.lm.bundle import Bundle

FORMAT = "editscope-patch-1"
BASE_PREFIX = "base::"


def tensor_checksum(tensor: torch.Tensor) -> str:
    """blake2b of a tensor's dtype, shape and bytes."""
    t = tensor.detach().contiguous().cpu()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # host: t is .cpu() above
    return h.hexdigest()


def _non_finite(tensor: torch.Tensor) -> int:
    """How many entries of a floating-point tensor are NaN or ±inf (0 for other dtypes)."""
    if not tensor.is_floating_point():
        return 0
    return int((~torch.isfinite(tensor)).sum())


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def exact_index(computed: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Flat positions where ``computed`` differs from ``target`` bit for bit (integer views: -0.0 ≠ 0.0, NaN payloads
    kept): the few entries to write back when float arithmetic does not round-trip (``(W + Δ) - Δ`` ≠ ``W``), so an
    exact restore keeps those instead of a whole copy. Both tensors have one shape and dtype."""
    view = _INT_VIEW[target.element_size()]
    return (computed.view(view) != target.view(view)).reshape(-1).nonzero().squeeze(1)


def write_exact(param: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` at the flat positions ``index`` (from :func:`exact_index`) of the contiguous ``param``, in
    place; the entries may be stored on another device or with a narrower index dtype."""
    param.view(-1)[index.to(param.device).long()] = values.to(param.device, param.dtype)


@dataclass
class _Restore:
    """What :meth:`Patch.revert` writes back after ``W - Δ``: the original values at ``index`` (flat positions where
    ``(W + Δ) - Δ`` differs bitwise from ``W``), or ``dense``, the whole original, where that is smaller."""

    index: torch.Tensor | None = None
    values: torch.Tensor | None = None
    dense: torch.Tensor | None = None

    @classmethod
    def of(cls, original: torch.Tensor, edited: torch.Tensor, delta: torch.Tensor) -> _Restore:
        """Compare ``edited - delta`` with ``original`` bit for bit (integer views: -0.0 ≠ 0.0, NaN payloads kept)."""
        if not original.is_contiguous() or original.element_size() not in _INT_VIEW:
            return cls(dense=original.clone())
        index = exact_index(edited - delta, original)
        index_dtype = torch.int32 if original.numel() < 2**31 else torch.int64
        sparse_bytes = index.numel() * (original.element_size() + index_dtype.itemsize)
        if sparse_bytes >= original.numel() * original.element_size():
            return cls(dense=original.clone())
        return cls(index=index.to(index_dtype), values=original.reshape(-1)[index].clone())

    def restore(self, param: torch.Tensor, delta: torch.Tensor) -> None:
        if self.dense is not None:
            param.copy_(self.dense)
            return
        param.sub_(delta)
        if self.index.numel():
            write_exact(param, self.index, self.values)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.index, self.values, self.dense) if t is not None)


@dataclass
class Patch:
    """ΔW per parameter name (stored orientation, same dtype as the parameter) plus provenance.

    ``checksums`` are of the pre-edit parameter values the deltas were computed against; ``fingerprint``
    identifies the loaded model (:attr:`Bundle.fingerprint`). ``info`` holds editor diagnostics (losses...;
    ``info["vectors"]`` holds tensors such as k*, v* and is not saved). ``bases`` (optional) are the pre-edit
    values of the edited parameters, saved with the file (key ``base::NAME``) so that an edited model folder
    can be reverted bit-exactly without the original model (:meth:`revert_from_bases`).
    """

    kind: ClassVar[str] = "weights"  # the intervention kind (editscope.edit.intervention.KINDS)

    deltas: dict[str, torch.Tensor]
    method: str
    hparams: dict
    fingerprint: str
    checksums: dict[str, str]
    model_name: str = ""
    requests: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    bases: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    _restore: dict[str, _Restore] | None = field(default=None, repr=False)
    _digest: str | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def applied(self) -> bool:
        return self._restore is not None

    @property
    def revert_bytes(self) -> int:
        """Bytes this patch holds to revert itself bit-exactly while applied (0 when not applied)."""
        return sum(r.nbytes for r in (self._restore or {}).values())

    @property
    def released(self) -> bool:
        """The ΔW was handed over to a bundle's chain (:meth:`Bundle.fold`): names, checksums, digest and info
        remain; apply, revert and save do not."""
        return self._released

    def original(self, name: str, current: torch.Tensor) -> torch.Tensor:
        """The exact pre-apply value of parameter ``name`` given its ``current`` (applied) value: a new tensor."""
        if self._restore is None:
            raise EditscopeError("patch is not applied")
        value = current.detach().clone()
        self._restore[name].restore(value, self._delta_for(value, self.deltas[name]))
        return value

    def release(self) -> None:
        """Drop every tensor the patch holds — ΔW, the revert entries, the base weights and ``info["vectors"]`` —
        (see :attr:`released`); the bundle that folded the patch restores the weights."""
        self.digest  # noqa: B018 -- memoised before the deltas go
        self.deltas = {name: torch.empty(d.shape, dtype=d.dtype, device="meta") for name, d in self.deltas.items()}
        self.bases = None
        self.info = {k: v for k, v in self.info.items() if k != "vectors"}
        self._restore = None
        self._released = True

    def _check_held(self, action: str) -> None:
        if self._released:
            raise EditscopeError(f"cannot {action} patch ({self.method}): its ΔW was folded into a chain "
                                 "(Bundle.fold); save patches before folding them")

    @staticmethod
    def _delta_for(param: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """ΔW on the parameter's device and in its dtype (the same tensor at apply and at revert)."""
        return delta.to(device=param.device, dtype=param.dtype)

    @property
    def names(self) -> list[str]:
        return sorted(self.deltas)

    @property
    def digest(self) -> str:
        """Content checksum of the deltas (names, dtypes, shapes, bytes): with the base fingerprint and the
        order of application it names the edited weights (:attr:`Bundle.fingerprint`). Computed once; the
        deltas are not meant to change after the patch is made."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=16)
            for name in self.names:
                h.update(name.encode() + b"=" + tensor_checksum(self.deltas[name]).encode() + b";")
            self._digest = h.hexdigest()
        return self._digest

    # -- model state ----------------------------------------------------------------------------------
    def _model(self, target: Bundle | nn.Module, check: bool) -> nn.Module:
        if isinstance(target, Bundle):
            if check and target.fingerprint != self.fingerprint:
                if target.applied:
                    raise EditscopeError(
                        f"patch ({self.method}) was made on weights with fingerprint {self.fingerprint}; the model "
                        f"is not in the state this patch was computed on: {len(target.applied)} patch(es) applied "
                        f"({', '.join(p.method for p in target.applied)}), fingerprint {target.fingerprint}"
                    )
                raise EditscopeError(
                    f"patch ({self.method}) was made for model {self.model_name or '?'} with fingerprint "
                    f"{self.fingerprint}, not {target.name} with fingerprint {target.fingerprint}"
                )
            return target.model
        return target

    def apply(self, target: Bundle | nn.Module, *, check: bool = True) -> None:
        """W ← W + ΔW for every parameter of the patch, keeping what :meth:`revert` needs (see the module docstring).

        With ``check`` the model's fingerprint (when a Bundle is given) and the edited parameters' current
        bytes must match the ones the patch was computed on.
        """
        self._check_held("apply")
        if self.applied:
            raise EditscopeError("patch is already applied; revert it first")
        model = self._model(target, check)
        params = _params(model)
        for name, delta in self.deltas.items():
            bad = _non_finite(delta)
            if bad:  # checked before any weight is written
                raise EditscopeError(f"patch parameter {name!r}: ΔW holds {bad} NaN/inf value(s); not applying")
            if name not in params:
                raise EditscopeError(f"patch parameter {name!r} does not exist in this model")
            if params[name].shape != delta.shape:
                raise EditscopeError(f"patch parameter {name!r}: shape {tuple(delta.shape)} != model "
                                     f"{tuple(params[name].shape)}")
            if check and tensor_checksum(params[name]) != self.checksums.get(name):
                raise EditscopeError(
                    f"parameter {name!r} is not in the state this patch was computed on (a different model, or "
                    "earlier patches of a sequence not applied first)"
                )
        restore = {}
        with torch.no_grad():
            for name, delta in self.deltas.items():
                param = params[name]
                d = self._delta_for(param, delta)
                original = param.detach().clone()  # one matrix at a time, dropped after the comparison
                param.add_(d)
                restore[name] = _Restore.of(original, param.detach(), d)
                del original
        self._restore = restore
        if isinstance(target, Bundle):
            target.record_apply(self)

    def revert(self, target: Bundle | nn.Module) -> None:
        """Restore the exact pre-apply values of every edited parameter (bit-exact)."""
        self._check_held("revert")
        if self._restore is None:
            raise EditscopeError("patch is not applied")
        if isinstance(target, Bundle):
            target.record_revert(self)  # checks the order before any weight changes
        model = target.model if isinstance(target, Bundle) else target
        params = _params(model)
        with torch.no_grad():
            for name, restore in self._restore.items():
                param = params[name]
                restore.restore(param.detach(), self._delta_for(param, self.deltas[name]))
        self._restore = None

    def revert_from_bases(self, target: Bundle | nn.Module) -> None:
        """Undo this patch on a model that holds ``base + Δ`` (e.g. an edited folder written by
        ``editscope patch apply``): checks every edited parameter equals base + Δ bit for bit, then restores
        the bases exactly."""
        if not self.bases:
            raise EditscopeError("this patch file holds no base weights; revert needs the original model")
        model = target.model if isinstance(target, Bundle) else target
        params = _params(model)
        for name, delta in self.deltas.items():
            base = self.bases[name]
            if name not in params or not torch.equal(params[name].detach(),
                                                     (base + delta.to(base.dtype)).to(params[name].device)):
                raise EditscopeError(f"parameter {name!r} does not hold this patch's edited value; not reverting")
        with torch.no_grad():
            for name in self.deltas:
                params[name].copy_(self.bases[name].to(params[name].device))

    # -- files ----------------------------------------------------------------------------------------
    def metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT,
            "method": self.method,
            "hparams": json.dumps(self.hparams, sort_keys=True),
            "fingerprint": self.fingerprint,
            "model_name": self.model_name,
            "checksums": json.dumps(self.checksums, sort_keys=True),
            "delta_checksums": json.dumps({name: tensor_checksum(d) for name, d in self.deltas.items()},
                                          sort_keys=True),
            "requests": json.dumps(self.requests),
            "info": json.dumps({k: v for k, v in self.info.items() if k != "vectors"}, default=str),
        }

    def save(self, path: str | Path) -> Path:
        """Write the deltas and metadata as one safetensors file (atomic: temp file + rename)."""
        self._check_held("save")
        tensors = {k: v.detach().contiguous() for k, v in self.deltas.items()}
        for k, v in (self.bases or {}).items():
            tensors[BASE_PREFIX + k] = v.detach().contiguous()
        metadata = seal(self.metadata(), tensors)
        return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    @classmethod
    def load(cls, path: str | Path, *, trust_unverified: bool | None = None) -> Patch:
        """Read a patch written by :meth:`save` (safetensors only; no pickle). Its content digest is checked before
        anything is read from it; a file without one is refused unless ``trust_unverified`` (None: the command's
        ``--trust-unverified``, :func:`editscope.integrity.trusting`)."""
        path = Path(path)
        meta, tensors = _read_patch_file(path)
        if meta.get("format") != FORMAT and "delta_checksums" not in meta and "checksums" not in meta:
            raise EditscopeError(f"{path}: not an editscope patch (metadata format={meta.get('format')!r})")
        verify(path, meta, tensors, what="patch", hint="save the patch again from its edit", trust=trust_unverified)
        if meta.get("format") != FORMAT:
            raise EditscopeError(f"{path}: not an editscope patch (metadata format={meta.get('format')!r})")
        deltas = {k: v for k, v in tensors.items() if not k.startswith(BASE_PREFIX)}
        bases = {k[len(BASE_PREFIX):]: v for k, v in tensors.items() if k.startswith(BASE_PREFIX)} or None
        field = _MetaReader(path, meta)
        checksums = field("checksums", kind=dict)
        requests = field("requests", "[]", list)
        _check_requests(path, requests)
        _check_tensor_names(path, deltas, bases, checksums)
        patch = cls(
            deltas=deltas,
            bases=bases,
            method=field("method"),
            hparams=field("hparams", kind=dict),
            fingerprint=field("fingerprint"),
            checksums=checksums,
            model_name=field("model_name", ""),
            requests=requests,
            info=field("info", "{}", dict),
        )
        # files saved before delta checksums existed have none: their ΔW is still checked for NaN/inf
        delta_checksums = field("delta_checksums", kind=dict) if "delta_checksums" in meta else None
        _verify_tensors(path, deltas, bases, checksums, delta_checksums)
        return patch


def _read_patch_file(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A patch file's metadata and tensors, or one line saying why the file cannot be one."""
    if path.is_dir():
        raise EditscopeError(f"{path}: is a folder, not a patch file")
    if not path.is_file():
        raise EditscopeError(f"patch file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {key: fh.get_tensor(key) for key in fh.keys()}  # noqa: SIM118 (safe_open API)
    except Exception as exc:  # safetensors raises its own error types
        raise EditscopeError(f"{path}: not a safetensors patch ({exc})") from None
    return meta, tensors


class _MetaReader:
    """Typed reads of a patch's metadata keys (JSON text unless ``kind`` is str), each failure one line naming the
    file and the key."""

    def __init__(self, path: Path, meta: dict[str, str]) -> None:
        self.path, self.meta = path, meta

    def __call__(self, key: str, default: str | None = None, kind: type = str) -> Any:
        if key not in self.meta and default is None:
            raise EditscopeError(f"{self.path}: patch metadata: key {key!r} is missing")
        text = self.meta.get(key, default)
        try:
            value = json.loads(text) if kind is not str else text
        except ValueError as exc:
            raise EditscopeError(f"{self.path}: patch metadata: key {key!r}: not valid JSON ({exc})") from None
        if not isinstance(value, kind):
            raise EditscopeError(f"{self.path}: patch metadata: key {key!r}: expected {kind.__name__}, "
                                 f"got {type(value).__name__}")
        return value


def _check_requests(path: Path, requests: list[Any]) -> None:
    """``patch info`` prints the prompt, subject and target of every request: each must be a string."""
    for i, request in enumerate(requests):
        if not isinstance(request, dict):
            raise EditscopeError(f"{path}: patch metadata: key 'requests': record {i}: expected an object, got "
                                 f"{type(request).__name__}")
        for name in ("prompt", "subject", "target_new"):
            if not isinstance(request.get(name), str):
                got = "is missing" if name not in request else f"expected str, got {type(request[name]).__name__}"
                raise EditscopeError(f"{path}: patch metadata: key 'requests': record {i}: field {name!r} {got}")


def _check_tensor_names(path: Path, deltas: dict[str, torch.Tensor], bases: dict[str, torch.Tensor] | None,
                        checksums: dict[str, str]) -> None:
    """The checksums name exactly the deltas held, and every delta has a base tensor of its shape (if any)."""
    if set(checksums) != set(deltas):
        raise EditscopeError(f"{path}: patch metadata: key 'checksums' names {sorted(checksums)}, the file holds "
                             f"deltas for {sorted(deltas)}")
    for name, delta in (deltas.items() if bases is not None else ()):
        if name not in bases or bases[name].shape != delta.shape:
            got = "missing" if name not in bases else f"shape {tuple(bases[name].shape)}"
            raise EditscopeError(f"{path}: base tensor {BASE_PREFIX}{name}: {got}, expected shape "
                                 f"{tuple(delta.shape)} as its delta")


def _verify_tensors(path: Path, deltas: dict[str, torch.Tensor], bases: dict[str, torch.Tensor] | None,
                    checksums: dict[str, str], delta_checksums: dict[str, str] | None) -> None:
    """Refuse a patch file whose tensors are not the ones it was saved with: each ΔW against its recorded checksum
    (``delta_checksums``; absent in files saved before it existed) and finite, each base tensor against the
    pre-edit checksum of its parameter. One line naming the file and the tensor."""
    if delta_checksums is not None and set(delta_checksums) != set(deltas):
        raise EditscopeError(f"{path}: patch metadata: key 'delta_checksums' names {sorted(delta_checksums)}, the file "
                             f"holds deltas for {sorted(deltas)}")
    for name, delta in sorted(deltas.items()):
        if delta_checksums is not None and tensor_checksum(delta) != delta_checksums[name]:
            raise EditscopeError(f"{path}: tensor {name!r}: content does not match the checksum recorded when the "
                                 "patch was saved (the file was altered or corrupted); not using it")
        bad = _non_finite(delta)
        if bad:
            raise EditscopeError(f"{path}: tensor {name!r}: ΔW holds {bad} NaN/inf value(s); not using it")
    for name, base in sorted((bases or {}).items()):
        if name in checksums and tensor_checksum(base) != checksums[name]:
            raise EditscopeError(f"{path}: tensor {BASE_PREFIX + name!r}: content does not match the pre-edit "
                                 "checksum of its parameter (the file was altered or corrupted); not using it")
