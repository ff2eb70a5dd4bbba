"""Memory and context editors in lifelong chains (the shipped lifelong config on tiny-llama, 3 rounds of 4): the store
(GRACE's codebook, WISE's side memories, retrieval's facts) is the chain's state, saved at each checkpoint; a chain
killed after its round-2 checkpoint resumes from the store and gives the rows of an uninterrupted run, and no weight
ever changes."""

from __future__ import annotations

import pytest

from editscope.edit.patch import tensor_checksum
from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config, read_results
from editscope.run.chain import CHAINS_DIR, ChainCheckpoint, chain_path
from editscope.run.runner import timing_free
from tests.run.helpers import close
from tests.run.test_lifelong import Kill, lifelong_data

STORES = [{"name": "retrieval", "overrides": {"k": 2}}, {"name": "grace", "overrides": {"n_iter": 3, "layers": [1]}},
          # shards of 2 edits merged every 4: the killed chain's round-2 state holds a merged memory and a shard
          {"name": "wise", "overrides": {"n_iter": 3, "layers": [1], "save_freq": 2, "merge_freq": 4,
                                         "context_templates": [[5, 1]],
                                         "irrelevant_pool": "counterfact-train-sample"}}]


def store_data(method: dict, *, evk: bool | None = None) -> dict:
    """The lifelong config with ``method``; EVK's suite only for a memory editor (a context edit cannot be scored
    from perturbed prompt embeddings) unless ``evk`` says."""
    data = {**lifelong_data(["ft"]), "methods": [method]}
    keep = method["name"] != "retrieval" if evk is None else evk
    block = data["datasets"][0]
    block["suites"] = [s for s in block["suites"] if keep or (s if isinstance(s, str) else s["name"]) != "evk"]
    return data


def test_a_context_editor_with_a_suite_reading_prompt_embeddings_is_refused(tiny_bundles, tmp_path):
    config = parse_config(store_data(STORES[0], evk=True))
    with pytest.raises(EditscopeError, match="method 'retrieval' is a context editor, and suite evk of block "
                                             "counterfact scores prompts from perturbed embeddings"):
        Runner(config, out_dir=tmp_path, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize("method", STORES, ids=lambda m: m["name"])
def test_a_store_chain_resumes_from_its_checkpointed_store(tiny_bundles, tmp_path, method):
    bundle = tiny_bundles["llama"]
    name = method["name"]
    weights = {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}
    config = parse_config(store_data(method))

    def run(out, **kw):
        return Runner(config, out_dir=out, bundle=bundle, progress=False, **kw).run()

    want = read_results(run(tmp_path / "whole", log=lambda _m: None).out_dir / "results.jsonl")
    assert {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()} == weights
    assert not bundle.applied and not bundle.contexts and not bundle.has_memory
    out = tmp_path / "killed"
    seen = {}

    def kill(row):
        if not row["checkpoint"]:
            ckpt = ChainCheckpoint.load(chain_path(out, "counterfact", 0, name))
            seen.update(round=ckpt.round, cls=ckpt.meta["state_class"], meta=ckpt.state_meta, deltas=ckpt.deltas,
                        tensors=sorted(ckpt.state_tensors))
            raise Kill

    with pytest.raises(Kill):
        run(out, on_row=kill, log=lambda _m: None)
    assert seen["round"] == 2 and seen["deltas"] == {}  # no weight in the checkpoint: the store is the state
    if name == "retrieval":
        assert seen["cls"] == "ContextStore" and len(seen["meta"]["facts"]) == 8
    elif name == "grace":
        assert seen["cls"] == "GraceCodebook" and seen["tensors"] == ["keys", "radii", "values"]
        assert 1 <= len(seen["meta"]["labels"]) <= 8
    else:  # 8 edits: merges after 4 and 8, every shard saved, none in progress
        assert seen["cls"] == "WiseMemory" and seen["tensors"] == ["merged"]
        assert seen["meta"]["count"] == 8 and seen["meta"]["merges"] == 2
    logs: list[str] = []
    run(out, log=logs.append)
    assert sum(f"method {name} after round 2 (8 edits)" in m for m in logs) == 1, logs
    got = read_results(out / "results.jsonl")
    assert len(got) == len(want) == 4 + 8 + 12
    for a, b in zip(got, want, strict=True):
        assert close(timing_free(a), timing_free(b)), (a["case_id"], a["edits_applied"])
        assert a["edit_info"]["kind"] == {"retrieval": "context", "grace": "memory", "wise": "memory"}[name]
    assert not (out / CHAINS_DIR).exists()
    assert {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()} == weights
    if name == "retrieval":  # the store grew round by round: 4, 8, 12 facts
        assert sorted({r["edit_info"]["facts_stored"] for r in got}) == [4, 8, 12]


def test_sequential_store_edits_state_every_earlier_fact_and_leave_no_trace(tiny_bundles, tmp_path):
    """``sequential: 3`` with PROMPT: the k-th edit of a group states the group's first k facts (its intervention
    supersedes the one before), every case is probed after the last, and the bundle ends as loaded."""
    bundle = tiny_bundles["llama"]
    weights = {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}
    data = {"model": "tiny-llama", "mode": {"sequential": 3}, "methods": ["prompt", "grace"],
            "dataset": "counterfact", "slice": {"limit": 6}, "suites": ["counterfact"]}
    Runner(parse_config(data), out_dir=tmp_path, bundle=bundle, progress=False, log=lambda _m: None).run()
    rows = read_results(tmp_path / "results.jsonl")
    prompt = [r for r in rows if r["method"] == "prompt"]
    assert [r["edit_info"]["facts_stated"] for r in prompt] == [1, 2, 3, 1, 2, 3]
    grace = [r for r in rows if r["method"] == "grace"]
    assert [r["edit_info"]["codebook_size"] for r in grace] == [1, 2, 3, 1, 2, 3]
    assert not bundle.applied and not bundle.contexts and not bundle.has_memory
    assert {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()} == weights
