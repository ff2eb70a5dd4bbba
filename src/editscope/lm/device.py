"""Where a model runs and in which precision: ``--device cpu|cuda|cuda:N|auto`` and
``--dtype float32|bfloat16|float16``.

``auto`` (the default; ``EDITSCOPE_DEVICE`` sets another, e.g. ``cpu`` for a test run on a GPU machine) is CUDA
when available, else CPU. With no dtype the model stays float32 (the weights as loaded); a lower precision changes
the weights, so it changes the bundle's fingerprint (statistics and patches of the float32 model are never served
to its bfloat16 copy). Statistics and solves keep their own float64/float32
arithmetic whatever the model's dtype. The device does not change the fingerprint.
"""

from __future__ import annotations

import hashlib
import os

import torch

from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str | None) -> torch.device:
    """The torch device of a ``--device`` value; None: ``$EDITSCOPE_DEVICE``, else ``auto`` (the default:
    CUDA when available, else CPU). A one-line error for a CUDA request without CUDA."""
    source = "--device"
    if not spec:
        spec, source = os.environ.get("EDITSCOPE_DEVICE") or "auto", "EDITSCOPE_DEVICE"
    text = spec.strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        index = text[5:]
        if index and not index.isdigit():
            raise EditscopeError(f"{source} {spec!r}: expected cuda:N with N a GPU number")
        if not torch.cuda.is_available():
            raise EditscopeError(f"{source} {spec}: CUDA is not available here (torch {torch.__version__}, "
                                 f"built with CUDA {torch.version.cuda}); use --device cpu")
        if index and int(index) >= torch.cuda.device_count():
            raise EditscopeError(f"{source} {spec}: only {torch.cuda.device_count()} GPU(s) visible")
        return torch.device(text)
    raise EditscopeError(f"{source} {spec!r}: expected cpu, cuda, cuda:N or auto")


def dtype_name(precision: torch.dtype) -> str:
    """The ``--dtype`` name of a torch dtype (``torch.bfloat16`` -> ``bfloat16``)."""
    return str(precision).removeprefix("torch.")


def resolve_dtype(spec: str | None) -> torch.dtype:
    if spec is None:
        return torch.float32
    dtype = DTYPES.get(str(spec).strip().lower())
    if dtype is None:
        raise EditscopeError(f"--dtype {spec!r}: expected one of {', '.join(DTYPES)}")
    return dtype


def place(bundle: Bundle, device: str | None = None, dtype: str | None = None) -> Bundle:
    """Move ``bundle``'s model to ``device`` in ``dtype`` (in place; returns the bundle). Must run before any
    patch is applied: a patch's ΔW was computed for the weights it names."""
    target, precision = resolve_device(device), resolve_dtype(dtype)
    if bundle.applied:
        raise EditscopeError(f"{bundle.name}: cannot change device/dtype with patches applied")
    current = next(bundle.model.parameters()).dtype
    bundle.model.to(device=target, dtype=precision)
    if precision != current:
        bundle.base_fingerprint = precision_fingerprint(bundle.base_fingerprint, precision)
    return bundle


def precision_fingerprint(fingerprint: str, precision: torch.dtype) -> str:
    """The fingerprint of float32 weights (``fingerprint``) once converted to ``precision``: the same whether they
    are converted on load or read from a folder already converted (a registry model's lower-precision cache)."""
    return hashlib.blake2b(f"{fingerprint}:{precision}".encode(), digest_size=16).hexdigest()

