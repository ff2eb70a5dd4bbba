"""Every results row carries a digest of its content: a flipped digit inside a stored number is found by resume
(recomputed, with one warning line), merge (left out, the merge incomplete) and report (one line naming the row);
rows of runs written before digests existed are read as before."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from editscope.errors import EditscopeError
from editscope.paths import data_file
from editscope.rowdigest import FORMAT, KEY, RUN_FLAG, digest
from editscope.run import Runner, merge_runs, parse_config, read_results
from editscope.run.runner import timing_free
from editscope.run.store import dumps_row, dumps_run_json, read_sound_results


def test_digest_is_sha256_of_the_sorted_compact_json_without_the_key():
    row = {"b": 1, "a": [1.5, "é"], KEY: "ignored"}
    text = '{"a":[1.5,"\\u00e9"],"b":1}'  # written by hand: keys sorted, no spaces, ASCII escapes
    assert digest(row) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    line = json.loads(dumps_row({"b": 1, "a": [1.5, "é"]}))
    assert line[KEY] == digest(row) and list(line)[-1] == KEY


def _config(tmp: Path, out: Path):
    records = json.loads(data_file("counterfact/counterfact-edit-1k.json").read_text())[:2]
    (tmp / "data.json").write_text(json.dumps(records))
    return parse_config({"model": "tiny-llama", "output": str(out), "methods": ["none"],
                         "dataset": str(tmp / "data.json"), "suites": ["counterfact"]})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_llama):
    tmp = tmp_path_factory.mktemp("digest")
    out = tmp / "ref"
    Runner(_config(tmp, out), bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    return tmp, out


def _flip_digit(path: Path, line: int) -> None:
    """Change one digit of a number inside the metrics of row ``line`` (1-based): still valid JSON of every type."""
    lines = path.read_text().splitlines(keepends=True)
    text = lines[line - 1]
    m = re.compile(r"\d").search(text, text.index('"metrics"'))
    assert m is not None
    lines[line - 1] = text[:m.start()] + str((int(m.group()) + 1) % 10) + text[m.end():]
    path.write_text("".join(lines))


def _rows(out: Path) -> list[dict]:
    return [timing_free(r) for r in read_results(out / "results.jsonl")]


def test_rows_carry_digests_and_readers_strip_them(reference):
    _tmp, out = reference
    assert json.loads((out / "run.json").read_text())[RUN_FLAG] == FORMAT
    raw = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(raw) == 2 and all(r[KEY] == digest(r) for r in raw)
    assert read_results(out / "results.jsonl") == [{k: v for k, v in r.items() if k != KEY} for r in raw]


def test_flipped_digit_is_refused_naming_the_line_and_recomputed_on_resume(reference, tmp_path, tiny_llama):
    tmp, ref = reference
    work = tmp_path / "work"
    shutil.copytree(ref, work)
    _flip_digit(work / "results.jsonl", 2)
    with pytest.raises(EditscopeError, match=r"results\.jsonl:line 2: the row does not match its digest") as info:
        read_results(work / "results.jsonl")
    assert "\n" not in str(info.value)
    logged: list[str] = []
    result = Runner(_config(tmp, work), out_dir=work, bundle=tiny_llama, progress=False, log=logged.append).run()
    warnings = [m for m in logged if m.startswith("warning:")]
    assert warnings == [f"warning: {work / 'results.jsonl'}:line 2: the row does not match its digest (altered or "
                        "corrupted); computing it again"]
    assert result.written == 1 and _rows(work) == _rows(ref)


def test_row_without_digest_is_damaged_only_in_a_run_that_writes_them(reference, tmp_path):
    _tmp, ref = reference
    work = tmp_path / "work"
    shutil.copytree(ref, work)
    rows = [json.loads(line) for line in (work / "results.jsonl").read_text().splitlines()]
    rows[0].pop(KEY)
    (work / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sound, damaged = read_sound_results(work / "results.jsonl")
    assert len(sound) == 1 and damaged == [f"{work / 'results.jsonl'}:line 1: the row has no digest (its run writes "
                                           "one with every row)"]
    # a run written before rows carried digests: no flag in run.json, rows without digests are read as before
    meta = json.loads((work / "run.json").read_text())
    meta.pop(RUN_FLAG)
    (work / "run.json").write_text(dumps_run_json(meta))
    assert _rows(work) == _rows(ref)
    # ... but a digest a row does carry is still checked
    _flip_digit(work / "results.jsonl", 2)
    with pytest.raises(EditscopeError, match="line 2: the row does not match its digest"):
        read_results(work / "results.jsonl")


def test_resume_of_a_run_without_digests_keeps_it_so(reference, tmp_path, tiny_llama):
    tmp, ref = reference
    work = tmp_path / "old"
    shutil.copytree(ref, work)
    rows = [json.loads(line) for line in (work / "results.jsonl").read_text().splitlines()]
    (work / "results.jsonl").write_text(json.dumps({k: v for k, v in rows[0].items() if k != KEY}) + "\n")
    meta = json.loads((work / "run.json").read_text())
    meta.pop(RUN_FLAG)
    (work / "run.json").write_text(dumps_run_json(meta))
    result = Runner(_config(tmp, work), out_dir=work, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    assert result.written == 1 and _rows(work) == _rows(ref)
    assert RUN_FLAG not in json.loads((work / "run.json").read_text())


def test_merge_leaves_a_damaged_row_out_and_is_incomplete(reference, tmp_path, tiny_llama):
    tmp, ref = reference
    shards = []
    for i in range(2):
        out = tmp_path / f"shard{i}"
        Runner(_config(tmp, out), out_dir=out, bundle=tiny_llama, shard=(i, 2), progress=False,
               log=lambda _m: None).run()
        shards.append(out)
    i = next(i for i, s in enumerate(shards) if read_results(s / "results.jsonl"))
    _flip_digit(shards[i] / "results.jsonl", 1)
    logged: list[str] = []
    n, _ = merge_runs(tmp_path / "merged", shards, log=logged.append)
    meta = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert n == 1 and meta["status"] == "incomplete" and meta[RUN_FLAG] == FORMAT
    where = f"{shards[i] / 'results.jsonl'}:line 1: the row does not match its digest"
    assert any(p.startswith(where) for p in meta["problems"]) and any(m.startswith(where) for m in logged)
    # resume the shard (it recomputes the row), merge again: complete and equal to the unsharded run
    Runner(_config(tmp, shards[i]), out_dir=shards[i], bundle=tiny_llama, shard=(i, 2), progress=False,
           log=lambda _m: None).run()
    merge_runs(tmp_path / "merged", shards)
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["status"] == "complete"
    assert _rows(tmp_path / "merged") == _rows(ref)


def test_report_names_the_damaged_row_in_one_line(reference, tmp_path, capsys):
    from tests.reliability.test_cli_causes import one_line_error

    _tmp, ref = reference
    work = tmp_path / "work"
    shutil.copytree(ref, work)
    _flip_digit(work / "results.jsonl", 1)
    one_line_error(capsys, ["report", str(work)], 2, f"{work / 'results.jsonl'}:line 1",
                   "does not match its digest")


def test_count_rows_counts_a_damaged_row_as_missing(reference, tmp_path):
    from editscope.run.planned import count_rows, plan_run

    tmp, ref = reference
    work = tmp_path / "work"
    shutil.copytree(ref, work)
    _flip_digit(work / "results.jsonl", 1)
    count = count_rows(work, plan_run(_config(tmp, work)))
    assert not count.complete and count.planned == 2 and count.present == 1 and len(count.missing) == 1
    assert f"{work / 'results.jsonl'}:line 1: the row does not match its digest" in count.line(work)


def test_lm_eval_rows_carry_digests_and_a_damaged_one_is_evaluated_again(tmp_path):
    from editscope.jsonl import append_record
    from editscope.run.lmeval import LM_EVAL_FILE, LmEvalHook, LmEvalSpec

    spec = LmEvalSpec(tasks=("arc_tiny", "copa_tiny"), limit=8)
    rows = [{"dataset": None, "group": None, "method": "none", "round": 0, "edits_applied": 0, "task": task,
             "metrics": {"acc": acc, "acc_stderr": None}, "n_samples": 8, "limit": 8, "num_fewshot": None,
             "chat_template": False, "seconds": 0.5, "lm_eval_version": "0.4.9"}
            for task, acc in (("arc_tiny", 0.375), ("copa_tiny", 0.625))]
    writer = LmEvalHook(spec, tmp_path, every=1, log=lambda _m: None)
    for row in rows:
        append_record(tmp_path / LM_EVAL_FILE, row, writer._dumps)
    lines = (tmp_path / LM_EVAL_FILE).read_text().splitlines()
    assert all(json.loads(line)[KEY] == digest(json.loads(line)) for line in lines)
    done = {("none", 0, "arc_tiny"), ("none", 0, "copa_tiny")}
    assert {(k[2], k[3], k[4]) for k in LmEvalHook(spec, tmp_path, every=1, log=lambda _m: None)._done} == done
    (tmp_path / LM_EVAL_FILE).write_text(lines[0].replace("0.375", "0.875") + "\n" + lines[1] + "\n")
    logged: list[str] = []
    hook = LmEvalHook(spec, tmp_path, every=1, log=logged.append)
    assert {(k[2], k[3], k[4]) for k in hook._done} == {("none", 0, "copa_tiny")}
    assert logged == [f"warning: {tmp_path / LM_EVAL_FILE}:line 1: the row does not match its digest (altered or "
                      "corrupted); evaluating it again"]


def test_a_sound_row_of_another_run_is_refused_by_resume_and_report(tmp_path, tiny_bundles, capsys):
    """A row copied from a run of another config carries a valid digest of its own: it is still not this run's.
    Resume cuts it out and computes it again (one warning line); report refuses it naming the row."""
    from editscope.cli import main
    from editscope.run import Runner, parse_config, read_results
    from editscope.run.store import dumps_row

    def config(out, steps):
        return parse_config({"model": "tiny-llama", "seed": 0, "output": str(out),
                             "methods": [{"name": "rome", "overrides": {"v_steps": steps}}],
                             "dataset": "counterfact", "slice": {"offset": 0, "limit": 2}, "suites": ["counterfact"]})

    logs: list[str] = []
    for out, steps in ((tmp_path / "a", 2), (tmp_path / "b", 3)):
        Runner(config(out, steps), out_dir=out, bundle=tiny_bundles["llama"], progress=False, log=logs.append).run()
    own, other = read_results(tmp_path / "a" / "results.jsonl"), read_results(tmp_path / "b" / "results.jsonl")
    assert own[0]["config_digest"] != other[0]["config_digest"]
    assert own[0]["config_digest"] == json.loads((tmp_path / "a" / "run.json").read_text())["config_digest"]
    # a complete run with one row swapped for the other run's (valid digest, same key)
    (tmp_path / "a" / "results.jsonl").write_text(dumps_row(other[0]) + "\n" + dumps_row(own[1]) + "\n")
    assert main(["report", str(tmp_path / "a"), "--out", str(tmp_path / "rep")]) != 0
    err = capsys.readouterr().err
    assert "row counterfact/0/rome belongs to a run of another config" in err and "Traceback" not in err
    logs.clear()
    Runner(config(tmp_path / "a", 2), out_dir=tmp_path / "a", bundle=tiny_bundles["llama"], progress=False,
           log=logs.append).run()
    assert any("row counterfact/0/rome belongs to a run of another config" in line for line in logs)
    again = read_results(tmp_path / "a" / "results.jsonl")
    assert sorted(r["case_id"] for r in again) == ["0", "1"]
    assert {r["config_digest"] for r in again} == {own[0]["config_digest"]}
    assert next(r for r in again if r["case_id"] == "0")["metrics"] == own[0]["metrics"]
