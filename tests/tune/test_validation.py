"""Validation records (DESIGN rule 13) when a config's dataset is built from another's records: the lifelong stream
holds CounterFact's edit file, so a stream block reserves the CounterFact records its rows report on; a lifelong
chain that samples its re-probes reports on fewer records than it edits, and the others stay free for validation."""

from __future__ import annotations

import pytest
import yaml

from editscope.data import load_cases
from editscope.errors import EditscopeError
from editscope.run import load_config
from editscope.run.planned import plan_run
from editscope.tune.validation import reserved_positions, validation_slice


def write(tmp_path, name: str, **config) -> object:
    path = tmp_path / f"{name}.yaml"
    data = {"model": "tiny-llama", "seed": 0, "output": "unused", "methods": ["ft"], "suites": ["counterfact"]}
    path.write_text(yaml.safe_dump(data | config))
    return path


def positions(reserved, who: str) -> set[int]:
    return {p for a, b, w in reserved.intervals if who in w for p in range(a, b)}


def test_a_stream_block_reserves_the_counterfact_records_it_reports_on(tmp_path):
    cf = load_cases("counterfact")
    # the stream's first records are CounterFact's edit file in order (no prompt repeats before record 30)
    plain = write(tmp_path, "plain", dataset="counterfact-stream", slice={"offset": 0, "limit": 30})
    assert positions(reserved_positions("counterfact", cf, [plain]), "plain.yaml") == set(range(30))

    sampled = write(tmp_path, "sampled", dataset="counterfact-stream", slice={"offset": 100, "limit": 40},
                    mode={"sequential_batches": {"batch": 10, "rounds": 4, "checkpoints": 2, "reprobe": 5,
                                                 "sampled": True}})
    reported = {key[1] for key in plan_run(load_config(sampled)).rows}
    got = positions(reserved_positions("counterfact", cf, [sampled]), "sampled.yaml")
    assert got == {i for i, c in enumerate(cf) if c.case_id in reported}
    assert len(got) == len(reported) and got < set(range(100, 140))  # edited but never reported on: free


def test_a_dataset_of_another_format_reserves_nothing_and_the_slice_avoids_the_rest(tmp_path):
    cf = load_cases("counterfact")
    zsre = write(tmp_path, "zsre", dataset="zsre", slice={"offset": 0, "limit": 500}, suites=["zsre"])
    head = write(tmp_path, "head", dataset="counterfact", slice={"offset": 0, "limit": 10})
    stream = write(tmp_path, "stream", dataset="counterfact-stream", slice={"offset": 12, "limit": 8})
    reserved = reserved_positions("counterfact", cf, [zsre, head, stream])
    assert positions(reserved, "zsre.yaml") == set()
    assert positions(reserved, "stream.yaml") == set(range(12, 20))
    assert validation_slice("counterfact", 3, [zsre, head, stream])["offset"] == 20  # 10..11 is too short


def test_a_slice_placed_by_hand_counts_the_records_shipped_configs_report_on(tmp_path):
    head = write(tmp_path, "head", dataset="counterfact", slice={"offset": 0, "limit": 10})
    stream = write(tmp_path, "stream", dataset="counterfact-stream", slice={"offset": 12, "limit": 8})
    got = validation_slice("counterfact", 10, [head, stream], offset=5)  # records 5..14
    assert (got["offset"], got["limit"], got["chosen"]) == (5, 10, "by hand (--validation-offset)")
    assert sorted((e["by"], e["records"]) for e in got["overlap"]) == [
        ("head.yaml", 5), ("stream.yaml (counterfact-stream, the records its rows report on)", 3)]
    assert validation_slice("counterfact", 3, [head, stream])["overlap"] == []
    with pytest.raises(EditscopeError, match="records 9995..10004 do not fit"):
        validation_slice("counterfact", 10, [head], offset=9995)
