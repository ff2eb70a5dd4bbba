"""A run's archive (editscope.run.archive): its rows without raw probes, gzip-compressed, read back by
``run_rows`` where a folder has no results.jsonl; the same rows give the same bytes; a models list's layout is
mirrored; archiving onto the run itself is refused."""

from __future__ import annotations

import gzip
import json

import pytest

from editscope.errors import EditscopeError
from editscope.rowdigest import KEY, digest
from editscope.run.archive import archive_run
from editscope.run.store import ARCHIVE, RESULTS, has_rows, run_rows


def _row(case: str, method: str, es: float) -> dict:
    return {"dataset": "counterfact", "case_id": case, "method": method, "group": 0, "index": int(case),
            "metrics": {"counterfact": {"ES_post": es}}, "pre": {"counterfact": {"nll": [1.0, 2.0]}},
            "post": {"counterfact": {"nll": [0.5, 0.25]}}, "edit_info": {"seconds": 1.5}}


def _run(folder, rows):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"status": "complete"}))
    (folder / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_archive_keeps_every_field_but_the_raw_probes(tmp_path):
    rows = [_row("1", "memit", 1.0), _row("2", "memit", 0.0), _row("1", "rome", 1.0)]
    _run(tmp_path / "run", rows)
    (written,) = archive_run(tmp_path / "run", tmp_path / "kept" / "run")
    assert written == tmp_path / "kept" / "run" / ARCHIVE
    lines = gzip.decompress(written.read_bytes()).decode().splitlines()
    assert [{k: v for k, v in json.loads(x).items() if k != KEY} for x in lines] == [
        {**r, "pre": {}, "post": {}} for r in rows]
    assert all(json.loads(x)[KEY] == digest(json.loads(x)) for x in lines)  # each slim row sealed anew
    assert run_rows(tmp_path / "kept" / "run") == [{**r, "pre": {}, "post": {}} for r in rows]
    assert json.loads((tmp_path / "kept" / "run" / "run.json").read_text()) == {"status": "complete"}
    assert has_rows(tmp_path / "kept") and not has_rows(tmp_path / "nothing")
    # the same rows give the same bytes (no timestamp in the gzip header): re-archiving changes no file in git
    first = written.read_bytes()
    archive_run(tmp_path / "run", tmp_path / "kept" / "run")
    assert written.read_bytes() == first
    # a folder with both reads its results file
    _run(tmp_path / "both", rows[:1])
    archive_run(tmp_path / "run", tmp_path / "both")
    assert len(run_rows(tmp_path / "both")) == 1


def test_a_models_list_is_archived_model_by_model(tmp_path):
    top = tmp_path / "models-run"
    _run(top / "smollm2-135m", [_row("1", "memit", 1.0)])
    _run(top / "gemma3-270m", [_row("1", "memit", 0.0)])
    (top / "models.json").write_text(json.dumps({"models": [{"dir": "smollm2-135m"}, {"dir": "gemma3-270m"}]}))
    written = archive_run(top, tmp_path / "kept")
    assert sorted(p.parent.name for p in written) == ["gemma3-270m", "smollm2-135m"]
    assert (tmp_path / "kept" / "models.json").read_text() == (top / "models.json").read_text()
    assert run_rows(tmp_path / "kept" / "gemma3-270m")[0]["metrics"] == {"counterfact": {"ES_post": 0.0}}


def test_archiving_a_run_onto_itself_is_refused(tmp_path):
    _run(tmp_path / "run", [_row("1", "memit", 1.0)])
    with pytest.raises(EditscopeError, match="another folder"):
        archive_run(tmp_path / "run", tmp_path / "run")
