"""A 2-case demo-like run on the real SmolLM2-135M: the demo's first editor (MEMIT) on a CounterFact and a PEAK-CF
case, then the report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from editscope.edit.patch import tensor_checksum
from editscope.paths import configs_dir
from editscope.report import build_report
from editscope.run import Runner, load_config, read_results, recompute_metrics

DEMO = configs_dir() / "demo.yaml"


@pytest.mark.slow
def test_demo_like_run_on_smollm2(smollm2, tmp_path):
    config = load_config(DEMO)
    first = config.methods[0]
    assert first.name == "memit" and config.mode.name == "batch"
    # the demo's MEMIT with a small statistics budget and few steps, on one CounterFact and one PEAK-CF case
    fast = replace(first, overrides={"v_steps": 8, "mom2_tokens": 8192})
    blocks = tuple(b for b in config.blocks if b.dataset in ("counterfact", "peak-cf"))
    config = replace(config, methods=(fast,), blocks=blocks)
    weight = smollm2.arch.weight_name(4)
    before = tensor_checksum(dict(smollm2.model.named_parameters())[weight])
    Runner(config, out_dir=tmp_path, limit=1, bundle=smollm2, progress=False, log=lambda _m: None).run()
    assert tensor_checksum(dict(smollm2.model.named_parameters())[weight]) == before
    rows = read_results(tmp_path / "results.jsonl")
    assert [(r["dataset"], r["method"]) for r in rows] == [("counterfact", "memit"), ("peak-cf", "memit")]
    cf = rows[0]["metrics"]["counterfact"]
    assert cf["EM_post"] > cf["EM_pre"]  # the edit raised P(new) - P(true) on the rewrite prompt
    new_pre = [c for p in rows[1]["pre"]["peak"]["prompts"] if p["role"] == "rewrite" for c in p["candidates"]
               if c["kind"] == "new"][0]
    new_post = [c for p in rows[1]["post"]["peak"]["prompts"] if p["role"] == "rewrite" for c in p["candidates"]
                if c["kind"] == "new"][0]
    assert new_post["logprob_sum"] > new_pre["logprob_sum"]  # the appended answer became more likely
    assert recompute_metrics(tmp_path) == []
    html_path, _ = build_report([tmp_path])
    assert html_path.read_text().count("data:image/png;base64,") == 5
