"""The EVK objective of ``editscope tune`` (``--dataset counterfact-evk``, for EVK-Align): the harmonic mean of
CounterFact ES and EVK-Bench's EVK_ES and EVK_TS, from the two suites' metrics of the same cases, checked by hand,
and end to end on tiny-llama: each candidate's run measures both suites, a reference run of the editor alone guards
ES, and the choice equals one recomputed from the row files with a naive bootstrap."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from editscope.edit.hparams import read_provenance
from editscope.edit.plugins import PLUGINS
from editscope.run.store import read_results
from editscope.suites.counterfact import METRICS as CF_METRICS
from editscope.suites.evk import EvkSuite
from editscope.tune import Tuner, TuneSettings
from editscope.tune.search import OBJECTIVES, score_rows

EVK = OBJECTIVES["evk"]
SPECS = (*CF_METRICS, *EvkSuite().metrics_declared)


def wilson_low(p: float, n: int, z: float = 1.959963984540054) -> float:
    """The low end of the Wilson score interval (Wilson 1927), written out: z the normal 97.5% quantile."""
    return (p + z * z / (2 * n) - z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)


def merged_rows(es, evk_es, evk_ts):
    """Per case, the counterfact suite's ES_pre/ES_post and the evk suite's post-only cosines, merged."""
    return [{"ES_pre": 0.0, "ES_post": a, "EVK_ES": b, "EVK_TS": c} for a, b, c in zip(es, evk_es, evk_ts, strict=True)]


def test_declaration():
    assert EVK.suites == ("counterfact", "evk") and EVK.suite_label == "counterfact+evk"
    assert [c.label for c in EVK.components] == ["ES", "EVK_ES", "EVK_TS"]
    assert EVK.guard == "ES" and EVK.guard_reference == "editor_alone"
    text = EVK.describe()
    assert "counterfact+evk EVK score" in text and "ES, EVK_ES, EVK_TS" in text and "editor alone" in text
    assert EVK.to_dict()["suites"] == ["counterfact", "evk"]


def test_harmonic_mean_and_guard_by_hand():
    # means: ES 3/4, EVK_ES (.9+.8+.7+.6)/4 = .75, EVK_TS (1+.9+.8+.5)/4 = .8 -> hmean = 3 / (4/3 + 4/3 + 5/4)
    rows = merged_rows([1, 1, 0, 1], [.9, .8, .7, .6], [1, .9, .8, .5])
    ref = merged_rows([1, 1, 1, 1], [.5] * 4, [.5] * 4)
    s = score_rows(rows, EVK, SPECS, reference=ref)
    assert s.score == pytest.approx(3 / (4 / 3 + 4 / 3 + 5 / 4))
    assert s.metrics["EVK_ES"][0] == pytest.approx(.75) and s.metrics["EVK_TS"][0] == pytest.approx(.8)
    # the reference's ES has no spread: the floor is the low end of the Wilson interval of 4/4, 4 / (4 + z^2) = .51
    assert s.guard_ref == 1.0 and s.guard_floor == pytest.approx(wilson_low(1.0, 4)) and s.local
    weaker = score_rows(merged_rows([1, 0, 0, 1], [.95] * 4, [.95] * 4), EVK, SPECS, reference=ref)
    assert not weaker.local and weaker.score == pytest.approx(3 / (2 + 1 / .95 + 1 / .95))


def test_cli_help_names_the_evk_objective(capsys):
    from editscope.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "counterfact-evk" in text and "harmonic mean of ES, EVK_ES and EVK_TS" in text


def test_evk_tune_of_rome_evk_align(tmp_path, tiny_llama):
    out = tmp_path / "evk"
    s = TuneSettings(model="tiny-llama", method="rome", out=str(out), budget_minutes=30,
                     overrides={"layers": [1], "v_lr": 0.5, "v_steps": 4}, plugins=[("evk_align", {"n": 1})],
                     knobs=["evk_align.lam"], grid={"evk_align.lam": (0.03, 3.0)}, dataset="counterfact-evk",
                     first=4, eta=2, max_cases=4)
    result = Tuner(s, bundle=tiny_llama, progress=False, log=lambda m: None).run()
    ((n, scores),) = result.halving.rungs
    assert n == 4 and len(scores) == 2

    def rows(path: Path) -> list[dict]:
        return sorted(read_results(path / "results.jsonl"), key=lambda r: r["index"])

    ref = rows(out / "reference")
    assert len(ref) == 4 and all(set(r["metrics"]) == {"counterfact", "evk"} for r in ref)
    ref_es = np.array([r["metrics"]["counterfact"]["ES_post"] for r in ref])
    floor = (wilson_low(ref_es.mean(), 4) if ref_es.std() == 0 else  # Student t 97.5%, 3 df; sqrt(4) = 2
             ref_es.mean() - 2.3533634348018264 * ref_es.std(ddof=1) / 2)

    def columns(rs: list[dict]) -> np.ndarray:
        return np.array([[r["metrics"]["counterfact"]["ES_post"], r["metrics"]["evk"]["EVK_ES"],
                          r["metrics"]["evk"]["EVK_TS"]] for r in rs])

    def hmean(cols: np.ndarray) -> float:
        means = cols.mean(axis=0)
        return 0.0 if means.min() <= 0 else 3 / float(np.sum(1 / means))

    hand = {}
    for cid, score in scores.items():
        cols = columns(rows(out / "candidates" / cid))
        assert score.score == pytest.approx(hmean(cols))
        assert score.guard_floor == pytest.approx(floor)
        idx = np.random.default_rng(0).integers(0, 4, size=(1000, 4))  # the declared bootstrap seed and count
        lo = float(np.percentile([hmean(cols[i]) for i in idx], 2.5))
        assert score.score_lo == pytest.approx(lo)
        if cols[:, 0].mean() >= floor - 1e-12:
            hand[cid] = (lo, hmean(cols))
    assert hand  # the small λ keeps ROME's efficacy on these cases (seen), so a choice is made
    assert result.chosen.id == max(hand, key=lambda c: hand[c])
    prov = read_provenance(result.yaml_path)
    assert prov["objective"]["suites"] == ["counterfact", "evk"]
    assert prov["validation"]["dataset"] == "counterfact"
    assert set(prov["candidates"][0]["scores"][0]["metrics"]) == {"ES", "EVK_ES", "EVK_TS"}
    # the tuned file feeds the plug-in's values back (from:), equal to the chosen candidate's
    plugin = PLUGINS["evk_align"].attach({"from": str(result.yaml_path)})
    assert plugin.hparams.lam == result.chosen.to_dict()["plugins"]["evk_align"]["lam"] and plugin.hparams.n == 1
    assert math.isfinite(result.reference[4].guard)
