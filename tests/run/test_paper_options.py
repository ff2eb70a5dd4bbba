"""Options that reproduce single tables of the papers: PEAK's Table 5 "fairer baselines" (paper 003: every correct
answer O ∪ {o*} is an editing target; run on tiny-llama) and paper 004 Table 1's fluency and consistency (GE, RS)
in evk-table1."""

from __future__ import annotations

import numpy as np
import pytest

from editscope.data import load_cases
from editscope.errors import EditscopeError
from editscope.paths import configs_dir
from editscope.run import Runner, load_config, parse_config, read_results
from editscope.run.plan import Sequential
from editscope.suites import get_suite

# PEAK-CF record 0 as published: "{} shares border with", subject Turkey, o* "Central African", positive list below
TURKEY_O = ["Armenian", "Syria", "Hellenic", "Persia", "Iraq", "Greek islands", "Persian", "Iran", "Bulgaria",
            "Azerbaijan", "Bulgarian", "Georgia (country)", "Azerbaijani", "Syrian", "Armenia", "Greece",
            "Syrian Arab Republic", "Greek"]


def test_peak_all_correct_targets_by_hand():
    case = load_cases("peak-cf", limit=1)[0]
    reqs = get_suite("peak", targets="all_correct").edit_requests(case)
    assert [r.target_new for r in reqs] == [*TURKEY_O, "Central African"]  # one request per answer, o* last
    assert {(r.prompt, r.subject, r.target_true) for r in reqs} == {("{} shares border with", "Turkey", "Armenian")}
    assert get_suite("peak").edit_requests(case) == [case.request]  # the default edits o* alone
    # record 43 lists o* ("Spain") in its own positive list: it is edited once, last
    spain = load_cases("peak-cf", offset=43, limit=1)[0]
    assert spain.request.target_new == "Spain" and "Spain" in spain.valid_answers
    got = [r.target_new for r in get_suite("peak", targets="all_correct").edit_requests(spain)]
    assert got == [a for a in spain.valid_answers if a != "Spain"] + ["Spain"]
    with pytest.raises(EditscopeError, match="option targets must be one of new, all_correct"):
        get_suite("peak", targets="all")


def test_runner_edits_every_correct_answer_and_records_it(tmp_path, tiny_llama):
    data = {"model": "tiny-llama", "seed": 0, "output": "unused", "methods": ["ft"], "dataset": "peak-cf",
            "slice": {"offset": 0, "limit": 1}, "suites": [{"name": "peak", "options": {"targets": "all_correct"}}]}
    Runner(parse_config(data), out_dir=tmp_path, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    (row,) = read_results(tmp_path / "results.jsonl")
    assert [r["target_new"] for r in row["requests"]] == [*TURKEY_O, "Central African"]
    assert "every correct answer, O then o* (paper 003 Table 5" in row["protocol"]["peak"]["note"]
    assert {"AFF_hard", "ANF_hard"} <= set(row["metrics"]["peak"])

    def rise(kind: str) -> float:  # mean change of the answers' mean token log-prob on the edit prompt
        pre, post = (row[t]["peak"]["prompts"][0]["candidates"] for t in ("pre", "post"))
        return float(np.mean([b["logprob_sum"] / b["n_tokens"] - a["logprob_sum"] / a["n_tokens"]
                              for a, b in zip(pre, post, strict=True) if a["kind"] == kind]))
    # FT wrote every correct answer: they rose, and by more than the hard false answers (with targets: new, FT on
    # this model lifts O by 6e-4 and the hard answers by 6e-3; here O by 1.4e-2, the hard ones by 3.9e-3)
    assert rise("correct") > 2 * max(rise("hard_false"), 0.0) > 0.0
    with pytest.raises(EditscopeError, match="targets"):
        parse_config({**data, "suites": [{"name": "peak", "options": {"targets": "O"}}]})


def test_peak_table5_config():
    config = load_config(configs_dir() / "experiments" / "peak-table5.yaml")
    (block,) = config.blocks
    (suite,) = block.suites
    assert (block.dataset, suite.name, suite.options) == ("peak-cf", "peak", {"targets": "all_correct"})
    assert [m.name for m in config.methods] == ["ft", "mend", "memit", "rome"]  # Table 5's rows
    assert all(not m.plugins for m in config.methods)  # baselines: no APP


def test_evk_table1_measures_fluency_and_consistency():
    """Paper 004 Table 1's Flu./Consis. columns are paper 002's GE and RS: the counterfact suite of evk-table1
    generates, so it declares and (on tiny-llama, one case) emits both."""
    from editscope.run.suites import make_suite

    config = load_config(configs_dir() / "experiments" / "evk-table1.yaml")
    block = next(b for b in config.blocks if b.dataset == "counterfact")
    spec = next(s for s in block.suites if s.name == "counterfact")
    suite = make_suite(spec.name, spec.options)
    assert {"GE", "RS"} <= {m.name for m in suite.metrics_declared}
    assert "GE: paper convention, RS: TF-IDF cosine" in suite.protocol["note"]


def test_evk_table1_measures_general_ability():
    """Paper 004 Fig. 3 (general ability after the edits): the general suite in both evk-table1 blocks, after each
    group of sequential edits; not in evk-table2 (one edit per row, restored after each)."""
    table1 = load_config(configs_dir() / "experiments" / "evk-table1.yaml")
    assert {b.dataset: "general" in [s.name for s in b.suites] for b in table1.blocks} == {"counterfact": True,
                                                                                         "zsre": True}
    assert table1.mode == Sequential(10) and table1.mode.group_size == 10
    table2 = load_config(configs_dir() / "experiments" / "evk-table2.yaml")
    assert not any(s.name == "general" for b in table2.blocks for s in b.suites)
