"""Every number that reaches stdout or a JSON file is finite or refused with the reason (editscope.finite): the
helper itself, the results rows (null + reason), the JSONL writer (refused), the CLI printers (refused), simulate's
undefined correlations, and the declared ranges on the Python API paths (run_bench, locate)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.finite import cell, non_finite, nulled, require_finite, strict_dumps, walk, with_reasons
from editscope.jsonl import append_record, read_records
from editscope.ranges import Range
from editscope.run.store import ROW_FIELDS, dumps_row


def _strict_loads(text: str):
    def refuse(token: str):
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_helper_names_every_non_finite_field():
    value = {"a": 1.0, "b": [0.5, math.nan, {"c": -math.inf}], "d": np.float32("inf"), "e": torch.tensor(2.0),
             "f": "nan"}  # a string is text, not a number
    assert list(non_finite(value)) == [("b[1]", value["b"][1]), ("b[2].c", -math.inf), ("d", math.inf)]
    clean, reasons = nulled(value)
    assert clean == {"a": 1.0, "b": [0.5, None, {"c": None}], "d": None, "e": 2.0, "f": "nan"}
    assert reasons == {"b[1]": "nan", "b[2].c": "-inf", "d": "inf"}
    with pytest.raises(EditscopeError, match=r"^out\.json: field b\[1\]: nan is not a finite number; refused"):
        strict_dumps(value, "out.json")
    assert require_finite({"x": [1, 2.5]}, "w") == {"x": [1, 2.5]}
    assert cell(math.nan, ".3f") == "–" and cell(None, ".3f", "undefined") == "undefined" and cell(2, ".1f") == "2.0"


def test_walk_is_the_one_traversal_with_its_paths():
    seen = []

    def leaf(path, item):
        seen.append(path)
        return -item if isinstance(item, float) else item

    value = {"a": (1.0, {"b": 2}), 3: [np.float64(0.5)], "t": torch.tensor([1.5, 2.5])}
    assert walk(value, leaf) == {"a": [-1.0, {"b": 2}], 3: [-0.5], "t": [-1.5, -2.5]}
    assert seen == ["a[0]", "a[1].b", "[3][0]", "t[0]", "t[1]"]  # an int key is a position, as in a list
    assert walk([2.0], leaf, "x") == [-2.0] and seen[-1] == "x[0]"
    assert walk(3.0, leaf) == -3.0 and seen[-1] == ""
    # without ``plain`` a tensor is one leaf; ``join`` spells the path (the editor check's dotted positions)
    names = []
    t = torch.ones(2)
    kept = walk({"v": [t]}, lambda p, x: names.append(p) or x, plain=False, join=lambda p, k: f"{p}.{k}" if p else k)
    assert kept["v"][0] is t and names == ["v.0"]
    assert next(non_finite({"k": [1.0, math.inf]}, "hp"), None) == ("hp.k[1]", math.inf)
    assert next(non_finite({"k": 1}), None) is None
    [(root, bad)] = non_finite(math.nan)
    assert root == "value" and math.isnan(bad)


def test_results_row_records_null_with_the_reason():
    row = {"dataset": "d", "case_id": "1", "method": "rome", "group": 0, "index": 0, "metrics": {"s": {"m": 1.0}},
           "pre": {"s": {"logprob": -math.inf}}, "post": {"s": {"logprob": math.nan, "ok": 0.5}}}
    parsed = _strict_loads(dumps_row(row))
    assert parsed["pre"]["s"]["logprob"] is None and parsed["post"]["s"] == {"logprob": None, "ok": 0.5}
    assert parsed["non_finite"] == {"pre.s.logprob": "-inf", "post.s.logprob": "nan"}
    assert set(ROW_FIELDS) <= set(parsed)
    finite = {**row, "pre": {"s": {"logprob": -1.0}}, "post": {"s": {"logprob": -2.0}}}
    assert "non_finite" not in _strict_loads(dumps_row(finite))  # nothing added when there is nothing to say


def test_jsonl_writer_refuses_nan_naming_file_and_field(tmp_path):
    path = tmp_path / "log.jsonl"
    append_record(path, {"k": 1.0})
    with pytest.raises(EditscopeError, match=rf"^{path}: field scores\[2\]: inf is not a finite number"):
        append_record(path, {"scores": [1.0, 2.0, math.inf]})
    assert read_records(path) == [{"k": 1.0}]  # nothing of the refused record was written


def test_metrics_json_shape_keeps_undefined_values_as_null():
    metrics = {"ks": [1.0], "methods": {"kn": {"rsd": math.nan, "consistency": {"1.0": 0.25}}}}
    out = with_reasons(metrics)
    assert _strict_loads(strict_dumps(out, "metrics.json")) == {
        "ks": [1.0], "methods": {"kn": {"rsd": None, "consistency": {"1.0": 0.25}}},
        "non_finite": {"methods.kn.rsd": "nan"}}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(ks=[math.nan]), r"run_bench: ks\[0\]: must be a number in \[1\.1754944e-38, 100\], got nan"),
    (dict(ks=[5, 150]), r"run_bench: ks\[1\]: must be a number in \[1\.1754944e-38, 100\], got 150"),
    (dict(ks=[]), r"run_bench: ks is empty"),
    (dict(ks=[5], n=0), r"run_bench: n: must be an integer in \[1, 1e7\], got 0"),
    (dict(ks=[5], n=2.5), r"run_bench: n: must be an integer in \[1, 1e7\], got 2\.5"),
    (dict(ks=[5], options={"causal_trace": {"noise": math.inf}}),
     r"run_bench: options\['causal_trace'\]\['noise'\]: must be a number in \[1\.1754944e-38, inf\), got inf"),
])
def test_run_bench_applies_the_declared_ranges_before_any_work(tmp_path, kwargs, needle):
    from editscope.locate.klob_bench import run_bench

    with pytest.raises(EditscopeError, match=f"^{needle}"):
        run_bench(None, tmp_path / "bench", methods=["causal_trace"], **kwargs)  # no engine needed: refused first
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("option,value", [("noise", math.nan), ("samples", 0), ("steps", 10**6), ("window", -1)])
def test_locate_api_applies_the_declared_ranges(tiny_llama, option, value):
    from editscope.lm.engine import ScoringEngine
    from editscope.locate import OPTION_RANGES, locate

    text, kind = OPTION_RANGES[option]
    what = "an integer" if kind is int else "a number"
    with pytest.raises(EditscopeError, match=rf"^locate causal_trace: option {option}: must be {what} in "
                                             rf"{re.escape(str(Range.parse(text)))}, got {value!r}$"):
        locate(ScoringEngine(tiny_llama), "causal_trace", "{} is in", "Paris", None, **{option: value})


def test_simulate_prints_undefined_not_nan():
    from editscope.commands.simulate import format_table
    from editscope.simulate import METRICS

    per = {"criterion1": {m: 0.5 for m in METRICS}, "criterion2": {m: math.nan for m in METRICS}}
    table = format_table({**per, "by_answers": {"1": per}})
    assert "nan" not in table.lower() and "undefined" in table
    assert table.endswith("undefined: a correlation over values that do not vary (e.g. one valid answer)")


def test_score_on_a_model_with_non_finite_weights_is_refused(capsys, tmp_path, tiny_llama):
    import copy

    model = copy.deepcopy(tiny_llama.model)
    with torch.no_grad():
        model.model.norm.weight.fill_(math.nan)  # every logit NaN
    model.save_pretrained(tmp_path / "nan-model")
    tiny_llama.tokenizer.save_pretrained(tmp_path / "nan-model")
    for extra in ([], ["--json"]):
        code = main(["score", "--model", str(tmp_path / "nan-model"), "--prompt", "Paris is in", "--candidates",
                     " France", " Italy", *extra])
        captured = capsys.readouterr()
        assert code == 2 and captured.out == ""
        assert captured.err.strip().splitlines() == [
            "editscope: error: score: field [0].logprob_sum: nan is not a finite number; refused (the model's outputs "
            "or an input are not finite)"]
