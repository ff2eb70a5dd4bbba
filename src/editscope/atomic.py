"""Atomic writes and locks: the one place editscope puts a file or a folder on disk that others may read.

A reader never sees a partial file or folder: everything is written under a unique temporary name in the
target's own folder (so the final rename stays on one file system) and renamed into place. Caches that
several processes may build at once (converted models, tokenizers, layer statistics, co-occurrence counts)
take a lock around the build, so the second process waits and then reads what the first one wrote instead of
building it again. Locks are ``fcntl.flock`` on a lock file: the OS releases them when the process exits,
also on a crash or SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from editscope.errors import EditscopeError


def _writable_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EditscopeError(f"{path}: cannot create its folder {path.parent}: {exc.strerror}") from None


def make_dirs(path: str | Path, what: str = "output folder") -> Path:
    """``mkdir -p path``; a folder that cannot be created (a file in the way, no permission) is one line naming
    it instead of an OSError traceback."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EditscopeError(f"{path}: cannot create the {what}: {exc.strerror or exc}") from None
    return path


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to write a temporary file beside ``path``, fsync it, rename it to ``path``.
    For libraries that write to a path themselves (``safetensors.torch.save_file``)."""
    path = Path(path)
    _writable_parent(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise EditscopeError(f"{path}: cannot write into {path.parent}: {exc.strerror}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # disk full, permissions, a folder in the way...
        tmp.unlink(missing_ok=True)
        raise EditscopeError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _holder(fh) -> tuple[str, str]:
    """(pid, what it builds) written in a lock file by its holder; the holder writes them just after taking the
    lock, so an empty file is read again for a moment before giving up ("unknown")."""
    for _ in range(20):
        fh.seek(0)
        lines = fh.read().splitlines()
        if lines and lines[0].strip():
            return lines[0].strip(), (lines[1].strip() if len(lines) > 1 else "")
        time.sleep(0.025)
    return "unknown", ""


@contextmanager
def file_lock(path: str | Path, *, blocking: bool = True, what: str = "") -> Iterator[Path]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block; the holder's pid and ``what`` (what
    it guards or builds) are written in the file while it is held. Non-blocking: a lock held by another process
    is an :class:`EditscopeError` naming that process's pid. Blocking: when another process holds it, one line
    "waiting for process N (building X)" goes to stderr before waiting, so a wait is never silent."""
    path = Path(path)
    _writable_parent(path)
    try:
        fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (closed below; closing releases the lock)
    except OSError as exc:
        raise EditscopeError(f"{path}: cannot open the lock file: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, building = _holder(fh)
            if not blocking:
                raise EditscopeError(f"{what or path}: in use by another editscope process (pid {pid})") from None
            print(f"editscope: waiting for process {pid} (building {building or what or path}); lock {path}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n{what or path}\n")
        fh.flush()
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):  # an empty file: nobody holds it (a crash leaves the last holder)
                fh.truncate(0)
    finally:
        fh.close()


def build_dir(target: str | Path, build: Callable[[Path], None], *, ready: str | None = None,
              what: str | None = None) -> Path:
    """The folder ``target``, built once by ``build(tmp_folder)`` if it is missing.

    ``ready`` names a file inside the folder that marks it complete (default: the folder itself). The build
    runs under a lock beside the target, into a unique temporary folder renamed into place at the end, so
    concurrent callers build it once and never see it half-written; a folder left without its ``ready``
    file (an old partial build) is replaced. ``what`` (default: the target's path) names the build in the lock
    file, for the "waiting for process N (building X)" line a second caller prints."""
    target = Path(target)

    def complete() -> bool:
        return (target / ready).is_file() if ready else target.is_dir()

    if complete():
        return target
    with file_lock(target.parent / f".{target.name}.lock", what=what or str(target)):
        if complete():  # another process built it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        try:
            build(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def new_dir(target: str | Path, build: Callable[[Path], None]) -> Path:
    """Create the folder ``target`` (which must not exist) by ``build(tmp_folder)`` on a unique temporary folder
    renamed into place: an interrupted build leaves no partial ``target``. For outputs a user names (no lock
    file is left beside them); a folder that appears meanwhile makes the rename fail rather than be replaced."""
    target = Path(target)
    if target.exists():
        raise EditscopeError(f"{target}: output folder exists")
    _writable_parent(target)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise EditscopeError(f"{target}: cannot write into {target.parent}: {exc.strerror}") from None
    try:
        build(tmp)
        os.rename(tmp, target)  # refuses to replace a non-empty folder created meanwhile
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EditscopeError(f"{target}: cannot write the folder: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
