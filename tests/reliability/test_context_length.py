"""Inputs longer than the model's context: reported at plan time with file, case, field,
length and limit, before any edit; the scoring engine refuses them too (GPT-2 used to crash with an IndexError)."""

from __future__ import annotations

import json

import pytest

from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.paths import data_file
from editscope.run import Runner, parse_config
from tests.run.helpers import SUITES, base_config


@pytest.fixture(scope="module")
def tiny_gpt2():
    return load("tiny-gpt2")  # n_positions = 256


def _dataset(tmp_path, field, words):
    records = json.loads(data_file("counterfact/counterfact-edit-1k.json").read_text())[:3]
    records[1][field] = " ".join(["word"] * words) + " " + records[1][field]
    path = tmp_path / "long.json"
    path.write_text(json.dumps(records))
    return path, records[1]["case_id"]


def test_engine_refuses_input_past_the_context(tiny_gpt2):
    engine = ScoringEngine(tiny_gpt2)
    ok = engine.score([(" ".join(["word"] * 200), " Paris")])[0]
    assert ok.n_tokens == 1
    with pytest.raises(EditscopeError, match=r"is 30\d tokens, more than tiny-gpt2's context of 256"):
        engine.score([(" ".join(["word"] * 300), " Paris")])


@pytest.mark.parametrize("field,named", [("rephrase_prompt", r"paraphrase_prompts\[0\]"),
                                         ("prompt", r"requests\[0\]\.prompt\+answer\[0\]"),
                                         ("locality_prompt", r"neighborhood\[0\]")])
def test_run_reports_a_too_long_record_before_any_edit(tmp_path, tiny_gpt2, field, named):
    path, case_id = _dataset(tmp_path, field, 300)
    cfg = parse_config(base_config(model="tiny-gpt2", dataset=str(path), slice={"offset": 0, "limit": 3},
                                   methods=[{"name": "rome", "overrides": {"v_steps": 2}}]), suites=SUITES)
    runner = Runner(cfg, out_dir=tmp_path / "run", bundle=tiny_gpt2, suite_factories=SUITES, progress=False,
                    log=lambda _m: None)
    with pytest.raises(EditscopeError, match=rf"^{path}: case {case_id}: field {named}: 3\d\d tokens \(prompt \+ "
                                             rf"answer\), more than tiny-gpt2's context of 256 tokens"):
        runner.run()
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_records_within_the_context_pass(tmp_path, tiny_gpt2):
    from editscope.data import load_cases
    from editscope.run.lengths import check_lengths

    path, _ = _dataset(tmp_path, "rephrase_prompt", 200)
    check_lengths(tiny_gpt2, str(path), load_cases(str(path)))
