"""Damaged input to ``inspect`` and ``report`` (``--reproduction`` too), end to end through ``editscope.cli.main``:
each ends in one error line naming the file and what is wrong (exit status 2, no traceback); a ``models`` list whose
report misses one listed model says which in one line and reports the others."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from editscope.cli import main
from editscope.integrity import FOLDER_MANIFEST
from editscope.run.store import ARCHIVE, RESULTS, RUN_JSON, dumps_run_json


def one_error(capsys, rc: int, *needles: str) -> str:
    """The single error line of a command that failed cleanly, checked to contain every needle."""
    err = capsys.readouterr().err
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _copy(run_dir, dest):
    shutil.copytree(run_dir, dest)
    return dest


# -- inspect on a run.json of the wrong shape -----------------------------------------------------------------------
@pytest.mark.parametrize("change,needle", [
    (lambda m: m.update(config=3), "field 'config': expected dict, got int"),  # run.json's own check
    (lambda m: m["config"].update(methods="rome"), "field 'config.methods': expected list, got str"),
    (lambda m: m["config"].update(seed="x"), "field 'config.seed': expected int, got str"),
    (lambda m: m["config"].update(seed=True), "field 'config.seed': expected int, got bool"),
    (lambda m: m["config"].update(methods=["rome"]), "field 'config.methods': expected a list of objects"),
    (lambda m: m["config"].pop("blocks"), "field 'config.blocks' is missing"),
    (lambda m: m["config"].update(mode="sideways"), "field 'config': unknown mode 'sideways'"),
], ids=["config-int", "methods-str", "seed-str", "seed-bool", "methods-of-str", "no-blocks", "bad-mode"])
def test_inspect_a_run_whose_config_has_a_wrong_type(run_dir, tmp_path, capsys, change, needle):
    run = _copy(run_dir, tmp_path / "run")
    meta = json.loads((run / RUN_JSON).read_text())
    change(meta)
    (run / RUN_JSON).write_text(dumps_run_json(meta))
    case = json.loads((run / RESULTS).read_text().splitlines()[0])["case_id"]
    rc = main(["inspect", str(run), "--case", case, "--out", str(tmp_path / "cards"), "--no-progress"])
    one_error(capsys, rc, str(run / RUN_JSON), needle)


@pytest.mark.parametrize("change,needle", [
    (lambda m: m["config"].update(methods="rome"), "field 'config.methods': expected list, got str"),
    (lambda m: m["config"].update(blocks=[{"dataset": "counterfact"}]), "field 'config.blocks': expected a list of "
     "objects with a 'label'"),
], ids=["methods-str", "block-without-label"])
def test_report_a_run_whose_config_has_a_wrong_type(run_dir, tmp_path, capsys, change, needle):
    run = _copy(run_dir, tmp_path / "run")
    meta = json.loads((run / RUN_JSON).read_text())
    change(meta)
    (run / RUN_JSON).write_text(dumps_run_json(meta))
    one_error(capsys, main(["report", str(run), "--out", str(tmp_path / "rep")]), str(run / RUN_JSON), needle)


@pytest.mark.parametrize("change,needle", [
    (lambda m: m.pop("model"), "field 'model' is missing"),
    (lambda m: m.pop("config"), "field 'config' is missing"),
    (lambda m: m["model"].pop("fingerprint"), "field 'model.fingerprint' is missing"),
    (lambda m: m["config"].pop("mode"), "field 'config.mode' is missing"),
    (lambda m: m["config"].pop("group_size"), "field 'config.group_size' is missing"),
], ids=["no-model", "no-config", "no-fingerprint", "no-mode", "no-group-size"])
@pytest.mark.parametrize("command", ["inspect", "report"])
def test_a_run_json_without_a_field_its_readers_need_is_one_line(run_dir, tmp_path, capsys, change, needle, command):
    """Each of these ended in a KeyError traceback in inspect or report (a run.json sealed after the change, so the
    field check is what speaks)."""
    run = _copy(run_dir, tmp_path / "run")
    meta = json.loads((run / RUN_JSON).read_text())
    change(meta)
    (run / RUN_JSON).write_text(dumps_run_json(meta))
    case = json.loads((run / RESULTS).read_text().splitlines()[0])["case_id"]
    argv = (["inspect", str(run), "--case", case, "--out", str(tmp_path / "cards"), "--no-progress"]
            if command == "inspect" else ["report", str(run), "--out", str(tmp_path / "rep")])
    one_error(capsys, main(argv), str(run / RUN_JSON), needle)


@pytest.mark.parametrize("change,field", [
    (lambda m: m["config"]["methods"][0].update(name="memit"), "config"),
    (lambda m: m["config"]["methods"][0].update(overrides={"v_steps": 1}), "config"),
    (lambda m: m["model"].update(name="gemma3-270m"), "model"),
    (lambda m: m.update(status="complete", rows=999), "rows"),
], ids=["method", "hparam", "model", "rows"])
def test_an_edited_run_json_is_refused_naming_the_field(run_dir, tmp_path, capsys, change, field):
    """Edited by hand without its digest following: inspect would otherwise replay another edit than the one the
    rows record, and report show another run; resume refuses it too."""
    run = _copy(run_dir, tmp_path / "run")
    meta = json.loads((run / RUN_JSON).read_text())
    change(meta)
    (run / RUN_JSON).write_text(json.dumps(meta, indent=2))
    case = json.loads((run / RESULTS).read_text().splitlines()[0])["case_id"]
    rc = main(["inspect", str(run), "--case", case, "--out", str(tmp_path / "cards"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err, err[-2000:]
    assert f"run.json: run record: key '{field}' does not match the recorded content digest" in err
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) != 0
    assert f"key '{field}' does not match" in capsys.readouterr().err


def test_inspect_a_run_whose_run_json_is_not_utf8(run_dir, tmp_path, capsys):
    run = _copy(run_dir, tmp_path / "run")
    (run / RUN_JSON).write_bytes(b'{"config": "\xff"}')
    rc = main(["inspect", str(run), "--case", "0", "--out", str(tmp_path / "cards"), "--no-progress"])
    one_error(capsys, rc, str(run / RUN_JSON), "not valid JSON", "UnicodeDecodeError")


# -- report --reproduction on a damaged archive or page -------------------------------------------------------------
PAGE = "# Reproduction\n\nProse.\n\n<!-- editscope:measured live/* -->\n<!-- editscope:end -->\n"


def _archived_page(run_dir, tmp_path, capsys):
    """A page whose block was regenerated from a live run, which is then gone: the block reads its archive."""
    root = tmp_path / "root"
    _copy(run_dir, root / "live" / "r1")
    page = tmp_path / "docs" / "reproduction.md"
    page.parent.mkdir()
    page.write_text(PAGE)
    args = ["report", "--reproduction", str(page), "--runs-root", str(root)]
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    shutil.rmtree(root / "live" / "r1")
    archive = next(page.parent.glob(f"reproduction/*/runs/r1/{ARCHIVE}"))
    return args, archive


def test_report_reproduction_with_a_truncated_archive(run_dir, tmp_path, capsys):
    args, archive = _archived_page(run_dir, tmp_path, capsys)
    assert main(args) == 0  # whole: regenerated from the archive
    capsys.readouterr()
    data = archive.read_bytes()
    archive.write_bytes(data[:len(data) // 2])
    one_error(capsys, main(args), str(archive.parent), f"file '{ARCHIVE}' does not match the recorded content digest")
    # an earlier editscope's archive (no digest), cut in half, accepted unverified: gzip says it is cut short
    (archive.parent / FOLDER_MANIFEST).unlink()
    one_error(capsys, main(args), str(archive.parent), "no content digest", "--trust-unverified")
    one_error(capsys, main([*args, "--trust-unverified"]), str(archive), "not a readable gzip archive of rows",
              "EOFError")


def test_report_reproduction_with_an_archive_whose_rows_are_not_utf8(run_dir, tmp_path, capsys):
    args, archive = _archived_page(run_dir, tmp_path, capsys)
    (archive.parent / FOLDER_MANIFEST).unlink()
    rows = gzip.decompress(archive.read_bytes())
    archive.write_bytes(gzip.compress(b'{"bad": "\xff\xfe"}\n' + rows, mtime=0))
    one_error(capsys, main([*args, "--trust-unverified"]), f"{archive}:line 1", "not valid JSON")


def test_report_reproduction_on_a_page_that_is_not_utf8(run_dir, tmp_path, capsys):
    root = tmp_path / "root"
    _copy(run_dir, root / "live" / "r1")
    page = tmp_path / "reproduction.md"
    page.write_bytes(PAGE.replace("Prose.", "Pros\xe9.").encode("latin-1"))  # é as one latin-1 byte
    rc = main(["report", "--reproduction", str(page), "--runs-root", str(root)])
    one_error(capsys, rc, str(page), "line 3", "not valid UTF-8", "byte 0xe9")
    assert page.read_bytes() == PAGE.replace("Prose.", "Pros\xe9.").encode("latin-1")  # left as it was


def test_report_on_a_results_line_that_is_not_utf8(run_dir, tmp_path, capsys):
    run = _copy(run_dir, tmp_path / "run")
    lines = (run / RESULTS).read_bytes().splitlines(keepends=True)
    (run / RESULTS).write_bytes(b'{"case_id": "\xc3\x28"}\n' + b"".join(lines))  # an invalid 2-byte sequence
    one_error(capsys, main(["report", str(run), "--out", str(tmp_path / "rep")]), f"{run / RESULTS}:line 1",
              "not valid JSON")


# -- a models list whose report lacks one of its models -------------------------------------------------------------
@pytest.fixture(scope="module")
def models_run(tmp_path_factory):
    """A probe-only run of a two-model list (one case each): OUT/tiny-llama/ and OUT/tiny-gpt2/."""
    tmp = tmp_path_factory.mktemp("models")
    cfg = tmp / "m.yaml"
    cfg.write_text("models: [tiny-llama, tiny-gpt2]\nmethods: [none]\ndataset: counterfact\nslice: {limit: 1}\n"
                   f"suites: [counterfact]\noutput: {tmp / 'out'}\n")
    assert main(["run", str(cfg), "--no-progress"]) == 0
    return tmp / "out"


@pytest.mark.parametrize("damage,needle", [
    (lambda sub: shutil.rmtree(sub), "no run folder"),
    (lambda sub: (sub / RESULTS).write_text(""), "has no rows yet"),
], ids=["folder-gone", "no-rows"])
def test_report_of_a_models_list_names_the_model_it_lacks(models_run, tmp_path, capsys, damage, needle):
    out = _copy(models_run, tmp_path / "out")
    damage(out / "tiny-gpt2")
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("report: model 'tiny-gpt2' of ") and needle in err[0] and str(out / "tiny-gpt2") in err[0]
    md = (out / "report.md").read_text()
    assert "counterfact on counterfact" in md and "tiny-llama" in md  # the other model is reported
    assert "Not in this report: model 'tiny-gpt2'" in md
    assert "Not in this report: model &#39;tiny-gpt2&#39;" in (out / "report.html").read_text()  # the page says it too
    shutil.rmtree(out / "tiny-llama")  # no model left with rows: one error line naming both
    one_error(capsys, main(["report", str(out)]), str(out), "none of whose models has rows", "'tiny-llama'",
              "'tiny-gpt2'")
