"""Adding a suite needs no runner, summary or report change: a suite defined here (one class with its declared
metrics and its own figure) runs through the runner on a tiny model, and the summary and report show its
metrics with the declared direction, unit and pairing. A suite that emits an undeclared metric fails, naming it.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from typing import Any

import pytest

from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.metrics.registry import MetricSpec
from editscope.report import build_report
from editscope.run import Runner, parse_config
from editscope.suites.base import Suite, SuiteFigure


class LogpSuite(Suite):
    """log P(target_new | rewrite prompt) before and after, and how far it fell (post-only)."""

    name = "logp_new"
    metrics_declared = (
        MetricSpec("logp_new", "test", "log P(new | prompt)", True, None, "log-prob"),
        MetricSpec("drop", "test", "max(0, pre - post)", False, (0.0, math.inf), "nats", pairing="post_only"),
    )

    def probe_many(self, engine, cases: Sequence[Case]) -> list[dict[str, Any]]:
        scores = engine.score([(c.request.text, c.request.target_new) for c in cases])
        return [{"prompts": [{"prompt": c.request.text, "role": "rewrite", "candidates": [
            {"text": c.request.target_new, "kind": "new", "logprob_sum": s.sum, "n_tokens": s.n_tokens}]}]}
            for c, s in zip(cases, scores, strict=True)]

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        a, b = (p["prompts"][0]["candidates"][0]["logprob_sum"] for p in (pre, post))
        return {"logp_new_pre": a, "logp_new_post": b, "drop": max(0.0, a - b)}

    def figures(self, dataset, rows, methods, *, seed=0) -> list[SuiteFigure]:
        from editscope.plotting import plt, png

        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([r["metrics"][self.name]["logp_new_post"] for r in rows], "o")
        return [SuiteFigure(f"logp-{dataset}", f"log P(new) per row ({dataset})", "one dot per row", png(fig))]


class SloppySuite(LogpSuite):
    name = "sloppy"

    def metrics(self, case, pre, post):
        return {**super().metrics(case, pre, post), "oops": 1.0}


FACTORIES = {"logp_new": LogpSuite, "sloppy": SloppySuite}


def config(suite: str):
    return parse_config({"model": "tiny-llama", "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
                         "dataset": "counterfact", "slice": {"limit": 2}, "suites": [suite]}, suites=FACTORIES)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_llama):
    out = tmp_path_factory.mktemp("newsuite")
    Runner(config("logp_new"), out_dir=out, bundle=tiny_llama, suite_factories=FACTORIES, progress=False,
           log=lambda _m: None).run()
    return out


def test_summary_uses_the_declarations(run_dir):
    rows = list(csv.DictReader((run_dir / "summary.csv").open()))
    assert [r["metric"] for r in rows] == ["logp_new_pre", "logp_new_post", "drop"]
    md = (run_dir / "summary.md").read_text()
    assert "logp_new_post ↑ (log-prob)" in md and "drop ↓ (nats)" in md
    stored = json.loads((run_dir / "run.json").read_text())["metrics"]
    assert stored == [{"dataset": "counterfact", "suite": "logp_new",
                       "metrics": [s.to_dict() for s in LogpSuite.metrics_declared],
                       "facts": {"whole_model": False, "counterparts": {}, "edit_info_curves": {}}}]


def test_report_shows_the_new_suite(run_dir, tmp_path):
    _, md_path = build_report([run_dir], tmp_path / "with", suite_factories=FACTORIES)
    md = md_path.read_text()
    assert "## logp_new on counterfact" in md and "logp_new_post ↑ (log-prob)" in md and "drop ↓ (nats)" in md
    assert "log P(new) per row (counterfact)" in md  # the suite's own figure
    assert (tmp_path / "with" / "figures" / "logp-counterfact.png").is_file()
    # without the suite's code the tables still come from the declarations in run.json (no suite figure)
    _, md_path = build_report([run_dir], tmp_path / "without")
    md = md_path.read_text()
    assert "drop ↓ (nats)" in md and "log P(new) per row" not in md


def test_undeclared_metric_fails_naming_it(tmp_path, tiny_llama):
    with pytest.raises(EditscopeError, match="metric 'oops' is not declared"):
        Runner(config("sloppy"), out_dir=tmp_path, bundle=tiny_llama, suite_factories=FACTORIES, progress=False,
               log=lambda _m: None).run()
