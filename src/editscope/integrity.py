"""One rule for every file editscope writes and later reads back as the state it continues from (chain checkpoints,
patches, layer statistics and their exports, tune state, reproduction archives): a **content digest over the whole
content** — every tensor (name, dtype, shape, bytes) *and* every metadata entry — recorded in the file when it is
written and checked before anything in it is used.

Each file records a small manifest beside its content: one blake2b per metadata entry and per tensor, plus the digest
of that manifest (:data:`DIGEST_KEY`). On read, the manifest's own digest is checked first (an altered manifest is
damage too), then every entry against its line of the manifest, so the one-line error names the file and *what* did
not match (a tensor, a metadata key, an entry added or removed). Files of the three shapes editscope writes:

* safetensors: :func:`seal` adds the manifest to the string metadata; :func:`verify` checks it against what
  ``safe_open`` read;
* a JSON object: :func:`seal_json` / :func:`verify_json` (the manifest under :data:`DIGEST_KEY`, over the other keys);
* a folder of files (a reproduction archive): :func:`seal_folder` writes :data:`FOLDER_MANIFEST` with one digest per
  file; :func:`verify_folder`.

A file without a digest (written by an earlier editscope, or with the digest removed) is refused with one line that
says how to proceed — delete it to recompute, or accept it unverified — unless the caller trusts unverified files
(the ``--trust-unverified`` flag of the commands that read them: :func:`trusting`). Every file accepted that way is
remembered (:func:`unverified`) so the command records it with its output (``run.json``, the edited folder's note,
the tune provenance, the imported statistics). A file that can simply be recomputed (a layer-statistics cache file)
is not refused: its reader recomputes it and says so in a log line.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from editscope.errors import EditscopeError

#: where the manifest goes: a safetensors metadata key, a JSON object's key
DIGEST_KEY = "content_digest"
#: a sealed folder's manifest file
FOLDER_MANIFEST = "digest.json"
FORMAT = "blake2b-1"
TRUST_FLAG = "--trust-unverified"

_TRUST: contextvars.ContextVar[bool] = contextvars.ContextVar("editscope_trust_unverified", default=False)
_UNVERIFIED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("editscope_unverified", default=None)


class IntegrityError(EditscopeError):
    """A file read back does not match its recorded content digest, or has none (one line naming the file)."""


# -- trust ------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def trusting(trust: bool = True) -> Iterator[list[str]]:
    """Within the block, files without a digest are accepted (and listed in the yielded list, which
    :func:`unverified` also returns) when ``trust``; a damaged digest is refused whatever ``trust`` says."""
    files: list[str] = []
    t1, t2 = _TRUST.set(trust), _UNVERIFIED.set(files)
    try:
        yield files
    finally:
        _TRUST.reset(t1)
        _UNVERIFIED.reset(t2)


def unverified() -> list[str]:
    """The files accepted without a digest inside the innermost :func:`trusting` block (empty outside one)."""
    return list(_UNVERIFIED.get() or [])


def trusted() -> bool:
    """Whether files without a digest are accepted here (the innermost :func:`trusting` block's ``trust``): what a
    process that reads such files for this one (a Ray actor) must be told, as it does not share the context."""
    return _TRUST.get()


def note_unverified(paths: list[str]) -> None:
    """Add files another process accepted unverified for this one (a Ray actor) to the innermost :func:`trusting`
    block's list, so the output records them as if they had been read here."""
    files = _UNVERIFIED.get()
    if files is not None:
        files += [p for p in paths if p not in files]


def _missing(path: str | Path, what: str, hint: str, trust: bool | None) -> bool:
    """A file without a digest: accepted (recorded; False: not verified) when trusted, with one line on stderr the
    first time in the trusting block (the run's record alone is easy to miss), else refused."""
    if trust if trust is not None else _TRUST.get():
        files = _UNVERIFIED.get()
        if files is None or str(path) not in files:
            print(f"editscope: warning: {path}: {what} has no content digest; used unverified ({TRUST_FLAG})",
                  file=sys.stderr, flush=True)
        if files is not None and str(path) not in files:
            files.append(str(path))
        return False
    raise IntegrityError(f"{path}: {what} has no content digest (written by an earlier editscope, or the digest was "
                         f"removed), so it cannot be checked; {hint}, or pass {TRUST_FLAG} to use it unverified")


# -- digests ----------------------------------------------------------------------------------------------------------
def _h(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def tensor_digest(tensor: Any) -> str:
    """blake2b of a tensor's dtype, shape and bytes (on the host)."""
    import torch

    t = tensor.detach().contiguous().cpu()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # host: t is .cpu() above
    return h.hexdigest()


def value_digest(value: Any) -> str:
    """blake2b of a JSON value in canonical form (sorted keys, no spaces); a string is hashed as it is."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"),
                                                           ensure_ascii=False, allow_nan=False)
    return _h(("s:" if isinstance(value, str) else "j:").encode() + text.encode("utf-8", "surrogatepass"))


def _manifest(entries: Mapping[str, str]) -> str:
    return json.dumps({"format": FORMAT, "entries": dict(sorted(entries.items()))}, sort_keys=True,
                      separators=(",", ":"))


def _sealed(entries: Mapping[str, str]) -> str:
    text = _manifest(entries)
    return json.dumps({"manifest": json.loads(text), "digest": _h(text.encode())}, sort_keys=True,
                      separators=(",", ":"))


def _entries(metadata: Mapping[str, Any], tensors: Mapping[str, Any] | None = None) -> dict[str, str]:
    out = {f"meta:{k}": value_digest(v) for k, v in metadata.items() if k != DIGEST_KEY}
    out |= {f"tensor:{k}": tensor_digest(v) for k, v in (tensors or {}).items()}
    return out


def _describe(entry: str) -> str:
    kind, _, name = entry.partition(":")
    return {"meta": f"metadata key {name!r}", "tensor": f"tensor {name!r}", "file": f"file {name!r}",
            "key": f"key {name!r}"}.get(kind, repr(entry))


def _check(path: str | Path, what: str, recorded: Any, actual: dict[str, str]) -> None:
    """Compare the recorded seal (the JSON text of :func:`_sealed`) with the entries computed from the content."""
    try:
        seal = json.loads(recorded) if isinstance(recorded, str) else recorded
        manifest, digest = seal["manifest"], seal["digest"]
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
        entries = manifest["entries"]
        ok = isinstance(entries, dict) and manifest.get("format") == FORMAT and all(
            isinstance(v, str) for v in entries.values())
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        ok = False
    if not ok or _h(text.encode()) != digest:
        raise IntegrityError(f"{path}: {what}: its recorded content digest is itself damaged (the file was altered or "
                             "corrupted); not using it")
    for entry in sorted(set(entries) | set(actual)):
        if entry not in actual:
            raise IntegrityError(f"{path}: {what}: {_describe(entry)} is missing (the file was altered or "
                                 "corrupted); not using it")
        if entry not in entries:
            raise IntegrityError(f"{path}: {what}: {_describe(entry)} is not covered by the recorded content digest "
                                 "(added after the file was written); not using it")
        if entries[entry] != actual[entry]:
            raise IntegrityError(f"{path}: {what}: {_describe(entry)} does not match the recorded content digest (the "
                                 "file was altered or corrupted); not using it")


# -- safetensors ------------------------------------------------------------------------------------------------------
def seal(metadata: Mapping[str, str], tensors: Mapping[str, Any]) -> dict[str, str]:
    """``metadata`` plus :data:`DIGEST_KEY`: the digest of every metadata entry and every tensor, for ``save_file``."""
    meta = {k: v for k, v in metadata.items() if k != DIGEST_KEY}
    return meta | {DIGEST_KEY: _sealed(_entries(meta, tensors))}


def verify(path: str | Path, metadata: Mapping[str, str], tensors: Mapping[str, Any], *, what: str,
           hint: str, trust: bool | None = None) -> bool:
    """Check what ``safe_open`` read from ``path`` against its recorded digest before it is used: True when verified,
    False when the file has none and unverified files are trusted (see the module docstring); an
    :class:`IntegrityError` (one line naming the file and what did not match) otherwise. ``what`` names the kind of
    file, ``hint`` what the user can do instead of trusting it (e.g. "delete it to restart the chain")."""
    if DIGEST_KEY not in metadata:
        return _missing(path, what, hint, trust)
    _check(path, what, metadata[DIGEST_KEY], _entries(metadata, tensors))
    return True


# -- JSON objects -----------------------------------------------------------------------------------------------------
def seal_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object plus :data:`DIGEST_KEY` over its other keys (values as canonical JSON)."""
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    return body | {DIGEST_KEY: json.loads(_sealed({f"key:{k}": value_digest(v) for k, v in body.items()}))}


def verify_json(path: str | Path, data: Any, *, what: str, hint: str, trust: bool | None = None) -> dict[str, Any]:
    """``data`` (what ``json.loads`` gave for ``path``) without its digest, after checking it (as :func:`verify`)."""
    if not isinstance(data, dict):
        raise IntegrityError(f"{path}: {what}: expected a JSON object, got {type(data).__name__}; the file was "
                             "altered or corrupted")
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    if DIGEST_KEY not in data:
        _missing(path, what, hint, trust)
        return body
    try:
        actual = {f"key:{k}": value_digest(v) for k, v in body.items()}
    except ValueError:  # a NaN where none was written
        raise IntegrityError(f"{path}: {what}: holds a non-finite number; the file was altered or corrupted") from None
    _check(path, what, data[DIGEST_KEY], actual)
    return body


def read_json(path: str | Path, *, what: str, hint: str, trust: bool | None = None) -> dict[str, Any]:
    """Read and :func:`verify_json` a sealed JSON file; unreadable text is the same one line."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise IntegrityError(f"{path}: {what}: not readable JSON ({reason}); the file was altered or corrupted; "
                             f"{hint}") from None
    return verify_json(path, data, what=what, hint=hint, trust=trust)


def dumps_sealed(data: Mapping[str, Any], **kwargs: Any) -> str:
    """``json.dumps`` of :func:`seal_json` (strict: no NaN) with a final newline."""
    return json.dumps(seal_json(data), allow_nan=False, **kwargs) + "\n"


# -- folders ----------------------------------------------------------------------------------------------------------
def _file_entries(folder: Path, names: list[str]) -> dict[str, str]:
    return {f"file:{n}": file_digest(folder / n) for n in names if (folder / n).is_file()}


def file_digest(path: Path, chunk: int = 1 << 24) -> str:
    """blake2b of a file's bytes (:func:`_h` of them), read in chunks: a converted model's weights (7 GB for
    Qwen2.5-Coder-1.5B in float32) are checked on every load without their size in memory."""
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            h.update(block)
    return h.hexdigest()


def seal_folder(folder: str | Path, names: list[str]) -> Path:
    """Write ``folder``/:data:`FOLDER_MANIFEST`: the digest of each file of ``names`` (written last, atomically)."""
    from editscope.atomic import atomic_write_text

    folder = Path(folder)
    text = _sealed(_file_entries(folder, names))
    return atomic_write_text(folder / FOLDER_MANIFEST, text + "\n")


def verify_folder(folder: str | Path, names: list[str], *, what: str, hint: str, trust: bool | None = None) -> bool:
    """Check the files ``names`` of ``folder`` (those present, and those the manifest lists) against its manifest."""
    folder = Path(folder)
    manifest = folder / FOLDER_MANIFEST
    if not manifest.is_file():
        return _missing(folder, what, hint, trust)
    try:
        recorded = manifest.read_text(encoding="utf-8")
        listed = [e[len("file:"):] for e in json.loads(recorded)["manifest"]["entries"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        recorded, listed = "", []
    try:
        extra = {n for n in listed if isinstance(n, str) and n and "/" not in n and n not in (".", "..")}
        actual = _file_entries(folder, sorted(set(names) | extra))
    except OSError as exc:
        raise IntegrityError(f"{folder}: {what}: cannot read ({exc.strerror or exc})") from None
    _check(folder, what, recorded, actual)
    return True


__all__ = ["DIGEST_KEY", "FOLDER_MANIFEST", "TRUST_FLAG", "IntegrityError", "dumps_sealed", "note_unverified",
           "read_json", "seal", "seal_folder", "seal_json", "tensor_digest", "trusted", "trusting", "unverified",
           "value_digest", "verify", "verify_folder", "verify_json"]
