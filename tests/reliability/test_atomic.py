"""The one atomic-write and lock helper: concurrent builders build a cache folder once and
no reader sees it half-written; a failed write leaves the old file and no temporary behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from editscope.atomic import atomic_write, atomic_write_text, build_dir, file_lock
from editscope.errors import EditscopeError

BUILDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from editscope.atomic import build_dir

    root = Path(sys.argv[1])
    def build(tmp):
        with open(root / "builds.log", "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        for i in range(20):  # slow enough that every process arrives during the build
            (tmp / f"part{i}").write_text(str(i))
            time.sleep(0.02)
        (tmp / "READY").write_text("ok")
    out = build_dir(root / "cache", build, ready="READY")
    print(len(list(out.iterdir())))
""")


def test_concurrent_builders_build_once_and_see_a_whole_folder(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 6
    assert outs == ["21"] * 6  # 20 parts + READY, in every process
    assert len((tmp_path / "builds.log").read_text().split()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache.lock", "builds.log", "cache"]


def test_partial_folder_without_marker_is_rebuilt(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "half").write_text("x")
    out = build_dir(tmp_path / "cache", lambda tmp: (tmp / "READY").write_text("ok"), ready="READY")
    assert sorted(p.name for p in out.iterdir()) == ["READY"]


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = atomic_write_text(tmp_path / "a.json", "old")

    def broken(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(EditscopeError, match="a.json: cannot write: disk full"):
        atomic_write(target, broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_unwritable_folder_is_a_one_line_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(EditscopeError, match="cannot create its folder"):
        atomic_write_text(tmp_path / "file" / "sub" / "x.txt", "x")


def test_nonblocking_lock_names_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from editscope.atomic import file_lock
        with file_lock({str(tmp_path / "l")!r}):
            print("locked", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(EditscopeError, match=f"pid {holder.pid}"), file_lock(tmp_path / "l", blocking=False):
            pass
    finally:
        holder.kill()
        holder.wait()
    with file_lock(tmp_path / "l", blocking=False):  # released by the OS when the holder died
        pass


def test_blocking_lock_says_who_it_waits_for(tmp_path, capfd):
    # The holder writes its pid and what it builds into the lock file; a second process that must wait prints one
    # line naming both before it waits, then takes the lock once the holder lets go.
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from editscope.atomic import file_lock
        with file_lock({str(tmp_path / "l")!r}, what="the frobnicator cache"):
            print("locked", flush=True)
            sys.stdin.readline()  # held until the test says so
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert (tmp_path / "l").read_text().splitlines() == [str(holder.pid), "the frobnicator cache"]
        threading.Timer(0.5, lambda: (holder.stdin.write("go\n"), holder.stdin.flush())).start()
        with file_lock(tmp_path / "l", what="mine") as path:
            assert holder.wait(timeout=10) == 0  # the holder let go first
            assert path.read_text().splitlines() == [str(os.getpid()), "mine"]
    finally:
        holder.kill()
        holder.wait()
    err = capfd.readouterr().err
    assert f"waiting for process {holder.pid} (building the frobnicator cache)" in err
    assert err.count("waiting for process") == 1
    assert (tmp_path / "l").read_text() == ""  # released: nobody is named as holder
    with file_lock(tmp_path / "l"):  # uncontended: nothing printed
        pass
    assert capfd.readouterr().err == ""
