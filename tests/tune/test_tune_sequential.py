"""``editscope tune --sequential``: each candidate edits a rung's validation cases as one chain and is scored after
the last batch, KnownFacts joining the harmonic mean. The chain's rows against the protocol (every final row probed
with all the rung's edits applied), the score against a harmonic mean recomputed from those rows, and the one-line
refusal on a model that knows none of the general suite's facts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from editscope.errors import EditscopeError
from editscope.run.store import read_results
from editscope.tune import Tuner, TuneSettings


def settings(model: str, out: Path) -> TuneSettings:
    # two step sizes; one rung of 4 cases, each candidate's chain edits them in 2 batches of 2
    return TuneSettings(model=model, method="ultraedit", out=str(out), knobs=["lr"], grid={"lr": (1e-4, 1e-3)},
                        first=4, eta=2, max_cases=4, sequential=2)


def chain_rows(out: Path, n: int) -> dict[str, list[dict]]:
    return {d.name: read_results(d / f"chain-{n}" / "results.jsonl") for d in sorted((out / "candidates").iterdir())}


def test_a_model_without_known_facts_is_refused_after_its_chain_ran(tmp_path, tiny_llama):
    out = tmp_path / "tune"
    with pytest.raises(EditscopeError, match=r"KnownFacts, a term of the objective Score\+KnownFacts, is not measured: "
                       "the model answers none"):
        Tuner(settings("tiny-llama", out), bundle=tiny_llama, progress=False, log=lambda m: None).run()
    (rows,) = chain_rows(out, 4).values()  # the first candidate's chain ran before the refusal
    final = [r for r in rows if not r.get("checkpoint")]
    assert sorted(r["index"] for r in final) == [0, 1, 2, 3]
    assert {r["mode"] for r in final} == {"sequential_batches:2x2"} and {r["edits_applied"] for r in final} == {4}


def test_peak_objective_has_no_sequential_form(tmp_path):
    s = settings("tiny-llama", tmp_path)
    s.dataset = "peak-cf"
    with pytest.raises(EditscopeError, match="--sequential with --dataset peak-cf"):
        Tuner(s, progress=False)


@pytest.mark.slow
def test_sequential_tune_on_smollm2_scores_the_whole_chain(tmp_path, smollm2):
    out = tmp_path / "tune"
    tuner = Tuner(settings("smollm2-135m", out), bundle=smollm2, progress=False, log=lambda m: None)
    result = tuner.run()
    assert result.chosen is not None and result.evaluated == 2
    assert (tuner.pre_probes.misses, tuner.pre_probes.hits) == (1, 1)  # the unedited model probed once per rung
    state = json.loads((out / "state.json").read_text())
    (rung,) = state["rungs"]
    for cid, rows in chain_rows(out, 4).items():
        final = [r for r in rows if not r.get("checkpoint")]
        assert {r["edits_applied"] for r in final} == {4} and len(final) == 4
        metric = {name: [r["metrics"][suite][f"{name}_post"] for r in final]
                  for suite, name in (("counterfact", "ES"), ("counterfact", "PS"), ("counterfact", "NS"),
                                      ("general", "KnownFacts"))}
        means = [sum(v) / len(v) for v in metric.values()]
        expected = 0.0 if min(means) == 0 else len(means) / sum(1 / m for m in means)
        assert math.isclose(rung["scores"][cid]["score"], expected, abs_tol=1e-9)
    provenance = yaml.safe_load((out / "tuned.yaml").read_text())["provenance"]
    assert provenance["search"]["editing"] == "sequential: each rung's cases as one chain in batches of 2"
    assert provenance["objective"]["components"] == ["ES", "PS", "NS", "KnownFacts"]
