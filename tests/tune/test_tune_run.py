"""``editscope tune`` end to end on tiny-llama: candidates as ordinary run directories, a killed search resumes
without evaluating any candidate again (rows counted), a spent budget stops it with a choice on the last finished
rung, and the tuned YAML loads like a shipped file (``load_yaml``, ``editscope edit --hparams``, a run config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editscope.edit.hparams import load_yaml, read_provenance
from editscope.edit.rome import RomeHParams
from editscope.run.store import read_results
from editscope.tune import Tuner, TuneSettings


class Kill(Exception):
    pass


def settings(out: Path, budget: float = 30.0) -> TuneSettings:
    # 2 layers x 2 v_lr = 4 candidates; rungs of 2 and 4 cases, half kept: 4 x 2 + 2 x 2 = 12 rows in all
    return TuneSettings(model="tiny-llama", method="rome", out=str(out), budget_minutes=budget,
                        overrides={"v_steps": 2}, knobs=["layers", "v_lr"], grid={"layers": ([1], [2])},
                        first=2, eta=2, max_cases=4)


def rows_per_candidate(out: Path) -> dict[str, list[str]]:
    return {d.name: (d / "results.jsonl").read_text().splitlines() for d in sorted((out / "candidates").iterdir())
            if (d / "results.jsonl").is_file()}


def test_kill_resume_budget_and_the_tuned_yaml(tmp_path, tiny_llama):
    out = tmp_path / "tune"
    seen: list[str] = []

    def killing_log(msg: str) -> None:
        seen.append(msg)
        if msg.startswith("[rung 2/2"):  # the first candidate of rung 2 has its rows: kill the search here
            raise Kill

    with pytest.raises(Kill):
        Tuner(settings(out), bundle=tiny_llama, progress=False, log=killing_log).run()
    first = rows_per_candidate(out)
    assert len(first) == 4 and sum(map(len, first.values())) == 4 * 2 + 2  # rung 1, and one candidate at 4 cases

    # a spent budget (the first session's wall time counts) stops before the next evaluation that needs rows;
    # the choice is made on rung 1, which is complete
    stopped = Tuner(settings(out, budget=1e-6), bundle=tiny_llama, progress=False, log=lambda m: None).run()
    assert stopped.evaluated == 0 and not stopped.halving.complete
    assert [n for n, _ in stopped.halving.rungs] == [2] and stopped.chosen is not None
    assert rows_per_candidate(out) == first

    result = Tuner(settings(out), bundle=tiny_llama, progress=False, log=lambda m: None).run()
    assert result.evaluated == 1  # only the rung-2 candidate the kill left out
    after = rows_per_candidate(out)
    assert sum(map(len, after.values())) == 12
    for cid, lines in first.items():  # no row computed before was computed (or written) again
        assert after[cid][:len(lines)] == lines
    for cid in after:
        rows = read_results(out / "candidates" / cid / "results.jsonl")
        assert len({r["case_id"] for r in rows}) == len(rows)
        assert all(r["method"] == cid for r in rows)  # an ordinary run directory, one method labelled by its id
        assert (out / "candidates" / cid / "run.json").is_file()

    # the choice: the highest lower CI bound among local candidates of the last rung
    last = result.halving.rungs[-1][1]
    assert len(last) == 2 and result.chosen is not None and result.chosen.id in last
    local = {c: s for c, s in last.items() if s.local}
    assert last[result.chosen.id].score_lo == max(s.score_lo for s in local.values())

    # the YAML loads like a shipped file, values = base + chosen, provenance = every candidate with its scores
    hp = load_yaml(result.yaml_path, RomeHParams, n_layers=tiny_llama.n_layers)
    chosen = result.chosen.to_dict()["hparams"]
    assert hp.layers == chosen["layers"] and hp.v_lr == chosen["v_lr"] and hp.v_steps == 2
    prov = read_provenance(result.yaml_path)
    assert {c["id"] for c in prov["candidates"]} == set(first)
    assert all(len(c["scores"]) in (1, 2) and "score_lo" in c["scores"][0] for c in prov["candidates"])
    assert prov["model"]["fingerprint"] == tiny_llama.fingerprint
    assert prov["validation"]["dataset"] == "counterfact" and prov["validation"]["limit"] == 4
    assert prov["validation"]["offset"] >= 1000  # past every shipped config's slice of CounterFact
    assert prov["objective"]["guard"] == "NS" and prov["search"]["complete"] is True
    assert prov["wall_seconds"] > 0
    assert (out / "report.md").read_text().count(result.chosen.id) >= 2 and (out / "search.png").is_file()

    # editscope edit --hparams tuned.yaml, and a run config naming it
    from editscope.cli import main

    assert main(["edit", "--model", "tiny-llama", "--method", "rome", "--hparams", str(result.yaml_path),
                 "--prompt", "{} is located in", "--subject", "Paris", "--target", "Rome", "--json"]) == 0
    from editscope.edit.registry import get_editor
    from editscope.run.config import parse_config

    cfg = parse_config({"model": "tiny-llama", "methods": [{"name": "rome", "hparams": str(result.yaml_path)}],
                        "dataset": "counterfact", "slice": {"limit": 1}, "suites": ["counterfact"]})
    loaded = get_editor("rome").load_hparams(tiny_llama, cfg.methods[0].hparams)
    assert loaded == hp


def test_resume_refuses_other_settings(tmp_path, tiny_llama):
    out = tmp_path / "t"
    out.mkdir()
    from editscope.errors import EditscopeError
    from editscope.integrity import dumps_sealed

    old = {"digest": "other", "model_fingerprint": tiny_llama.fingerprint}
    (out / "tune.json").write_text(json.dumps(old))  # an earlier editscope's: no content digest
    with pytest.raises(EditscopeError, match="tune.json: tune settings has no content digest.*--trust-unverified"):
        Tuner(settings(out), bundle=tiny_llama, progress=False, log=lambda m: None).run()
    with pytest.raises(EditscopeError, match="holds a tune of other settings"):
        Tuner(settings(out), bundle=tiny_llama, progress=False, log=lambda m: None, trust_unverified=True).run()
    (out / "tune.json").write_text(dumps_sealed(old))
    with pytest.raises(EditscopeError, match="holds a tune of other settings"):
        Tuner(settings(out), bundle=tiny_llama, progress=False, log=lambda m: None).run()
    (out / "tune.json").write_text(dumps_sealed(old).replace('"other"', '"othe2"'))
    with pytest.raises(EditscopeError, match="tune.json: tune settings: key 'digest' does not match the recorded"):
        Tuner(settings(out), bundle=tiny_llama, progress=False, log=lambda m: None).run()


def test_provenance_block_is_set_aside_and_checked(tmp_path):
    from editscope.errors import EditscopeError

    path = tmp_path / "hp.yaml"
    path.write_text("layers: [1]\nv_lr: 0.2\nprovenance: {tool: editscope tune, candidates: []}\n")
    hp = load_yaml(path, RomeHParams)
    assert hp.v_lr == 0.2 and read_provenance(path) == {"tool": "editscope tune", "candidates": []}
    path.write_text("layers: [1]\nprovenance: 3\n")
    with pytest.raises(EditscopeError, match=r"hp.yaml: key 'provenance': expected a mapping"):
        load_yaml(path, RomeHParams)


def test_cli_bad_knob_is_one_line_error(tmp_path, capsys):
    from editscope.cli import main

    assert main(["tune", "--model", "tiny-llama", "--method", "rome", "--budget", "1", "--knobs", "v_lr,nope",
                 "-o", str(tmp_path / "t"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("editscope: error: --knobs/--grid: 'nope' is not a declared knob (declared: layers, "
                              "v_lr,")
    assert not (tmp_path / "t" / "candidates").exists()


def test_cli_method_without_knobs_is_one_line_error(tmp_path, capsys, monkeypatch):
    from editscope.cli import main
    from editscope.edit.mend import MendHParams

    monkeypatch.setattr(MendHParams, "TUNABLE", {})  # every shipped editor declares knobs: take MEND's away
    assert main(["tune", "--model", "tiny-llama", "--method", "mend", "--budget", "1", "-o", str(tmp_path / "t"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("editscope: error: MEND: nothing to search (declared knobs: none; name editor knobs with "
                       "--knobs)")


def test_plugin_knobs_are_searched_and_recorded(tmp_path, tiny_llama):
    out = tmp_path / "p"
    # layer 1 with v_lr 0.5 keeps NS on these two cases (seen in a search), so a choice is made
    s = TuneSettings(model="tiny-llama", method="rome", out=str(out), budget_minutes=30,
                     overrides={"layers": [1], "v_lr": 0.5},
                     plugins=[("evk_align", {"n": 1})], grid={"evk_align.lam": (0.03, 0.3)}, knobs=["evk_align.lam"],
                     first=2, eta=2, max_cases=2)
    result = Tuner(s, bundle=tiny_llama, progress=False, log=lambda m: None).run()
    assert [n for n, _ in result.halving.rungs] == [2] and len(result.halving.rungs[0][1]) == 2
    lams = set()
    for cid in result.halving.rungs[0][1]:
        rows = read_results(out / "candidates" / cid / "results.jsonl")
        assert len(rows) == 2 and all(r["hparams"]["layers"] == [1] and r["hparams"]["v_lr"] == 0.5 for r in rows)
        (plugin,) = {json.dumps(r["plugins"], sort_keys=True) for r in rows}  # every row records its plug-in
        lams.add(json.loads(plugin)[0]["lam"])
    assert lams == {0.03, 0.3}
    prov = read_provenance(result.yaml_path)
    (chosen_plugin,) = prov["plugins"]
    assert chosen_plugin["name"] == "evk_align" and chosen_plugin["n"] == 1
    assert chosen_plugin["lam"] == result.chosen.to_dict()["plugins"]["evk_align"]["lam"]
    assert prov["search"]["grids"] == {"evk_align.lam": [0.03, 0.3]}
    assert prov["layers"] is None  # the editor's knobs (layers) are not searched with a plug-in attached


def test_peak_tune_of_rome_app_with_the_editor_alone_as_reference(tmp_path, tiny_llama):
    """ROME+APP on PEAK-CF: a reference run of ROME alone, the objective and reference in the provenance, and the
    choice equal to one recomputed by hand from the row files (t interval of the reference's ES, a naive bootstrap
    of hmean(ES, 1-AFF_hard, 1-ANF_hard))."""
    import math

    import numpy as np
    from scipy import stats

    out = tmp_path / "peak"
    s = TuneSettings(model="tiny-llama", method="rome", out=str(out), budget_minutes=30,
                     overrides={"layers": [1], "v_lr": 1.0, "v_steps": 10}, plugins=[("app", {})],
                     knobs=["app.alpha"], grid={"app.alpha": (0.02, 5.0)}, dataset="peak-cf", first=6, eta=2,
                     max_cases=6)
    result = Tuner(s, bundle=tiny_llama, progress=False, log=lambda m: None).run()
    ((n, scores),) = result.halving.rungs
    assert n == 6 and len(scores) == 2 and result.evaluated == 2

    def rows(path: Path) -> list[dict]:
        return sorted(read_results(path / "results.jsonl"), key=lambda r: r["index"])

    ref_rows = rows(out / "reference")
    assert len(ref_rows) == 6 and all(r["plugins"] in ([], None) and r["method"] == "reference" for r in ref_rows)
    assert (out / "reference" / "run.json").is_file()
    cases = [r["case_id"] for r in ref_rows]

    def col(rs: list[dict], key: str) -> list[float]:
        return [r["metrics"]["peak"].get(key, math.nan) for r in rs]

    ref_es = [x for x in col(ref_rows, "ES_post") if math.isfinite(x)]
    ref_mean = sum(ref_es) / len(ref_es)
    sd = float(np.std(ref_es, ddof=1)) if len(ref_es) > 1 else math.nan
    half = stats.t.ppf(0.975, len(ref_es) - 1) * sd / math.sqrt(len(ref_es)) if len(ref_es) > 1 else math.nan
    floor = ref_mean - (half if math.isfinite(half) else 0.0)
    if sd == 0:  # no spread: the low end of the Wilson score interval of the share (Wilson 1927), written out
        z, n_ref = stats.norm.ppf(0.975), len(ref_es)
        floor = (ref_mean + z * z / (2 * n_ref) - z * math.sqrt(ref_mean * (1 - ref_mean) / n_ref
                                                               + z * z / (4 * n_ref ** 2))) / (1 + z * z / n_ref)

    def hmean(es: list[float], aff: list[float], anf: list[float], sample) -> float:
        means = []
        for c, comp in ((es, False), (aff, True), (anf, True)):
            v = [(1 - c[i]) if comp else c[i] for i in sample if math.isfinite(c[i])]
            means.append(sum(v) / len(v) if v else math.nan)
        if not all(math.isfinite(m) for m in means):
            return math.nan
        return 0.0 if min(means) == 0 else 3 / sum(1 / m for m in means)

    def lower_bound_and_mean(es: list[float], aff: list[float], anf: list[float]) -> tuple[float, float]:
        idx = np.random.default_rng(0).integers(0, len(es), size=(1000, len(es)))  # the declared seed and count
        boot = [x for x in (hmean(es, aff, anf, sample) for sample in idx) if math.isfinite(x)]
        return float(np.percentile(boot, 2.5)) if boot else -math.inf, hmean(es, aff, anf, range(len(es)))

    hand: dict[str, tuple[float, float]] = {}
    alphas = set()
    for cid in scores:
        cr = rows(out / "candidates" / cid)
        assert [r["case_id"] for r in cr] == cases  # the same validation cases as the reference
        alphas.add(cr[0]["plugins"][0]["alpha"])
        es = col(cr, "ES_post")
        es_mean = sum(x for x in es if math.isfinite(x)) / sum(math.isfinite(x) for x in es)
        assert scores[cid].guard_floor == pytest.approx(floor) and scores[cid].guard == pytest.approx(es_mean)
        if es_mean >= floor - 1e-12:
            hand[cid] = lower_bound_and_mean(es, col(cr, "AFF_hard"), col(cr, "ANF_hard"))
    assert alphas == {0.02, 5.0}
    expected = max(hand, key=lambda c: hand[c]) if hand else None  # ties: the first candidate, as the tuner
    assert result.chosen is not None and result.chosen.id == expected
    assert result.reference[6].guard == pytest.approx(ref_mean)

    prov = read_provenance(result.yaml_path)
    assert prov["objective"]["guard"] == "ES" and prov["objective"]["guard_reference"] == "editor_alone"
    assert prov["objective"]["components"] == ["ES", "1−AFF_hard", "1−ANF_hard"]
    assert "editor alone" in prov["objective"]["text"]
    assert prov["reference"]["run"] == "reference/" and prov["reference"]["plugins"] == []
    (ref_score,) = prov["reference"]["scores"]
    assert ref_score["cases"] == 6 and ref_score["metrics"]["ES"]["mean"] == pytest.approx(ref_mean)
    assert prov["validation"]["dataset"] == "peak-cf" and prov["validation"]["offset"] >= 200
    for c in prov["candidates"]:
        m = c["scores"][0]["metrics"]
        assert set(m) == {"ES", "AFF_hard", "ANF_hard"} and {"mean", "lo", "hi"} <= set(m["AFF_hard"])
    assert prov["chosen"]["plugins"]["app"]["alpha"] == result.chosen.to_dict()["plugins"]["app"]["alpha"]
    page = (out / "report.md").read_text()
    assert "| reference | rome alone |" in page and "AFF_hard [95% CI]" in page and "ES editor alone" in page

    again = Tuner(s, bundle=tiny_llama, progress=False, log=lambda m: None).run()  # rows reused, nothing recomputed
    assert again.evaluated == 0 and len(rows(out / "reference")) == 6
