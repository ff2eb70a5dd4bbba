"""Atomic writes and locks: the one place editscope puts a file or a folder on disk that others may read.

A reader never sees a partial file or folder: everything is written under a unique temporary name in the
target's own folder (so the final rename stays on one file system) and renamed into place. Caches that
several processes may build at once (converted models, tokenizers, layer statistics, co-occurrence counts)
take a lock around the build, so the second process waits and then reads what the first one wrote instead of
building it again. Locks are ``fcntl.flock`` on a lock file: the OS releases them when the process exits,
also on a crash or SIGKILL.

A write never replaces what is not a file of ours to replace (:func:`write_target`): an existing path that is not a
regular file (a character device such as ``/dev/null``, a FIFO, a socket, a folder) is refused with one line naming
it and stays as it is. A symbolic link is followed to the regular file it points to: that file is replaced and the
link is kept, as a plain ``open(path, "w")`` would write through it; a link to anything else, or to nothing, is
refused. New files and folders get the process's umask, as ``open`` and ``mkdir`` give them (the temporary is
created with mode 0o666 / 0o777 and the kernel applies the umask); a file that replaces an existing one keeps that
file's permission bits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import sys
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


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def write_target(path: str | Path) -> tuple[Path, os.stat_result | None]:
    """Where a write to ``path`` lands, and what is there now: ``path`` itself (None: nothing yet), or, for a
    symbolic link, the regular file it points to. An existing ``path`` that is not a regular file, or a link to one
    that is not (or to nothing), is an :class:`EditscopeError` naming it; nothing is touched. Commands call it
    before long work so that ``--save-patch /dev/null`` fails at once."""
    path = Path(path)
    try:
        link = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file in the way of its folder: said later)
        return path, None
    except OSError as exc:  # no permission to look...
        raise EditscopeError(f"{path}: cannot write: {exc.strerror or exc}") from None
    target = Path(os.path.realpath(path)) if stat.S_ISLNK(link.st_mode) else path
    try:
        st = os.stat(target)
    except OSError as exc:
        raise EditscopeError(f"{path}: a symbolic link to {target}, which cannot be written: "
                             f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        what = f"a symbolic link to {_kind(st.st_mode)} ({target})" if target != path else _kind(st.st_mode)
        raise EditscopeError(f"{path}: is {what}, not a regular file; refusing to replace it")
    return target, st


def _umask() -> int:
    """The process's umask (read by setting it and setting it back: POSIX has no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _new_temp(folder: Path, name: str, *, folder_too: bool = False) -> Path:
    """A new empty file (or folder) ``folder/.NAME.RANDOM.tmp`` created with mode 0o666 (0o777), so the kernel
    applies the process's umask as it does for ``open``/``mkdir`` (``tempfile.mkstemp`` would give 0o600)."""
    for _ in range(100):
        tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            if folder_too:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name in {folder}")


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
    For libraries that write to a path themselves (``safetensors.torch.save_file``). ``path`` must be missing, a
    regular file or a symbolic link to one (:func:`write_target`: the link's target is replaced, the link kept);
    returns ``path``."""
    path = Path(path)
    target, existing = write_target(path)
    _writable_parent(target)
    try:
        tmp = _new_temp(target.parent, target.name)
    except OSError as exc:
        raise EditscopeError(f"{path}: cannot write into {target.parent}: {exc.strerror or exc}") from None
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        # a replaced file keeps its permission bits; a new one gets the umask's, also when the writer replaced our
        # temporary file by one of its own (safetensors writes 0o600 whatever the umask)
        os.chmod(tmp, stat.S_IMODE(existing.st_mode) if existing is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
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
        tmp = _new_temp(target.parent, target.name, folder_too=True)
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
        tmp = _new_temp(target.parent, target.name, folder_too=True)
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
