"""Writing never clobbers what is not ours: the atomic writer refuses an existing path that is not a regular file (a
character device, a FIFO, a folder) in one line naming it and leaves it as it was; a symbolic link to a regular file
is written through (the link stays); new files and folders get the process's umask, a replaced file keeps its mode.
The commands that write a user-named file (``edit --save-patch``, ``locate --plot``, ``simulate --plot``) refuse
such a path before any work, and ``stats compute`` refuses a budget or row length of 0 instead of reading the
default."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager

import pytest

from editscope.atomic import atomic_write, atomic_write_text, build_dir, new_dir, write_target
from editscope.cli import main
from editscope.errors import EditscopeError


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def char_device(tmp_path):
    """A character device (the node of /dev/null): made in tmp_path where the process may (root), else /dev/null
    itself, which an unprivileged process could not replace even if the writer tried (no file can be created in
    /dev), so the test fails on the message instead of harming the machine."""
    path = tmp_path / "null"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        if os.geteuid() == 0:
            pytest.skip("root without CAP_MKNOD: not risking the machine's /dev/null")
        path = "/dev/null"
    yield str(path)
    assert stat.S_ISCHR(os.stat(path).st_mode), f"{path} is no longer a character device"


def _leftovers(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.endswith(".tmp"))


def test_a_character_device_is_refused_and_left_as_it_is(char_device):
    before = os.stat(char_device)
    with pytest.raises(EditscopeError) as err:
        atomic_write_text(char_device, "x")
    assert str(err.value) == f"{char_device}: is a character device, not a regular file; refusing to replace it"
    after = os.stat(char_device)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert _leftovers(os.path.dirname(char_device)) == []
    called = []
    with pytest.raises(EditscopeError, match="is a character device"):  # refused before the writer runs
        atomic_write(char_device, called.append)
    assert called == []


def test_a_fifo_a_folder_and_links_to_them_are_refused(tmp_path):
    fifo, folder = tmp_path / "fifo", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    (folder / "keep").write_text("k")
    for path, kind in ((fifo, "a FIFO"), (folder, "a folder")):
        with pytest.raises(EditscopeError) as err:
            atomic_write_text(path, "x")
        assert str(err.value) == f"{path}: is {kind}, not a regular file; refusing to replace it"
    link = tmp_path / "to-fifo"
    link.symlink_to(fifo)
    with pytest.raises(EditscopeError) as err:
        atomic_write_text(link, "x")
    assert str(err.value) == (f"{link}: is a symbolic link to a FIFO ({fifo}), not a regular file; refusing to "
                              "replace it")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "missing")
    with pytest.raises(EditscopeError, match=rf"^{dangling}: a symbolic link to {tmp_path / 'missing'}, which cannot "
                                             "be written: No such file or directory$"):
        atomic_write_text(dangling, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and (folder / "keep").read_text() == "k"
    assert os.path.islink(link) and os.path.islink(dangling) and not (tmp_path / "missing").exists()
    assert _leftovers(tmp_path) == []


def test_a_link_to_a_regular_file_is_written_through(tmp_path):
    real = tmp_path / "data" / "real.json"
    real.parent.mkdir()
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.json"
    link.symlink_to(os.path.relpath(real, tmp_path))
    assert write_target(link)[0] == real
    assert atomic_write_text(link, "new") == link
    assert os.path.islink(link) and os.readlink(link) == "data/real.json"  # the link is kept as it was
    assert real.read_text() == "new" and stat.S_IMODE(os.stat(real).st_mode) == 0o640
    assert _leftovers(tmp_path) == [] and _leftovers(real.parent) == []


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077], ids=oct)
def test_new_files_and_folders_get_the_umask(tmp_path, mask):
    with umask(mask):
        path = atomic_write_text(tmp_path / "new.txt", "x")
        made = new_dir(tmp_path / "out", lambda tmp: (tmp / "a").write_text("a"))
        cache = build_dir(tmp_path / "cache", lambda tmp: (tmp / "READY").write_text("ok"), ready="READY")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~mask  # was 0o600 whatever the umask
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o777 & ~mask  # was 0o700
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o777 & ~mask


def test_a_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text("old")
    os.chmod(path, 0o600)
    with umask(0o022):
        atomic_write_text(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_save_patch_to_a_device_is_refused_before_the_edit(capsys, char_device):
    argv = ["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is in", "--subject", "Paris",
            "--target", "Rome", "--save-patch", char_device]
    assert main(argv) == 2
    assert _one_error_line(capsys) == (f"editscope: error: {char_device}: is a character device, not a regular "
                                       "file; refusing to replace it")


def test_locate_plot_to_a_device_is_refused_before_the_trace(capsys, char_device):
    argv = ["locate", "--model", "no-such-model", "--prompt", "{} is in", "--subject", "Paris", "--plot", char_device]
    assert main(argv) == 2  # refused before the (unknown) model is looked up
    assert _one_error_line(capsys) == (f"editscope: error: {char_device}: is a character device, not a regular "
                                       "file; refusing to replace it")


def test_simulate_plot_names_the_file_it_wrote(tmp_path, capsys, char_device):
    out = tmp_path / "figure"  # no extension: a PNG at exactly this path (it went to figure.png, named "figure")
    assert main(["simulate", "--answers", "2", "4", "--trials", "10", "--plot", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"plot written to {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "figure.png").exists()
    assert main(["simulate", "--answers", "2", "--trials", "10", "--plot", str(tmp_path / "f.xyz")]) == 2
    assert _one_error_line(capsys) == (f"editscope: error: {tmp_path / 'f.xyz'}: cannot write a plot as 'xyz'; use "
                                       ".png, .pdf or .svg")
    assert main(["simulate", "--answers", "2", "--trials", "10", "--plot", char_device]) == 2
    assert _one_error_line(capsys) == (f"editscope: error: {char_device}: is a character device, not a regular "
                                       "file; refusing to replace it")


@pytest.mark.parametrize(("option", "value", "rng"), [
    ("--budget", "0", "[1, 1e12]"), ("--seq-len", "0", "[1, 1000000]"), ("--budget", "-5", "[1, 1e12]"),
])
def test_stats_compute_refuses_a_zero_budget_or_row_length(capsys, option, value, rng):
    # 0 meant "the default" before (args.budget or DEFAULT): a command asking for 0 tokens ran 100,000
    with pytest.raises(SystemExit) as exit_info:
        main(["stats", "compute", "--model", "no-such-model", "--layers", "0", option, value])
    assert exit_info.value.code == 2
    assert _one_error_line(capsys) == (f"editscope stats compute: error: argument {option}: must be an integer in "
                                       f"{rng}, got '{value}'")


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_files_a_library_writes_itself_get_the_umask(tmp_path, mask):
    """safetensors' save_file replaces the temporary file by one of its own, mode 0o600: the patch, statistics and
    chain files it writes must still get the umask's mode, like every other file editscope writes."""
    import torch
    from safetensors.torch import save_file

    from editscope.atomic import atomic_write

    with umask(mask):
        path = atomic_write(tmp_path / "stats.safetensors", lambda tmp: save_file({"c": torch.ones(2)}, str(tmp)))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~mask
    os.chmod(path, 0o600)  # a replaced file keeps its own mode
    with umask(0o022):
        atomic_write(path, lambda tmp: save_file({"c": torch.zeros(2)}, str(tmp)))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
