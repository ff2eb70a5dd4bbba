"""``sequential_batches: {reprobe: N}``: a checkpoint probes the cases edited since the previous one and re-probes
the earlier ones, all up to N, beyond a fixed, nested random sample of N, the same for every method. The sampled rows
equal those of a run that re-probes everything, the retention matrix still attributes every case to its batch, a
rerun writes nothing, and the setting is in the digest only where it changes what is probed. A schedule that lists
its checkpoint rounds (a log scale) probes after those rounds only, the cases since the previous one and the earlier
ones, with the rows of the same chain checkpointed every round, and resumes after its last checkpoint."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as st

from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config, read_results
from editscope.run.lmeval import LmEvalSpec, due_points
from editscope.run.plan import Lifelong, mode_from_dict, reprobe_positions
from editscope.run.summary import retention, summarize_by_edits
from tests.run.helpers import close

BATCH, ROUNDS, LIMIT = 2, 5, 3


def test_reprobe_positions_by_hand():
    # up to the limit every earlier case is re-probed, and the new ones always
    assert reprobe_positions(6, 2, 4, 10, seed=1) == [0, 1, 2, 3, 4, 5]
    # beyond it, the limit earlier positions with the smallest keys of the group's key vector, then the new ones
    keys = np.random.default_rng(7).random(10)
    earlier = sorted(range(6), key=lambda p: keys[p])[:3]
    assert reprobe_positions(8, 2, 3, 10, seed=7) == sorted(earlier) + [6, 7]


def test_the_sample_is_nested_and_sized():
    previous: list[int] = []
    for n_edited in range(10, 2001, 10):
        positions = reprobe_positions(n_edited, 10, 100, 2000, seed=3)
        earlier = [p for p in positions if p < n_edited - 10]
        assert positions[-10:] == list(range(n_edited - 10, n_edited))  # the new cases, all of them
        assert len(earlier) == min(100, n_edited - 10) and len(set(positions)) == len(positions)
        # nested: a case probed now that existed at the previous checkpoint was probed there too, so one left out
        # once is never probed again
        assert set(earlier) <= set(previous) or n_edited == 10
        previous = positions


def _config(reprobe: int | None, methods=("memit", "alphaedit")) -> dict:
    mode = {"batch": BATCH, "rounds": ROUNDS, "checkpoints": 1} | ({"reprobe": reprobe} if reprobe else {})
    return {"model": "tiny-llama", "seed": 0, "mode": {"sequential_batches": mode},
            "methods": [{"name": m, "overrides": {"v_steps": 3}} for m in methods],
            "datasets": [{"dataset": "counterfact", "slice": {"limit": BATCH * ROUNDS}, "suites": ["counterfact"]}]}


@pytest.fixture(scope="module")
def runs(tiny_bundles, tmp_path_factory):
    out = {}
    for name, reprobe in (("all", None), ("sampled", LIMIT)):
        path = tmp_path_factory.mktemp(name)
        Runner(parse_config(_config(reprobe)), out_dir=path, bundle=tiny_bundles["llama"], progress=False,
               log=lambda _m: None).run()
        out[name] = (path, read_results(path / "results.jsonl"))
    return out


def test_checkpoints_probe_the_new_cases_and_a_sample_of_the_earlier(runs):
    rows = runs["sampled"][1]
    full = {(r["method"], r["case_id"], r["edits_applied"], r["checkpoint"]): r for r in runs["all"][1]}
    probed = {}
    for method in ("memit", "alphaedit"):
        for edits in range(BATCH, BATCH * ROUNDS, BATCH):
            probed[(method, edits)] = sorted(r["index"] for r in rows
                                             if r["method"] == method and r["edits_applied"] == edits)
        finals = [r for r in rows if r["method"] == method and not r["checkpoint"]]
        assert sorted(r["index"] for r in finals) == list(range(BATCH * ROUNDS))  # the final rows: every case
    for edits in range(BATCH, BATCH * ROUNDS, BATCH):
        got = probed[("memit", edits)]
        assert got == probed[("alphaedit", edits)]  # the same cases for every method: they pair
        earlier = edits - BATCH
        assert got[-BATCH:] == list(range(earlier, edits))  # the batch just written, all of it
        assert len(got) == min(edits, LIMIT + BATCH)
    # nested: an earlier case re-probed at 8 edits was re-probed at 6
    assert set(probed[("memit", 8)][:-BATCH]) <= set(probed[("memit", 6)])
    # every sampled row equals the row of the run that re-probes everything (same edits, same probes)
    for r in rows:
        twin = full[(r["method"], r["case_id"], r["edits_applied"], r["checkpoint"])]
        for name, value in r["metrics"]["counterfact"].items():
            assert value == pytest.approx(twin["metrics"]["counterfact"][name], rel=1e-6, abs=1e-6), name
    assert len(rows) < len(runs["all"][1])


def test_retention_attributes_every_sampled_case_to_its_batch(runs):
    rows = runs["sampled"][1]
    matrix = retention(rows, "counterfact", "ES_post")[("counterfact", "counterfact", "memit")]
    for (i, j), value in matrix.items():
        want = [r["metrics"]["counterfact"]["ES_post"] for r in rows if r["method"] == "memit"
                and r["edits_applied"] == j and r["index"] // BATCH == i // BATCH - 1]
        assert want and value == pytest.approx(sum(want) / len(want))
    assert {i for i, _ in matrix} == set(range(BATCH, BATCH * ROUNDS + 1, BATCH))


def test_a_sampled_curve_point_weighs_the_new_batch_and_the_sample_by_the_cases_they_stand_for(runs):
    """At 8 edits the checkpoint probed the 2 new cases and 3 of the 6 earlier ones: its curve point is
    (2·mean(new) + 6·mean(sample)) / 8 with the stratified t interval, not the plain mean of the 5 rows."""
    rows = runs["sampled"][1]
    points = summarize_by_edits(rows)[("counterfact", "counterfact")]
    for edits in (6, 8):
        got = next(r for r in points[edits] if r.method == "memit" and r.metric == "PS_post")
        probed = [r for r in rows if r["method"] == "memit" and r["edits_applied"] == edits]
        new = [r["metrics"]["counterfact"]["PS_post"] for r in probed if r["index"] >= edits - BATCH]
        old = [r["metrics"]["counterfact"]["PS_post"] for r in probed if r["index"] < edits - BATCH]
        w_new, w_old = BATCH / edits, (edits - BATCH) / edits
        assert len(old) == LIMIT < edits - BATCH
        assert got.ci == "t-strata" and got.n == len(new) + len(old)
        assert got.mean == pytest.approx(w_new * np.mean(new) + w_old * np.mean(old))
        se = math.sqrt(w_new ** 2 * np.var(new, ddof=1) / len(new) + w_old ** 2 * np.var(old, ddof=1) / len(old))
        half = st.t.ppf(0.975, len(new) + len(old) - 2) * se
        assert (got.ci95_low, got.ci95_high) == pytest.approx((got.mean - half, got.mean + half))  # no specs: unclipped
    # points that probed every earlier case (up to the limit, and the final rows) keep the plain t interval, as in
    # the run that re-probes everything
    for edits in (2, 4, BATCH * ROUNDS):
        assert {r.ci for r in points[edits] if r.metric == "PS_post"} == {"t"}
    full = summarize_by_edits(runs["all"][1])[("counterfact", "counterfact")]
    assert {r.ci for rs in full.values() for r in rs} <= {"t", "bootstrap"}


def test_a_rerun_of_a_sampled_run_writes_nothing(runs, tiny_bundles):
    path, rows = runs["sampled"]
    Runner(parse_config(_config(LIMIT)), out_dir=path, bundle=tiny_bundles["llama"], progress=False,
           log=lambda _m: None).run()
    assert len(read_results(path / "results.jsonl")) == len(rows)


def test_reprobe_is_in_the_digest_only_where_it_samples():
    assert parse_config(_config(LIMIT)).digest() != parse_config(_config(None)).digest()
    assert parse_config(_config(BATCH * (ROUNDS - 1))).digest() == parse_config(_config(None)).digest()
    with pytest.raises(EditscopeError, match="mode.sequential_batches.reprobe"):
        parse_config(_config(None) | {"mode": {"sequential_batches": {"batch": 2, "rounds": 2, "reprobe": 0}}})


# ``sampled: true``: every probe (checkpoints, final, pre) takes the batch just written and the sample only


def _sampled_config() -> dict:
    config = _config(LIMIT)
    config["mode"]["sequential_batches"] |= {"checkpoints": 2, "sampled": True}
    return config


@pytest.fixture(scope="module")
def sampled_run(tiny_bundles, tmp_path_factory):
    path = tmp_path_factory.mktemp("stream")
    Runner(parse_config(_sampled_config()), out_dir=path, bundle=tiny_bundles["llama"], progress=False,
           log=lambda _m: None).run()
    return path, read_results(path / "results.jsonl")


def _positions_by_hand(n_edited: int, keys: np.ndarray) -> list[int]:
    """The batch just written, and LIMIT of the earlier cases chosen by the group's fixed keys (all of them while
    they are no more than LIMIT)."""
    earlier = n_edited - BATCH
    if earlier <= LIMIT:
        return list(range(n_edited))
    return sorted(sorted(range(earlier), key=lambda p: keys[p])[:LIMIT]) + list(range(earlier, n_edited))


def _probed(rows: list[dict], method: str) -> dict[tuple[int, bool], list[int]]:
    """The case indices a method's rows probed, by (edits applied, checkpoint row)."""
    got: dict[tuple[int, bool], list[int]] = {}
    for r in rows:
        if r["method"] == method:
            got.setdefault((r["edits_applied"], r["checkpoint"]), []).append(r["index"])
    return got


def _assert_twins(rows: list[dict], reference: list[dict]) -> None:
    """Each row equals the row of the reference run (the same chain, probing every case at every round) with the
    same method, case and edits applied."""
    full = {(r["method"], r["case_id"], r["edits_applied"]): r for r in reference}
    for r in rows:
        twin = full[(r["method"], r["case_id"], r["edits_applied"])]
        for name, value in r["metrics"]["counterfact"].items():
            assert value == pytest.approx(twin["metrics"]["counterfact"][name], rel=1e-6, abs=1e-6), name


def test_a_sampled_run_probes_the_batch_just_written_and_the_sample(sampled_run, runs):
    from editscope.run.trial import derived_seed

    keys = np.random.default_rng(derived_seed(0, "counterfact", 0, "reprobe")).random(BATCH * ROUNDS)
    rows = sampled_run[1]
    for method in ("memit", "alphaedit"):
        got = _probed(rows, method)
        # checkpoints after rounds 2 and 4, then the final rows after round 5: never every case
        assert set(got) == {(4, True), (8, True), (BATCH * ROUNDS, False)}
        for (edits, _), indices in got.items():
            assert sorted(indices) == _positions_by_hand(edits, keys), (method, edits)
    _assert_twins(rows, runs["all"][1])
    # the run's plan counted exactly these rows
    assert json.loads((sampled_run[0] / "run.json").read_text())["planned_rows"] == len(rows)


def test_sampled_rows_record_their_stratum_and_the_table_weighs_it(sampled_run):
    """The final rows are the last batch (2 of 10 cases) and a sample of 3 of the 8 earlier: the table's mean is
    (2·mean(last batch) + 8·mean(sample)) / 10, not the plain mean of 5 rows."""
    from editscope.run.summary import summarize

    rows = sampled_run[1]
    final = [r for r in rows if r["method"] == "memit" and not r["checkpoint"]]
    n = BATCH * ROUNDS
    for r in final:
        new = r["index"] >= n - BATCH
        assert r["stratum"] == ([True, BATCH] if new else [False, n - BATCH])
    got = next(s for s in summarize(rows) if s.method == "memit" and s.metric == "PS_post")
    new = [r["metrics"]["counterfact"]["PS_post"] for r in final if r["index"] >= n - BATCH]
    old = [r["metrics"]["counterfact"]["PS_post"] for r in final if r["index"] < n - BATCH]
    assert len(new) == BATCH and len(old) == LIMIT
    assert got.ci == "t-strata"
    assert got.mean == pytest.approx(BATCH / n * np.mean(new) + (n - BATCH) / n * np.mean(old))


def test_sampled_is_in_the_digest_and_checked():
    assert parse_config(_sampled_config()).digest() != parse_config(
        _config(LIMIT) | {"mode": {"sequential_batches": {"batch": BATCH, "rounds": ROUNDS, "checkpoints": 2,
                                                          "reprobe": LIMIT}}}).digest()
    bad = _sampled_config()
    bad["mode"]["sequential_batches"]["sampled"] = "yes"
    with pytest.raises(EditscopeError, match="mode.sequential_batches.sampled"):
        parse_config(bad)


# ``checkpoints: [r1, r2, ...]``: the checkpoint rounds listed (a log scale) instead of every k-th round


def _listed_config(rounds: list[int], methods=("memit", "alphaedit")) -> dict:
    config = _config(LIMIT, methods)
    config["mode"]["sequential_batches"]["checkpoints"] = rounds
    return config


def test_a_listed_schedule_parses_checks_and_keeps_the_int_form():
    mode = parse_config(_listed_config([1, 3])).mode
    assert mode == Lifelong(BATCH, ROUNDS, (1, 3), LIMIT) and mode.to_dict()["checkpoints"] == [1, 3]
    assert mode_from_dict(json.loads(json.dumps(mode.to_dict()))) == mode  # run.json's form reads back
    assert parse_config(_config(None)).mode.checkpoints == 1  # an int stays an int (and its digest)
    for bad, why in (([2, 2], r"checkpoints\[1\].*must increase"), ([0], r"checkpoints\[0\].*>= 1"),
                     ([1, ROUNDS + 1], r"checkpoints\[1\].*after the last round"), (["1"], r"checkpoints\[0\]")):
        with pytest.raises(EditscopeError, match=why):
            parse_config(_listed_config(bad))


def test_a_listed_schedule_has_the_units_of_the_every_k_schedule_it_spells_out():
    members = list(range(12))
    for sampled in (False, True):
        every = Lifelong(2, 6, 2, reprobe=3, sampled=sampled)
        listed = Lifelong(2, 6, (2, 4), reprobe=3, sampled=sampled)
        assert listed.units(members, lambda i: 1, seed=5) == every.units(members, lambda i: 1, seed=5)
        assert listed.pre_positions(12, seed=5) == every.pre_positions(12, seed=5)
    # the last round is never a checkpoint: its probe is the final rows
    assert Lifelong(2, 3, (1, 3)).units([0, 1, 2, 3, 4, 5], lambda i: 1, seed=0) == Lifelong(2, 3, (1,)).units(
        [0, 1, 2, 3, 4, 5], lambda i: 1, seed=0)


def test_lm_eval_follows_a_listed_schedule():
    spec = LmEvalSpec(tasks=("t",))
    # rounds 1 and 3 of 4 rounds of 2 cases (one request each), then the last round
    assert due_points(spec, (1, 3), 2, [1] * 8) == [(1, 2), (3, 6), (4, 8)]
    assert due_points(spec, 2, 2, [1] * 8) == [(2, 4), (4, 8)]


@pytest.fixture(scope="module")
def listed_run(tiny_bundles, tmp_path_factory):
    path = tmp_path_factory.mktemp("listed")
    Runner(parse_config(_listed_config([1, 3])), out_dir=path, bundle=tiny_bundles["llama"], progress=False,
           log=lambda _m: None).run()
    return path, read_results(path / "results.jsonl")


def test_a_listed_schedule_probes_after_its_rounds_the_cases_since_the_previous_one(listed_run, runs):
    rows = listed_run[1]
    for method in ("memit", "alphaedit"):
        # after round 1: its 2 cases; after round 3: the 4 edited since round 1 and the 2 before (within the
        # re-probe limit of 3, so all); the final rows after round 5: every case
        assert _probed(rows, method) == {(2, True): [0, 1], (6, True): [0, 1, 2, 3, 4, 5],
                                         (10, False): list(range(10))}, method
    _assert_twins(rows, runs["all"][1])
    assert json.loads((listed_run[0] / "run.json").read_text())["planned_rows"] == len(rows)


def test_a_listed_schedule_resumes_after_its_last_checkpoint(listed_run, tiny_bundles, tmp_path):
    """Killed at its first final row (round 3's checkpoint on disk), the rerun resumes after round 3 and writes
    the rows of the uninterrupted run."""
    config = parse_config(_listed_config([1, 3], methods=("memit",)))
    want = [r for r in listed_run[1] if r["method"] == "memit"]
    logs: list[str] = []

    class Kill(Exception):
        pass

    def kill(row):
        if not row["checkpoint"]:
            raise Kill

    with pytest.raises(Kill):
        Runner(config, out_dir=tmp_path, bundle=tiny_bundles["llama"], progress=False, on_row=kill,
               log=logs.append).run()
    Runner(config, out_dir=tmp_path, bundle=tiny_bundles["llama"], progress=False, log=logs.append).run()
    assert any("after round 3 (6 edits)" in m for m in logs), logs
    got = read_results(tmp_path / "results.jsonl")
    assert [(r["case_id"], r["edits_applied"]) for r in got] == [(r["case_id"], r["edits_applied"]) for r in want]
    for a, b in zip(got, want, strict=True):
        assert close(a["metrics"], b["metrics"]), (a["case_id"], a["edits_applied"])
