"""A small real run shared by the report's LaTeX, figure and browser tests: the tiny random-init LLaMA, two
editors, CounterFact cases (enough for intervals) and PEAK / 1-to-N cases (perplexities: a log axis; the PEAK
figure's panels share one y axis)."""

from __future__ import annotations

import pytest

TWO_METHODS = {
    "model": "tiny-llama",
    "methods": [{"name": "rome", "overrides": {"v_steps": 2}}, {"name": "memit", "overrides": {"v_steps": 2}}],
    "datasets": [
        {"dataset": "counterfact", "slice": {"limit": 6}, "suites": ["counterfact"]},
        {"dataset": "peak-cf", "slice": {"limit": 2},
         "suites": ["peak", {"name": "one_to_n", "options": {"edits": "append"}}]},
    ],
}


@pytest.fixture(scope="session")
def two_method_run(tmp_path_factory):
    """(run directory, report directory) of :data:`TWO_METHODS`, the report built once."""
    from editscope.lm import load
    from editscope.report import build_report
    from editscope.run import Runner, parse_config

    out = tmp_path_factory.mktemp("two-methods")
    Runner(parse_config(TWO_METHODS), out_dir=out, bundle=load("tiny-llama"), progress=False,
           log=lambda _m: None).run()
    report = out / "report"
    build_report([out], report)
    return out, report
