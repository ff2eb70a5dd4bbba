"""A run directory kept small: its ``run.json`` and its rows without their raw probes, gzip-compressed.

A results row is ~60 KB, almost all of it the raw pre/post probes (per-token log-probs, hidden-state cosines) that
edit cards and some suite figures read; the summaries, pivots, curves and retention figures read only the
metrics. An archive keeps what those need (every row with ``pre``/``post`` emptied; ~1/20 of the size compressed),
so a page of measured tables (``editscope report --reproduction``) can be regenerated, and paired against, after
the run directories themselves are gone. :func:`editscope.run.store.run_rows` reads an archive where a folder
has no ``results.jsonl``.

Every archive folder is sealed (:mod:`editscope.integrity`): ``digest.json`` records the digest of its ``run.json`` and
its rows (a models list's folder: of its ``models.json``), checked before an archived run is read
(:func:`editscope.run.store.run_rows`); an archive without one (an earlier editscope's) is refused unless
``--trust-unverified``.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from editscope.atomic import atomic_write_bytes, make_dirs
from editscope.errors import EditscopeError
from editscope.integrity import seal_folder
from editscope.run.store import ARCHIVE, MODELS_JSON, RUN_JSON, dumps_row, run_rows


def slim_row(row: dict) -> dict:
    """The row without its raw probes (what summaries, pivots and curves read is kept)."""
    return {**row, "pre": {}, "post": {}}


def archive_run(run_dir: str | Path, dest: str | Path) -> list[Path]:
    """Write the archive of ``run_dir`` (a run, or a models list's folder of runs) to ``dest``, mirroring its
    layout: each run's ``run.json`` and its rows as ``ARCHIVE`` (gzip with a fixed timestamp: the same rows give the
    same bytes), and a models list's ``models.json``. Returns the archive files written."""
    run_dir, dest = Path(run_dir), Path(dest)
    if dest.resolve() == run_dir.resolve():
        raise EditscopeError(f"{dest}: an archive of a run goes to another folder than the run's own")
    written = []
    if (run_dir / MODELS_JSON).is_file():
        make_dirs(dest, "folder")
        shutil.copyfile(run_dir / MODELS_JSON, dest / MODELS_JSON)
        seal_folder(dest, [MODELS_JSON])
    for meta in sorted(run_dir.glob(f"**/{RUN_JSON}")):
        src = meta.parent
        out = dest / src.relative_to(run_dir)
        make_dirs(out, "folder")
        shutil.copyfile(meta, out / RUN_JSON)
        text = "".join(dumps_row(slim_row(r)) + "\n" for r in run_rows(src))
        atomic_write_bytes(out / ARCHIVE, gzip.compress(text.encode("utf-8"), mtime=0))
        seal_folder(out, [RUN_JSON, ARCHIVE])
        written.append(out / ARCHIVE)
    return written


__all__ = ["archive_run", "slim_row"]
