"""``editscope rejudge``: a run's kept wild answers judged again. The new run's wild metrics equal the new judges
applied by hand to the answers the source rows kept; every other number is copied; the report reads it; its
run.json says where it came from; bad requests are one line."""

from __future__ import annotations

import gzip
import json

import pytest

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.metrics.answers import first_object, same_object
from editscope.run import Runner, parse_config, read_results
from editscope.run.rejudge import rejudge_run
from editscope.run.store import read_json


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_bundles):
    out = tmp_path_factory.mktemp("wild-run")
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "output": str(out), "methods": [{"name": "rome",
                                                                          "overrides": {"v_steps": 3}}],
        "dataset": "counterfact", "slice": {"offset": 0, "limit": 3},
        "suites": ["counterfact", {"name": "wild", "options": {"max_new_tokens": 6}}]})
    Runner(config, out_dir=out, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    return out


def _by_hand(prompts: list[dict], role: str) -> float | None:
    values = [first_object(p["answer"], p["gold"]) for p in prompts if p["role"] == role]
    return sum(values) / len(values) if values else None


def test_rejudged_rows_are_the_new_judges_on_the_kept_answers(source, tmp_path):
    out = rejudge_run(source, tmp_path / "rejudged", judge="first_object", locality_judge="same_object")

    old, new = read_results(source / "results.jsonl"), read_results(out / "results.jsonl")
    assert [r["case_id"] for r in old] == [r["case_id"] for r in new]
    for a, b in zip(old, new, strict=True):
        assert b["metrics"]["counterfact"] == a["metrics"]["counterfact"]  # teacher-forced numbers copied
        assert b["pre"] == a["pre"] and b["post"] == a["post"] and b["edit_info"] == a["edit_info"]
        for when in ("pre", "post"):
            prompts = a[when]["wild"]["prompts"]
            assert b["metrics"]["wild"][f"Efficacy_{when}"] == _by_hand(prompts, "rewrite")
            assert b["metrics"]["wild"][f"Generalization_{when}"] == pytest.approx(_by_hand(prompts, "paraphrase"))
            assert b["metrics"]["wild"][f"LocalityTrue_{when}"] == pytest.approx(_by_hand(prompts, "neighborhood"))
        pairs = [(p, q) for p, q in zip(a["pre"]["wild"]["prompts"], a["post"]["wild"]["prompts"], strict=True)
                 if p["role"] == "neighborhood"]
        want = sum(same_object(p["answer"], q["answer"], p["gold"]) for p, q in pairs) / len(pairs)
        assert b["metrics"]["wild"]["Locality"] == pytest.approx(want)
        assert b["metrics"]["wild"]["EfficacyF1_post"] == a["metrics"]["wild"]["EfficacyF1_post"]
        note = b["protocol"]["wild"]["note"]
        assert "judged by first_object" in note and "answers unchanged (same_object)" in note
    meta, src = read_json(out / "run.json"), read_json(source / "run.json")
    assert meta["rejudged_from"] == {"run": str(source), "config_digest": src["config_digest"],
                                     "judges": {"counterfact": {"max_new_tokens": 6}}, "rows": 3}
    assert meta["config_digest"] != src["config_digest"]
    assert meta["config"]["blocks"][0]["suites"][1]["options"] == {
        "max_new_tokens": 6, "judge": "first_object", "locality_judge": "same_object"}
    from editscope.report import build_report

    _, md = build_report([out], tmp_path / "report")
    assert "judged by first_object" in md.read_text() and "Wild minus teacher-forced" in md.read_text()


def test_the_same_judge_gives_the_same_rows(source, tmp_path):
    out = rejudge_run(source, tmp_path / "same", judge="first_object", locality_judge="same_start")  # the defaults
    old, new = read_results(source / "results.jsonl"), read_results(out / "results.jsonl")
    assert [r["metrics"] for r in old] == [r["metrics"] for r in new]


def test_bad_requests_are_one_line(source, tmp_path, capsys):
    with pytest.raises(EditscopeError, match="name a --judge or a --locality-judge"):
        rejudge_run(source, tmp_path / "x")
    with pytest.raises(EditscopeError, match="unknown answer judge 'llm'"):
        rejudge_run(source, tmp_path / "x", judge="llm")
    with pytest.raises(EditscopeError, match="unknown neighbourhood judge 'whole'"):
        rejudge_run(source, tmp_path / "x", locality_judge="whole")
    with pytest.raises(EditscopeError, match="another folder than its source"):
        rejudge_run(source, source, judge="contains")
    rejudge_run(source, tmp_path / "done", judge="contains")
    with pytest.raises(EditscopeError, match="already holds a run"):
        rejudge_run(source, tmp_path / "done", judge="contains")
    # an archive keeps no answers
    archive = tmp_path / "archived"
    archive.mkdir()
    (archive / "run.json").write_text((source / "run.json").read_text())
    (archive / "results.slim.jsonl.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(EditscopeError, match="an archive keeps no answers"):
        rejudge_run(archive, tmp_path / "y", judge="contains")
    # the command: one line on stderr, exit code 1
    assert main(["rejudge", str(source), "-o", str(tmp_path / "z"), "--judge", "llm"]) != 0
    assert "unknown answer judge 'llm'" in capsys.readouterr().err
    assert main(["rejudge", str(source), "-o", str(tmp_path / "z"), "--judge", "first_object"]) == 0
    assert json.loads((tmp_path / "z" / "run.json").read_text())["rejudged_from"]["rows"] == 3


def test_a_run_without_a_wild_suite_is_refused(tmp_path, tiny_bundles):
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "output": str(tmp_path / "tf"), "methods": [{"name": "rome",
                                                                                    "overrides": {"v_steps": 2}}],
        "dataset": "counterfact", "slice": {"offset": 0, "limit": 1}, "suites": ["counterfact"]})
    Runner(config, out_dir=tmp_path / "tf", bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    with pytest.raises(EditscopeError, match="the run has no wild suite"):
        rejudge_run(tmp_path / "tf", tmp_path / "x", judge="contains")


def test_a_resume_never_mixes_two_judges(source, tmp_path, tiny_bundles):
    """Rows judged by other judges than the config's now give (a default that changed between versions) stop a
    resume with one line; rows written before the judges were recorded are read from their note."""
    import shutil

    from editscope.run.store import dumps_row

    run = tmp_path / "run"
    shutil.copytree(source, run)
    rows = read_results(run / "results.jsonl")
    for row in rows:
        row["protocol"]["wild"]["judge"] = "contains"
        del row["protocol"]["wild"]["judge_version"]  # first_object's; contains has none
    (run / "results.jsonl").write_text("".join(dumps_row(r) + "\n" for r in rows[:-1]))
    from editscope.run.config import RunConfig

    config = RunConfig.from_run_json(read_json(run / "run.json")["config"], run / "run.json")
    runner = Runner(config, out_dir=run, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None)
    with pytest.raises(EditscopeError, match=r"block 'counterfact', suite 'wild': the stored rows were judged by "
                                             r"contains / same_start \(answers / neighbours\), this run would judge by "
                                             r"first_object v2 / same_start \(the defaults changed\)"):
        runner.run()
    assert len(read_results(run / "results.jsonl")) == 2  # nothing written, nothing lost
    for row in rows:  # an old row: no judge keys, the judge named in its note
        del row["protocol"]["wild"]["judge"], row["protocol"]["wild"]["locality_judge"]
        row["protocol"]["wild"]["note"] = "context plain, judged whole by token_f1 against target_new"
    (run / "results.jsonl").write_text("".join(dumps_row(r) + "\n" for r in rows[:-1]))
    with pytest.raises(EditscopeError, match="judged by token_f1 / unchanged"):
        Runner(config, out_dir=run, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()


def test_a_lifelong_chain_is_rejudged_checkpoint_by_checkpoint(tmp_path, tiny_bundles):
    """A chain's checkpoint rows (the curves) are rejudged like its final rows, from the answers each kept."""
    from tests.suites.test_wild import lifelong_rows

    rows = lifelong_rows(tmp_path / "chain", tiny_bundles["llama"], batch=2, rounds=2,
                         wild={"max_new_tokens": 4, "judge": "exact_match", "locality_judge": "unchanged"})
    assert any(r.get("checkpoint") for r in rows)
    out = rejudge_run(tmp_path / "chain", tmp_path / "obj", judge="first_object", locality_judge="same_object")
    new = read_results(out / "results.jsonl")
    assert [(r["case_id"], r.get("checkpoint"), r.get("round")) for r in new] == \
        [(r["case_id"], r.get("checkpoint"), r.get("round")) for r in rows]
    for a, b in zip(rows, new, strict=True):
        assert b["metrics"]["wild"]["Efficacy_post"] == _by_hand(a["post"]["wild"]["prompts"], "rewrite")
        assert b["metrics"]["counterfact"] == a["metrics"]["counterfact"]


def test_a_rejudged_row_under_the_chat_template_keeps_its_wrapping():
    from editscope.lm.engine import CHAT_NOTE
    from editscope.run.rejudge import _protocol

    new = {"name": "wild", "judge": "first_object", "locality_judge": "same_start", "note": "judged by first_object"}
    assert _protocol(new, {"name": "wild", "note": "judged whole by exact_match"}) == new
    old = {"name": "wild", "chat_template": "abc123", "note": f"judged whole by exact_match; {CHAT_NOTE}"}
    assert _protocol(new, old) == {**new, "chat_template": "abc123", "note": f"judged by first_object; {CHAT_NOTE}"}
