"""Lifelong chains in several edit orders (``orders: K``): the permutations are the seeded shuffles numpy draws by
hand, each order is a chain of its own (resumed like any), and the spread across orders in the summary equals a
hand computation from the per-order rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st

from editscope.edit.patch import tensor_checksum
from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config, read_results
from editscope.run.blocks import load_blocks
from editscope.run.merge import merge_runs
from editscope.run.plan import base_label, label_threads, order_label
from editscope.run.planned import plan_run
from editscope.run.runner import timing_free
from editscope.run.store import read_json
from editscope.run.summary import across_orders, summarize_by_edits
from tests.run.helpers import close
from tests.run.test_lifelong import Kill, lifelong_data


def orders_data(k: int, seed: int = 0) -> dict:
    data = lifelong_data(["ultraedit"], seed=seed)
    data["mode"]["sequential_batches"]["orders"] = k
    return data


def test_each_order_is_the_seeded_permutation_drawn_by_hand():
    config = parse_config(orders_data(3, seed=7))
    blocks = load_blocks(config)
    base = blocks[0].cases
    assert [b.label for b in blocks] == ["counterfact", "counterfact~order1", "counterfact~order2"]
    assert config.block_labels() == [b.label for b in blocks]
    for k, block in enumerate(blocks[1:], start=1):
        perm = np.random.default_rng([7, k]).permutation(len(base))
        assert [c.case_id for c in block.cases] == [base[i].case_id for i in perm]
        assert block.requests == [blocks[0].requests[i] for i in perm]
        assert base_label(block.label) == ("counterfact", k) and order_label("counterfact", k) == block.label
    assert sorted(c.case_id for c in blocks[2].cases) == sorted(c.case_id for c in base)
    assert [c.case_id for c in blocks[1].cases] != [c.case_id for c in base]


def test_orders_leave_older_configs_as_they_were_and_refuse_bad_input():
    plain = parse_config(lifelong_data(["ultraedit"]))
    assert "orders" not in plain.to_dict() and plain.block_labels() == ["counterfact"]
    assert parse_config(orders_data(1)).digest() == plain.digest()  # orders: 1 is the default
    assert parse_config(orders_data(2)).to_dict()["orders"] == 2
    with pytest.raises(EditscopeError, match=r"key 'mode.sequential_batches.orders'"):
        parse_config(orders_data(0))
    data = orders_data(2)
    data["datasets"][0]["label"] = "cf~order1"
    with pytest.raises(EditscopeError, match=r"key 'datasets\[0\].label': 'cf~order1'"):
        parse_config(data)


def test_two_orders_run_as_two_chains_resume_and_their_spread_matches_a_hand_computation(tiny_bundles, tmp_path):
    bundle = tiny_bundles["llama"]
    weights = {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()}
    config = parse_config(orders_data(2))

    def run(out, **kw):
        return Runner(config, out_dir=out, bundle=bundle, progress=False, **kw).run()

    want = read_results(run(tmp_path / "whole", log=lambda _m: None).out_dir / "results.jsonl")
    assert {r["dataset"] for r in want} == {"counterfact", "counterfact~order1"}
    # the second order's first checkpoint probes the first batch of its permutation
    blocks = load_blocks(config)
    first = {r["case_id"] for r in want if r["dataset"] == "counterfact~order1" and r["edits_applied"] == 4}
    assert first == {c.case_id for c in blocks[1].cases[:4]}

    # killed inside the second order's chain, resumed: the rows of the uninterrupted run
    out = tmp_path / "killed"

    def kill(row):
        if row["dataset"] == "counterfact~order1" and row["edits_applied"] == 8:
            raise Kill

    with pytest.raises(Kill):
        run(out, on_row=kill, log=lambda _m: None)
    run(out, log=lambda _m: None)
    got = read_results(out / "results.jsonl")
    assert len(got) == len(want)
    for a, b in zip(sorted(got, key=_key), sorted(want, key=_key), strict=True):
        assert close(timing_free(a), timing_free(b)), _key(a)
    assert {n: tensor_checksum(p) for n, p in bundle.model.named_parameters()} == weights

    # the spread across orders, by hand: each order's mean of ES at each number of edits, then their mean and a
    # Student t interval over the two
    spread = across_orders(summarize_by_edits(want))
    points = {(p.row.method, p.edits): p for p in spread[("counterfact", "counterfact")] if p.row.metric == "ES_post"}
    spread_seen = 0
    for edits in (4, 8, 12):
        per_order = []
        for label in ("counterfact", "counterfact~order1"):
            vals = [r["metrics"]["counterfact"]["ES_post"] for r in want
                    if r["dataset"] == label and r["edits_applied"] == edits]
            per_order.append(sum(vals) / len(vals))
        p = points[("ultraedit", edits)]
        mean = sum(per_order) / 2
        sd = math.sqrt(sum((v - mean) ** 2 for v in per_order))  # n − 1 = 1
        half = st.t.ppf(0.975, 1) * sd / math.sqrt(2)
        assert p.values == pytest.approx(tuple(per_order)) and p.row.n == 2 and p.row.ci == "orders"
        assert p.row.mean == pytest.approx(mean)
        if sd:
            spread_seen += 1
            assert (p.row.ci95_low, p.row.ci95_high) == pytest.approx((mean - half, mean + half))
    assert spread_seen  # the orders differ somewhere: the interval was checked
    summary = (tmp_path / "whole" / "summary.md").read_text()
    assert "## counterfact on counterfact, across 2 edit orders" in summary
    # the report: the same table, and a figure of the mean across orders with each order's curve
    from editscope.report.build import build_report

    html, md = build_report([tmp_path / "whole"], tmp_path / "report")
    assert "Across 2 edit orders:" in md.read_text()
    assert (tmp_path / "report" / "figures" / "orders-counterfact-counterfact.png").is_file()
    # a measured block of a docs page: the same table and the chains' break points
    from editscope.report.reproduction import regenerate

    page = tmp_path / "page.md"
    page.write_text("# Orders\n\n<!-- editscope:measured whole figures=none -->\n<!-- editscope:end -->\n")
    regenerate(page, tmp_path)
    text = page.read_text()
    assert "counterfact on counterfact, across 2 edit orders:" in text and "Where the chains break:" in text


def test_shards_spread_the_orders_and_merge_into_the_unsharded_rows(tiny_bundles, tmp_path):
    config = parse_config(orders_data(3))
    labels = ["counterfact", "counterfact~order1", "counterfact~order2"]

    def chains(shard):  # the chains a shard edits, from its planned rows
        return sorted({key[0] for key in plan_run(config, shard=shard).rows}, key=labels.index)

    # a chain is one group (group 0), so chain c goes to shard c mod n
    assert [chains((i, 3)) for i in range(3)] == [[labels[0]], [labels[1]], [labels[2]]]
    assert [chains((i, 2)) for i in range(2)] == [[labels[0], labels[2]], [labels[1]]]
    assert chains((0, 1)) == labels
    both = [k for i in range(2) for k in plan_run(config, shard=(i, 2)).rows]
    assert sorted(both) == sorted(plan_run(config).rows)  # every row once
    # a config of one order is cut as before: every group of the block goes to shard g mod n
    plain = parse_config(lifelong_data(["ultraedit"]))
    assert [len(plan_run(plain, shard=(i, 2)).rows) for i in range(2)] == [len(plan_run(plain).rows), 0]

    # run as two shards and merged: the rows of the unsharded run
    bundle = tiny_bundles["llama"]
    two = parse_config(orders_data(2))
    whole = Runner(two, out_dir=tmp_path / "whole", bundle=bundle, progress=False, log=lambda _m: None).run()
    for i in range(2):
        Runner(two, out_dir=tmp_path / f"s{i}", bundle=bundle, progress=False, shard=(i, 2),
               log=lambda _m: None).run()
    assert {r["dataset"] for r in read_results(tmp_path / "s1" / "results.jsonl")} == {labels[1]}
    merge_runs(tmp_path / "merged", [tmp_path / "s0", tmp_path / "s1"])
    got, want = (sorted(read_results(d / "results.jsonl"), key=_key) for d in (tmp_path / "merged", whole.out_dir))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert close(timing_free(a), timing_free(b)), _key(a)

    # an unsharded run stopped after its first chain, its second chain run as shard 1 of 2: merged, complete
    def stop(row):
        if row["dataset"] == labels[1]:
            raise Kill

    with pytest.raises(Kill):
        Runner(two, out_dir=tmp_path / "stopped", bundle=bundle, progress=False, on_row=stop,
               log=lambda _m: None).run()
    merge_runs(tmp_path / "rest", [tmp_path / "s1", tmp_path / "stopped"])
    assert read_json(tmp_path / "rest" / "run.json")["status"] == "complete"
    got = sorted(read_results(tmp_path / "rest" / "results.jsonl"), key=_key)
    assert [timing_free(r) for r in got] == [timing_free(r) for r in sorted(read_results(tmp_path / "merged"
                                                                                         / "results.jsonl"), key=_key)]
    # without the second chain's shard the same merge is incomplete, and says which row it lacks first
    merge_runs(tmp_path / "lacking", [tmp_path / "stopped"])
    meta = read_json(tmp_path / "lacking" / "run.json")
    assert meta["status"] == "incomplete" and meta["missing_rows"] == len(want) - len(
        read_results(tmp_path / "stopped" / "results.jsonl"))


def _key(row: dict) -> tuple:
    return row["dataset"], row["method"], row["edits_applied"] or 0, str(row["case_id"])


def _row(dataset: str, case: int, edits: int, es: float, sigma: float) -> dict:
    return {"dataset": dataset, "method": "ultraedit", "group": 0, "case_id": case, "edits_applied": edits,
            "metrics": {"counterfact": {"ES_post": es}, "weights": {"DeltaSigma": sigma}}}


def test_break_points_follow_a_hand_example():
    """Order 0: the batch just written holds ES 3/4 after 4 edits, 1/4 after 8 (below one half: the break), the
    earlier cases re-probed at 8 do not count; σ₁ ratios 0.1, 0.15, 0.9: the largest rise (6x) at 12. Order 1 never
    breaks; its σ₁ rises most at 8."""
    from editscope.run.summary import break_points
    from editscope.run.summary_tables import break_table

    rows = []
    for edits, new_es, sigma in ((4, [1, 1, 0, 1], 0.1), (8, [0, 0, 1, 0], 0.15), (12, [1, 1, 1, 1], 0.9)):
        start = edits - 4
        rows += [_row("cf", start + i, edits, es, sigma) for i, es in enumerate(new_es)]
        rows += [_row("cf", i, edits, 0.0, sigma) for i in range(start)]  # earlier cases, all failing now
    rows += [_row("cf~order1", i, e, 1.0, s) for e, s in ((4, 0.2), (8, 0.8), (12, 1.0)) for i in range(e)]
    got = {p.dataset: p for p in break_points(rows)}
    assert (got["cf"].edits, got["cf"].sigma_jump, got["cf"].last) == (8, 12, 12)
    assert (got["cf~order1"].edits, got["cf~order1"].sigma_jump) == (None, 8)
    table = break_table(list(got.values()))
    assert table.rows == [["cf", "ultraedit", 2, "1 of 2", "8; 8–8", "10; 8–12 [-15, 35]"]]


def test_thread_counts_label_their_chains_and_refuse_bad_input():
    """``threads: [1, 2]``: each order's chain once per thread count, the same cases in the same order, the first
    count's keeping the order's label and the others' labelled ``...~threadsN``; recorded in the canonical form; older
    configs keep their digest."""
    data = orders_data(2)
    data["mode"]["sequential_batches"]["threads"] = [1, 2]
    config = parse_config(data)
    blocks = load_blocks(config)
    assert [b.label for b in blocks] == config.block_labels() == [
        "counterfact", "counterfact~threads2", "counterfact~order1", "counterfact~order1~threads2"]
    assert [b.threads for b in blocks] == [1, 2, 1, 2]
    assert blocks[0].cases == blocks[1].cases and blocks[2].cases == blocks[3].cases != blocks[0].cases
    assert [base_label(b.label) for b in blocks] == [("counterfact", 0)] * 2 + [("counterfact", 1)] * 2
    assert [label_threads(b.label) for b in blocks] == [None, 2, None, 2]
    assert [b.threads for b in load_blocks(parse_config(orders_data(2)))] == [None, None]
    assert config.to_dict()["threads"] == [1, 2] and "threads" not in parse_config(orders_data(2)).to_dict()
    assert parse_config(orders_data(2)).digest() != config.digest()
    for bad, why in (([0], r"threads\[0\]"), ([2, 2], "listed twice"), (2, "a list of torch thread counts")):
        data["mode"]["sequential_batches"]["threads"] = bad
        with pytest.raises(EditscopeError, match=why):
            parse_config(data)


def test_each_chain_runs_under_its_thread_count_with_its_orders_seeds(tiny_bundles, tmp_path, monkeypatch):
    """Every edit of a chain runs under its torch thread count (the process's count restored after);
    the two chains of one order draw the same seeds and probe the same cases, run.json records both counts, and the
    spread across chains counts each chain once."""
    import dataclasses
    import json

    import torch

    from editscope.edit.registry import EDITORS
    from editscope.run.trial import Trial

    data = orders_data(1)
    data["mode"]["sequential_batches"]["threads"] = [1, 2]
    config = parse_config(data)
    seen, seeds = [], []
    editor = EDITORS["ultraedit"]

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return editor.compute(*args, **kwargs)

    real_seed = Trial.edit_seed

    def seed(self, group, *round_):
        seeds.append((self.dataset, real_seed(self, group, *round_)))
        return seeds[-1][1]

    monkeypatch.setitem(EDITORS, "ultraedit", dataclasses.replace(editor, compute=spy))
    monkeypatch.setattr(Trial, "edit_seed", seed)
    before = torch.get_num_threads()
    Runner(config, out_dir=tmp_path / "run", bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    assert torch.get_num_threads() == before
    assert seen == [1, 1, 1, 2, 2, 2]  # 3 rounds per chain, the chains in label order
    chains = ("counterfact", "counterfact~threads2")
    first, second = ([s for d, s in seeds if d == label] for label in chains)
    assert first == second and len(first) == 3
    rows = read_results(tmp_path / "run" / "results.jsonl")
    probed = [sorted((r["case_id"], r["edits_applied"]) for r in rows if r["dataset"] == label) for label in chains]
    assert probed[0] == probed[1] and probed[0]
    assert set(json.loads((tmp_path / "run" / "run.json").read_text())["torch_threads"]) >= {1, 2}
    spread = across_orders(summarize_by_edits(rows))
    assert {p.row.n for p in spread[("counterfact", "counterfact")]} == {2}
    summary = (tmp_path / "run" / "summary.md").read_text()  # named for what it is across, not as edit orders
    assert "## counterfact on counterfact, across 2 chains (edit orders × torch thread counts)" in summary
    from editscope.report.build import build_report

    _html, md = build_report([tmp_path / "run"], tmp_path / "report")
    assert "Across 2 chains (edit orders × torch thread counts):" in md.read_text()
