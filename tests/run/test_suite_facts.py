"""What the summary and the report need of a suite beyond its metric declarations (whether it measures the whole
model, its teacher-forced counterparts, its per-round curves) is recorded in run.json, so a run scored with a
plug-in suite is summarised from its files alone: the summary's interval kind and the wild-minus-teacher-forced
table follow the recorded facts of a suite the registry does not know."""

from __future__ import annotations

import json

import numpy as np
import pytest

from editscope.run.suites import SuiteFacts, declarations_to_json, live_facts, recorded_facts
from editscope.run.summary import summarize
from editscope.run.summary_tables import protocol_gap_table
from editscope.suites import SUITES
from editscope.suites.base import Suite


@pytest.mark.parametrize("name", sorted(SUITES))
def test_every_registered_suites_facts_survive_run_json(name):
    facts = live_facts(name)
    cls = SUITES[name]
    if isinstance(cls, type) and issubclass(cls, Suite):
        assert facts.whole_model == (not cls.chooses_edits) and dict(facts.counterparts) == dict(cls.counterparts)
    entry = declarations_to_json({("d", name): ()}, {name: facts})[0]
    assert recorded_facts({"metrics": [json.loads(json.dumps(entry))]}) == {name: facts}


def rows(own: list[float], es: list[float]) -> list[dict]:
    """A single-mode run's rows: a registered teacher-forced suite and a plug-in suite no registry knows."""
    return [{"dataset": "cf", "case_id": str(i), "method": "rome", "pre": {}, "edits_applied": None,
             "metrics": {"counterfact": {"ES": e}, "plugin_wild": {"Own": o}}}
            for i, (o, e) in enumerate(zip(own, es, strict=True))]


def test_an_unregistered_suite_is_summarised_by_its_recorded_facts():
    meta = {"metrics": [{"dataset": "cf", "suite": "plugin_wild", "metrics": [],
                         "facts": {"whole_model": True, "counterparts": {"counterfact": [["ES", "Own"]]}}}]}
    facts = recorded_facts(meta)
    assert "plugin_wild" not in SUITES and live_facts("plugin_wild") == SuiteFacts()
    same = rows([0.5] * 4, [1.0, 0.0, 1.0, 1.0])
    kind = {r.metric: r.ci for r in summarize(same, facts=facts) if r.suite == "plugin_wild"}
    assert kind == {"Own": "model"}  # one value of the whole model: no interval over cases
    assert {r.metric: r.ci for r in summarize(same) if r.suite == "plugin_wild"} == {"Own": "t"}
    own, es = [0.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0, 1.0]
    table = protocol_gap_table(rows(own, es), facts=facts)
    assert table is not None and protocol_gap_table(rows(own, es)) is None  # the registry knows no counterpart
    (row,) = table.rows
    want = 100 * float(np.mean(np.array(own) - np.array(es)))
    assert row[2] == "counterfact ES" and row[3] == "plugin_wild Own" and row[5] == 5
    assert row[8].startswith(f"{want:+.1f} [")
