"""The shipped lifelong config (paper 004 Table 1's protocol) end to end on tiny-llama with 3 sequential batches of 4:
every checkpoint re-probes every case edited so far, the general suite's numbers are the model's (one value per
checkpoint), and the report draws the curves against the number of edits."""

from __future__ import annotations

import pytest
import yaml

from editscope.paths import configs_dir
from editscope.report import build_report
from editscope.run import Runner, parse_config, read_results
from editscope.run.summary import retention

BATCH, ROUNDS = 4, 3


def test_lifelong_counterfact_config_runs_three_batches_of_four(tiny_bundles, tmp_path):
    data = yaml.safe_load((configs_dir() / "experiments" / "lifelong-counterfact.yaml").read_text())
    assert data["mode"] == {"sequential_batches": {"batch": 100, "rounds": 10, "checkpoints": 1}}
    methods = data["methods"]
    data.update(model="tiny-llama", mode={"sequential_batches": {"batch": BATCH, "rounds": ROUNDS, "checkpoints": 1}},
                methods=[m if m == "ft" else {"name": m, "overrides": {"v_steps": 2}} for m in methods])
    block = data["datasets"][0]
    block["slice"] = {"offset": 0, "limit": BATCH * ROUNDS}
    block["suites"] = [s if s != "general" else {"name": "general", "options": {
        "text_tokens": 200, "row_tokens": 64, "fact_pool": 40, "generation_prompts": 2, "generation_tokens": 6}}
        for s in block["suites"]]
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
