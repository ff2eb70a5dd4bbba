"""The shipped lifelong config (paper 004 Table 1's protocol) end to end on tiny-llama with 3 sequential batches of 4:
every checkpoint re-probes every case edited so far, the general suite's numbers are the model's (one value per
checkpoint), and the report draws the curves against the number of edits. A chain killed after its round-2
checkpoint resumes there and gives the rows of an uninterrupted run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from editscope.edit.patch import tensor_checksum
from editscope.errors import EditscopeError
from editscope.paths import configs_dir
from editscope.report import build_report
from editscope.run import Runner, parse_config, read_results
from editscope.run.chain import CHAINS_DIR, ChainCheckpoint, chain_path, pre_path
from editscope.run.runner import timing_free
from editscope.run.summary import retention
from editscope.run.trial import Trial
from tests.run.helpers import close

BATCH, ROUNDS = 4, 3


def lifelong_data(methods: list | None = None, **changes) -> dict:
    """The shipped lifelong config on tiny-llama, 3 rounds of 4 (``methods``: the config's, v*/z in 2 steps; FT and
    UltraEdit have no v*). The general suite reads less text and the wild suite answers in at most 8 tokens: a
    random model never stops before the limit, and 50 greedy tokens per prompt were half of a run's time."""
    data = yaml.safe_load((configs_dir() / "experiments" / "lifelong-counterfact.yaml").read_text())
    assert data["mode"] == {"sequential_batches": {"batch": 100, "rounds": 10, "checkpoints": 1}}
    methods = data["methods"] if methods is None else methods
    data.update(model="tiny-llama", mode={"sequential_batches": {"batch": BATCH, "rounds": ROUNDS, "checkpoints": 1}},
                methods=[m if m in ("ft", "ultraedit") else {"name": m, "overrides": {"v_steps": 2}} for m in methods])
    block = data["datasets"][0]
    block["slice"] = {"offset": 0, "limit": BATCH * ROUNDS}
    small = {"general": {"text_tokens": 200, "row_tokens": 64, "fact_pool": 40, "generation_prompts": 2,
                         "generation_tokens": 6}, "wild": {"max_new_tokens": 8}}
    block["suites"] = [{"name": s, "options": small[s]} if isinstance(s, str) and s in small else s
                       for s in block["suites"]]
    assert {s["name"] for s in block["suites"] if isinstance(s, dict)} >= set(small)  # both are in the config
    return data | changes


def test_lifelong_counterfact_config_runs_three_batches_of_four(tiny_bundles, tmp_path):
    data = lifelong_data()
    methods = yaml.safe_load((configs_dir() / "experiments" / "lifelong-counterfact.yaml").read_text())["methods"]
    config = parse_config(data)
    Runner(config, out_dir=tmp_path / "run", bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    rows = read_results(tmp_path / "run" / "results.jsonl")

    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        by_edits: dict[int, list[dict]] = {}
        for r in mine:
            by_edits.setdefault(r["edits_applied"], []).append(r)
        # after round j the j·4 cases edited so far are probed: retention of every earlier batch
        assert {n: len(v) for n, v in by_edits.items()} == {4: 4, 8: 8, 12: 12}, method
        assert all(r["checkpoint"] == (n < 12) for n, v in by_edits.items() for r in v)
        for v in by_edits.values():  # the general suite measures the model: one value per checkpoint
            assert len({r["metrics"]["general"]["PPL_post"] for r in v}) == 1
            assert len({r["metrics"]["general"]["PPL_pre"] for r in v}) == 1
        ppl = [by_edits[n][0]["metrics"]["general"]["PPL_post"] for n in (4, 8, 12)]
        assert ppl[0] != by_edits[4][0]["metrics"]["general"]["PPL_pre"] or method == "ft", method  # edits act
        assert {"ES_post", "PS_post", "NS_post"} <= set(by_edits[12][0]["metrics"]["counterfact"])
        assert {"EVK_ES", "EVK_TS"} <= set(by_edits[12][0]["metrics"]["evk"])  # post-only cosines
        if method not in ("ft", "ultraedit"):  # the z optimisers record, per round, how their optimisation went
            info, steps = by_edits[12][-1]["edit_info"], by_edits[12][-1]["hparams"]["v_steps"]
            assert 1 <= info["v_steps_mean"] <= steps and 0 <= info["v_step_capped"] <= 1, method
    # retention matrix: batch i (the cases first probed at 4·i edits) measured at every later checkpoint, against
    # the rows grouped by hand (a case's batch is its index // 4: rows are in case order)
    matrix = retention(rows, "counterfact", "ES_post")
    for method in methods:
        cells = matrix[("counterfact", "counterfact", method)]
        assert sorted(cells) == [(4, 4), (4, 8), (4, 12), (8, 8), (8, 12), (12, 12)]
        for (i, j), value in cells.items():
            want = [r["metrics"]["counterfact"]["ES_post"] for r in rows if r["method"] == method
                    and r["edits_applied"] == j and r["index"] // BATCH == i // BATCH - 1]
            assert value == pytest.approx(sum(want) / len(want)) and len(want) == BATCH
    html, _md = build_report([tmp_path / "run"])
    text = html.read_text()
    assert "PPL" in text and "number of edits" in text  # the general suite's columns and the curves
    figures = tmp_path / "run" / "figures"
    assert (figures / "retention-counterfact-counterfact.png").is_file()
    assert not (figures / "retention-counterfact-general.png").exists()  # the model-level suite: nothing to retain
    assert (figures / "evk-map-counterfact.png").stat().st_size > 1000  # paper 004 Fig. 5, from the final rows


class Kill(Exception):
    pass


RESUMED = ["memit", "alphaedit", "prune"]  # AlphaEdit carries K_p K_pᵀ, PRUNE the accumulated ΔW


def test_lifelong_chains_resume_at_their_last_checkpoint(tiny_bundles, tmp_path, monkeypatch):
    """Each method's chain is killed once, at its first final row (round 3 edited, the round-2 checkpoint on disk);
    each rerun resumes that chain after round 2 and the rows, in order, equal an uninterrupted run's. The unedited
    model is probed once: the reruns read its probes from the file the first run stored (a damaged one is named and
    probed again)."""
    bundle = tiny_bundles["llama"]
    weights = {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}
    config = parse_config(lifelong_data(RESUMED))
    pre_probed: list[int] = []  # per Trial.probe call before editing: how many cases it probed
    probe = Trial.probe

    def counting(self, engine, cases, stage="post"):
        if stage == "pre":
            pre_probed.append(len(cases))
        return probe(self, engine, cases, stage)

    monkeypatch.setattr(Trial, "probe", counting)

    def run(out, **kw):
        return Runner(config, out_dir=out, bundle=bundle, progress=False, **kw).run()

    want = read_results(run(tmp_path / "whole", log=lambda _m: None).out_dir / "results.jsonl")
    assert not (tmp_path / "whole" / CHAINS_DIR).exists()  # a finished run leaves no chain state on disk
    assert pre_probed == [BATCH * ROUNDS]  # one group: probed once for every method
    out = tmp_path / "killed"
    stored = pre_path(out, "counterfact", 0)
    for k, method in enumerate([*RESUMED, None]):
        logs: list[str] = []
        pre_probed.clear()
        if k == 2:  # a flipped digit in the stored probes: named, and the unedited model probed again
            stored.write_text(stored.read_text().replace('"logprob_sum":-', '"logprob_sum":-1', 1))

        def kill(row, method=method):
            if row["method"] == method and not row["checkpoint"]:
                path = chain_path(out, "counterfact", 0, method)
                # the latest state of this chain, and the group's pre-edit probes
                assert sorted((out / CHAINS_DIR).iterdir()) == sorted([path, stored])
                ckpt = ChainCheckpoint.load(path)
                assert (ckpt.round, ckpt.edits_applied, len(ckpt.meta["rounds"])) == (2, 8, 2)
                assert ckpt.meta["state_class"] == {"memit": "NoState", "alphaedit": "AlphaEditState",
                                                    "prune": "PruneState"}[method]
                assert ckpt.state_tensors or method == "memit"
                raise Kill

        if method is None:
            run(out, log=logs.append)
        else:
            with pytest.raises(Kill):
                run(out, on_row=kill, log=logs.append)
        assert {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()} == weights
        if k == 1:  # a resume under other runtime settings is refused before any work
            other = parse_config(lifelong_data(RESUMED, runtime={"forward": "full"}))
            with pytest.raises(EditscopeError, match="runtime forward=fast"):
                Runner(other, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None).run()
        resumed = [m for m in logs if m.startswith("resuming chain")]
        if k:  # the chain killed by the run before continues after its round-2 checkpoint, once
            assert len(resumed) == 1 and f"method {RESUMED[k - 1]} after round 2 (8 edits)" in resumed[0], logs
        else:
            assert resumed == []
        read = [m for m in logs if "the unedited model's probes of 12 case(s) read from" in m]
        damaged = [m for m in logs if m.startswith(f"warning: {stored}: does not match its digest")]
        assert (pre_probed, len(read), len(damaged)) == [([12], 0, 0), ([], 1, 0), ([12], 0, 1), ([], 1, 0)][k], logs
    got = read_results(out / "results.jsonl")
    assert len(got) == len(want) == len(RESUMED) * (4 + 8 + 12)  # no row lost, none twice
    assert [r["method"] for r in got] == [r["method"] for r in want]
    assert [(r["case_id"], r["edits_applied"]) for r in got] == [(r["case_id"], r["edits_applied"]) for r in want]
    for a, b in zip(got, want, strict=True):
        assert close(timing_free(a), timing_free(b)), (a["method"], a["case_id"], a["edits_applied"])
    assert not (out / CHAINS_DIR).exists()


def test_an_ultraedit_chain_resumes_with_its_lifelong_normaliser(tiny_bundles, tmp_path):
    """UltraEdit's chain killed at its first final row resumes after round 2 from the checkpoint, whose editor state
    holds the normaliser of the 8 edits so far; the rows equal an uninterrupted run's (round 3's ΔW reads the
    restored statistics, so a lost or reset normaliser would change them)."""
    bundle = tiny_bundles["llama"]
    config = parse_config(lifelong_data(["ultraedit"]))

    def run(out, **kw):
        return Runner(config, out_dir=out, bundle=bundle, progress=False, **kw).run()

    want = read_results(run(tmp_path / "whole", log=lambda _m: None).out_dir / "results.jsonl")
    out = tmp_path / "killed"
    seen = {}

    def kill(row):
        if not row["checkpoint"]:
            ckpt = ChainCheckpoint.load(chain_path(out, "counterfact", 0, "ultraedit"))
            seen.update(round=ckpt.round, cls=ckpt.meta["state_class"], meta=ckpt.state_meta,
                        tensors=sorted(ckpt.state_tensors))
            raise Kill

    with pytest.raises(Kill):
        run(out, on_row=kill, log=lambda _m: None)
    assert seen["round"] == 2 and seen["cls"] == "UltraEditState"
    assert seen["meta"]["n_edits"] == 8 and seen["meta"]["n_turns"] == 2 and len(seen["meta"]["counts"]) == 1
    assert seen["tensors"] == [f"{kind}.{key}" for kind in ("mean", "sq_dev") for key in seen["meta"]["counts"]]
    logs: list[str] = []
    run(out, log=logs.append)
    assert sum("method ultraedit after round 2 (8 edits)" in m for m in logs) == 1, logs
    got = read_results(out / "results.jsonl")
    assert len(got) == len(want) == 4 + 8 + 12
    for a, b in zip(got, want, strict=True):
        assert close(timing_free(a), timing_free(b)), (a["case_id"], a["edits_applied"])


def test_a_chain_checkpoint_of_another_config_is_refused(tiny_bundles, tmp_path):
    """A chain file written under one config does not continue a run of another (here: another seed)."""
    bundle = tiny_bundles["llama"]
    config = parse_config(lifelong_data(["memit"]))

    def kill(row):
        if row["edits_applied"] == 8:  # the round-1 checkpoint file is on disk
            raise Kill

    with pytest.raises(Kill):
        Runner(config, out_dir=tmp_path / "a", bundle=bundle, progress=False, on_row=kill, log=lambda _m: None).run()
    assert ChainCheckpoint.load(chain_path(tmp_path / "a", "counterfact", 0, "memit")).round == 1
    shutil.copytree(tmp_path / "a" / CHAINS_DIR, tmp_path / "b" / CHAINS_DIR)
    other = parse_config(lifelong_data(["memit"], seed=1))
    with pytest.raises(EditscopeError, match="another config.*config_digest"):
        Runner(other, out_dir=tmp_path / "b", bundle=bundle, progress=False, log=lambda _m: None).run()


KILLER = """
import os, signal, sys
from editscope.run import Runner, parse_config
data = {data!r}

def kill(row):
    if not row["checkpoint"]:  # the round-2 checkpoint is on disk, round 3 edited: SIGKILL, no clean-up
        os.kill(os.getpid(), signal.SIGKILL)

Runner(parse_config(data), out_dir=sys.argv[1], progress=False, on_row=kill, log=lambda _m: None).run()
"""


def test_a_sigkilled_chain_resumes_at_its_last_checkpoint(tiny_bundles, tmp_path):
    """A real SIGKILL (in a subprocess) after the round-2 checkpoint: the rerun resumes there, and the rows equal an
    uninterrupted run's; the finished run leaves no chain file behind."""
    import os
    import signal
    import subprocess
    import sys

    data = lifelong_data(["alphaedit"])
    data["datasets"][0]["suites"] = ["counterfact"]
    src = str(Path(__file__).resolve().parents[2] / "src")  # this checkout's package
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", KILLER.format(data=data), str(tmp_path / "killed")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert ChainCheckpoint.load(chain_path(tmp_path / "killed", "counterfact", 0, "alphaedit")).round == 2
    config, bundle = parse_config(data), tiny_bundles["llama"]
    logs: list[str] = []
    result = Runner(config, out_dir=tmp_path / "killed", bundle=bundle, progress=False, log=logs.append).run()
    assert any("method alphaedit after round 2 (8 edits)" in m for m in logs), logs
    assert (result.skipped, result.written) == (4 + 8 + 1, 11)  # the row on_row saw was written before the kill
    want = read_results(Runner(config, out_dir=tmp_path / "whole", bundle=bundle, progress=False,
                               log=lambda _m: None).run().out_dir / "results.jsonl")
    got = read_results(tmp_path / "killed" / "results.jsonl")
    assert len(got) == len(want) == 4 + 8 + 12
    assert all(close(timing_free(a), timing_free(b)) for a, b in zip(got, want, strict=True))
    assert not (tmp_path / "killed" / CHAINS_DIR).exists()
