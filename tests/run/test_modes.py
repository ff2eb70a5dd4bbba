"""Run modes on tiny-llama with real editors and the real counterfact suite: sequential_batches equals applying
the batches by hand with the editor API and probing (checkpoints included); probe_only rows hold the unedited
model's probes and its pre-edit metrics computed here independently; resume after a kill."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from editscope.data import load_cases
from editscope.edit.patch import tensor_checksum
from editscope.edit.registry import get_editor
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.run import Runner, parse_config, read_results, recompute_metrics
from editscope.run.plan import ProbeOnly
from editscope.run.runner import timing_free
from editscope.run.trial import derived_seed
from editscope.suites.counterfact import CounterFactSuite
from tests.run.helpers import close

SEQ = {"sequential_batches": {"batch": 2, "rounds": 2, "checkpoints": 1}}


def cfg(*, drop: tuple[str, ...] = (), **changes):
    data = {"model": "tiny-llama", "seed": 0, "output": "unused",
            "methods": [{"name": "alphaedit", "overrides": {"v_steps": 2}}],
            "dataset": "counterfact", "slice": {"offset": 0, "limit": 4}, "suites": ["counterfact"]}
    return parse_config({k: v for k, v in (data | changes).items() if k not in drop})


def weights(bundle) -> dict[str, str]:
    return {name: tensor_checksum(p) for name, p in bundle.model.named_parameters()}


def run_into(out, bundle, config, **kw):
    return Runner(config, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None, **kw).run()


@pytest.fixture(scope="module")
def seq_run(tmp_path_factory, tiny_llama):
    out = tmp_path_factory.mktemp("seq")
    before = weights(tiny_llama)
    run_into(out, tiny_llama, cfg(mode=SEQ))
    assert weights(tiny_llama) == before
    return out




def test_sequential_batches_equal_batches_by_hand(seq_run, tiny_llama):
    rows = read_results(seq_run / "results.jsonl")
    # round 1 edits cases 0-1 (checkpoint after it: 2 rows), round 2 cases 2-3 (final: 4 rows)
    assert [(r["index"], r["checkpoint"], r["edits_applied"], r["round"]) for r in rows] == [
        (0, True, 2, 1), (1, True, 2, 1), (0, False, 4, 2), (1, False, 4, 2), (2, False, 4, 2), (3, False, 4, 2)]
    assert {r["mode"] for r in rows} == {"sequential_batches:2x2"}

    cases = load_cases("counterfact", limit=4)
    suite = CounterFactSuite()
    editor = get_editor("alphaedit")
    hp = editor.load_hparams(tiny_llama, None, {"v_steps": 2})
    engine = ScoringEngine(tiny_llama)
    runtime = EditRuntime()  # one per run, as the runner's: its context templates are generated once
    pre = suite.probe_many(engine, cases)
    state = editor.new_state()
    patches, posts = [], []
    try:
        for r, chunk in enumerate((cases[:2], cases[2:]), start=1):
            torch.manual_seed(derived_seed(0, "counterfact", "alphaedit", 0, "edit", r))
            patches.append(editor.apply(tiny_llama, [c.request for c in chunk], hp, state, engine=engine,
                                        runtime=runtime))
            posts.append(suite.probe_many(engine, cases[:2 * r]))
    finally:
        for p in reversed(patches):
            p.revert(tiny_llama)
    want = [(pre[i], posts[0][i]) for i in range(2)] + [(pre[i], posts[1][i]) for i in range(4)]
    for row, (p, q) in zip(rows, want, strict=True):
        assert close(row["pre"]["counterfact"], p)  # pre: the unedited model, also at the checkpoint
        assert close(row["post"]["counterfact"], q)
        assert close(row["metrics"]["counterfact"], suite.metrics(cases[row["index"]], p, q))
    assert rows[0]["post"] != rows[2]["post"]  # round 2 changed the model
    assert recompute_metrics(seq_run) == []


def test_summary_uses_final_rows_only(seq_run):
    csv = (seq_run / "summary.csv").read_text().splitlines()
    es = next(line for line in csv if ",ES_post," in line).split(",")
    rows = [r for r in read_results(seq_run / "results.jsonl") if not r["checkpoint"]]
    assert int(es[4]) == 4
    assert float(es[5]) == pytest.approx(np.mean([r["metrics"]["counterfact"]["ES_post"] for r in rows]))


class Kill(Exception):
    pass


def test_sequential_batches_resume_after_kill(seq_run, tmp_path, tiny_llama):
    before = weights(tiny_llama)
    seen = []

    def kill(row):
        seen.append(row)
        if len(seen) == 3:  # both checkpoint rows and one final row written
            raise Kill

    with pytest.raises(Kill):
        run_into(tmp_path, tiny_llama, cfg(mode=SEQ), on_row=kill)
    assert weights(tiny_llama) == before
    result = run_into(tmp_path, tiny_llama, cfg(mode=SEQ))
    assert (result.skipped, result.written) == (3, 3)
    got = read_results(tmp_path / "results.jsonl")
    want = read_results(seq_run / "results.jsonl")
    assert sorted(map(str, map(timing_free, got))) == sorted(map(str, map(timing_free, want)))
    assert run_into(tmp_path, tiny_llama, cfg(mode=SEQ)).written == 0


def test_probe_only_rows_are_the_unedited_model(tmp_path, tiny_llama):
    config = cfg(methods=["none"], slice={"limit": 3})
    assert config == cfg(mode="probe_only", slice={"limit": 3}, drop=("methods",)) and config.mode == ProbeOnly()
    before = weights(tiny_llama)
    result = run_into(tmp_path, tiny_llama, config)
    assert weights(tiny_llama) == before and result.written == 3
    rows = read_results(tmp_path / "results.jsonl")
    cases = load_cases("counterfact", limit=3)
    engine = ScoringEngine(tiny_llama)
    probes = CounterFactSuite().probe_many(engine, cases)
    for row, case, probe in zip(rows, cases, probes, strict=True):
        assert row["method"] == "none" and row["post"] == {} and row["edit_seconds"] == 0.0
        assert close(row["pre"]["counterfact"], probe)
        metrics = row["metrics"]["counterfact"]
        assert all(k.endswith("_pre") for k in metrics) and {"ES_pre", "PS_pre", "NS_pre"} <= set(metrics)
        # ES on the unedited model, independently: mean per-token NLL of target_true above target_new
        new, true = engine.score([(case.request.text, case.request.target_new),
                                  (case.request.text, case.request.target_true)])
        assert metrics["ES_pre"] == float(-true.sum / true.n_tokens > -new.sum / new.n_tokens)
    assert recompute_metrics(tmp_path) == []
    assert "| none |" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("changes, message", [
    ({"methods": ["none", "rome"]}, "cannot be combined"),
    ({"mode": "probe_only"}, "edits nothing"),
    ({"methods": ["none"], "mode": {"batch": 2}}, "must be probe_only"),
    ({"mode": {"sequential_batches": {"batch": 2}}}, "sequential_batches.rounds': required"),
    ({"mode": {"sequential_batches": {"batch": 2, "rounds": 0}}}, "must be >= 1"),
    ({"mode": {"sequential_batches": {"batch": 2, "rounds": 2, "every": 1}}}, "unknown key"),
])
def test_mode_errors(changes, message):
    with pytest.raises(EditscopeError, match=message):
        cfg(**changes)


def test_mode_digest_unchanged_for_old_modes():
    """Configs without the new modes keep their digest (run directories written before stay resumable)."""
    data = cfg().to_dict()
    assert "batch" not in data and "rounds" not in data
    assert cfg(mode=SEQ).to_dict()["rounds"] == 2


def test_report_draws_metric_vs_edits(seq_run):
    """The report and summary.md of a sequential_batches run with checkpoints hold the metric-vs-edits table
    and figure; each point is the plain mean of the rows probed with that many edits on the model."""
    from editscope.report import build_report
    from editscope.run.summary import summarize_by_edits

    rows = read_results(seq_run / "results.jsonl")
    curves = summarize_by_edits(rows)
    points = curves[("counterfact", "counterfact")]
    assert sorted(points) == [2, 4]
    for edits, summary in points.items():
        probed = [r for r in rows if r["edits_applied"] == edits]
        assert len(probed) == edits  # one request per case: round 1 probes 2 cases, the final probe 4
        es = next(r for r in summary if r.metric == "ES_post")
        assert es.n == edits
        assert es.mean == pytest.approx(np.mean([r["metrics"]["counterfact"]["ES_post"] for r in probed]))
    html_path, md_path = build_report([seq_run])
    md = md_path.read_text()
    assert "After each number of edits (sequential batches):" in md
    assert (seq_run / "figures" / "curve-counterfact-counterfact.png").stat().st_size > 1000
    table = md.split("After each number of edits (sequential batches):")[1]
    assert "| alphaedit | 2 | 2 |" in table and "| alphaedit | 4 | 4 |" in table


def test_sequential_run_folds_its_chain_and_saves_each_patch_first(tmp_path, tiny_llama, monkeypatch):
    """In a chain each patch is saved, then folded (no ΔW kept per edit, one original per parameter, and the bundle
    holds one entry for the whole folded chain, not one per patch); the saved patches still apply in order on the
    loaded weights and revert bit-exactly."""
    from editscope.edit.patch import Patch
    from editscope.lm.bundle import Bundle

    held = []
    fold = Bundle.fold

    def watched(self, patch, digests=None):
        assert patch.bases and "vectors" in patch.info  # what an editor's patch carries before it is folded
        fold(self, patch, digests)
        held.append((len(self._originals), len(self.applied), self.applied[0].count, patch.revert_bytes,
                     sum(d.numel() for d in patch.deltas.values() if not d.is_meta),
                     bool(patch.bases) or "vectors" in patch.info))

    monkeypatch.setattr(Bundle, "fold", watched)
    before = weights(tiny_llama)
    config = cfg(mode={"sequential": 3}, slice={"limit": 3}, save_patches=True,
                 methods=[{"name": "rome", "overrides": {"v_steps": 2}}])
    assert run_into(tmp_path, tiny_llama, config).written == 3
    assert weights(tiny_llama) == before
    # ROME edits one matrix: one original; one entry for the chain; no patch keeps ΔW, revert entries, bases, vectors
    assert held == [(1, 1, k + 1, 0, 0, False) for k in range(3)]
    files = sorted((tmp_path / "patches" / "rome").glob("*.safetensors"))
    assert [f.name for f in files] == [f"counterfact-g00000-{k}.safetensors" for k in range(3)]
    patches = [Patch.load(f) for f in files]
    for p in patches:
        p.apply(tiny_llama)  # checks each patch's pre-edit checksums: the chain's order is intact
    assert weights(tiny_llama) != before
    for p in reversed(patches):
        p.revert(tiny_llama)
    assert weights(tiny_llama) == before
