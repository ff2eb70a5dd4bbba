"""The pure parts of ``editscope tune`` against hand computations: successive halving on a score table, the
choice by the lower CI bound behind the locality guard, rung sizes, the objective from rows, candidate layers,
the validation slice and the declared knobs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from editscope.edit.hparams import TUNE_LAYERS, Params
from editscope.errors import EditscopeError
from editscope.metrics.intervals import mean_ci, wilson_interval
from editscope.suites.counterfact import METRICS as CF_METRICS
from editscope.suites.general import METRICS as GENERAL_METRICS
from editscope.tune.search import (
    OBJECTIVES,
    CandidateScore,
    StopSearch,
    Unmeasured,
    reference_ci,
    rung_sizes,
    score_rows,
    select,
    sequential_objective,
    successive_halving,
    survivors,
)
from editscope.tune.space import candidates, knob_grids, layer_candidates, parse_grid
from editscope.tune.validation import Reserved, free_start


def cs(score: float, lo: float, hi: float, ns: float = 0.8, ns_pre: float = 0.8, half: float = 0.05,
       n: int = 8) -> CandidateScore:
    """A candidate's objective: Score with its CI, NS, and the unedited NS with a CI of half-width ``half``."""
    return CandidateScore(n, score, lo, hi, ns, ns - 0.1, ns + 0.1, ns_pre, ns_pre - half, ns_pre + half)


def test_successive_halving_keeps_the_right_candidates():
    # score table: candidate -> {cases: (mean, lower bound)}; by hand, eta = 2:
    #   rung 8:  lower bounds a .50 b .60 c .20 d .55 e .10 f .40 -> keep ceil(6/2) = 3: b, d, a
    #   rung 16: b .52 d .58 a .30                                -> keep ceil(3/2) = 2: b, d
    #   rung 32: b .61 d .57                                      -> chosen: b
    table = {"a": {8: (.7, .50), 16: (.6, .30)}, "b": {8: (.8, .60), 16: (.7, .52), 32: (.7, .61)},
             "c": {8: (.9, .20)}, "d": {8: (.7, .55), 16: (.7, .58), 32: (.7, .57)}, "e": {8: (.3, .10)},
             "f": {8: (.5, .40)}}
    calls = []

    def evaluate(cid: str, n: int) -> CandidateScore:
        calls.append((cid, n))
        mean, lo = table[cid][n]
        return cs(mean, lo, mean + 0.1)

    result = successive_halving(list(table), [8, 16, 32], 2, evaluate)
    assert [sorted(scores) for _, scores in result.rungs] == [list("abcdef"), ["a", "b", "d"], ["b", "d"]]
    assert calls == [(c, 8) for c in "abcdef"] + [("a", 16), ("b", 16), ("d", 16), ("b", 32), ("d", 32)]
    assert result.complete and select(result.rungs[-1][1]) == "b"
    # c has the best mean of the first rung but the widest interval: it is dropped at once


def test_stop_search_keeps_the_finished_rungs():
    def evaluate(cid: str, n: int, stop_at: int | None = None) -> CandidateScore:
        if n == stop_at:
            raise StopSearch
        return cs(0.5, 0.4 if cid == "a" else 0.3, 0.6)

    result = successive_halving(["a", "b", "c"], [8, 16], 3, lambda c, n: evaluate(c, n, stop_at=16))
    assert not result.complete and [n for n, _ in result.rungs] == [8]
    # with eta 3, one candidate survives rung 1: a (lower bound .4)
    result = successive_halving(["a", "b", "c"], [8, 16], 3, evaluate)
    assert result.complete and list(result.rungs[1][1]) == ["a"]


def test_select_by_lower_bound_not_mean():
    scores = {"wide": cs(0.90, 0.55, 1.00), "tight": cs(0.80, 0.70, 0.88), "low": cs(0.60, 0.50, 0.70)}
    assert select(scores) == "tight"  # the best mean (0.90) loses to the tighter interval (lower bound .70 > .55)


def test_select_refuses_a_candidate_that_breaks_locality():
    # unedited NS .80 with CI half-width .05: the floor is .75; "greedy" has NS .70 < .75 -> refused
    scores = {"greedy": cs(0.95, 0.90, 0.99, ns=0.70), "careful": cs(0.80, 0.70, 0.88, ns=0.76)}
    assert not scores["greedy"].local and scores["careful"].local
    assert math.isclose(scores["greedy"].guard_floor, 0.75)
    assert select(scores) == "careful"
    assert survivors(scores, 1) == ["careful"]  # halving ranks a non-local candidate last too
    assert select({"greedy": scores["greedy"]}) is None  # nothing passes: no choice


def test_rung_sizes():
    assert rung_sizes(8, 3, 4, 24) == [8, 24]  # 4 -> 2 candidates on 24 cases
    assert rung_sizes(8, 3, 40, 200) == [8, 24, 72, 200]  # 40 -> 14 -> 5 -> 2
    assert rung_sizes(8, 2, 1, 8) == [8]
    assert rung_sizes(10, 3, 9, 50) == [10, 30]  # 9 -> 3 -> 1


def test_score_rows_against_hand_computation():
    # four cases: ES 1,1,0,1 (.75), PS .5,1,.5,1 (.75), NS 1,0,1,1 (.75) -> Score = hmean = .75
    es, ps, ns, ns_pre = [1, 1, 0, 1], [.5, 1, .5, 1], [1, 0, 1, 1], [1, 1, 1, 0]
    rows = [{"ES_post": a, "PS_post": b, "NS_post": c, "NS_pre": d, "ES_pre": 0.0}
            for a, b, c, d in zip(es, ps, ns, ns_pre, strict=True)]
    s = score_rows(rows, OBJECTIVES["counterfact"], CF_METRICS)
    assert s.n == 4 and math.isclose(s.score, 0.75)
    assert s.score_lo <= 0.75 <= s.score_hi
    m, lo, hi, _ = mean_ci(ns_pre)
    assert (s.guard_ref, s.guard_ref_lo, s.guard_ref_hi) == pytest.approx((m, lo, hi))
    assert math.isclose(s.guard_floor, m - (hi - lo) / 2)
    assert s.local  # NS .75 = the unedited .75


def test_sequential_objective_adds_known_facts_to_the_harmonic_mean():
    # ES .75, PS .5, NS .75 over four cases; KnownFacts .25 on the model after the chain (the same on every row)
    es, ps, ns = [1, 1, 0, 1], [.5, 1, 0, .5], [1, 0, 1, 1]
    rows = [{"ES_post": a, "PS_post": b, "NS_post": c, "NS_pre": 1.0, "KnownFacts_post": 0.25, "KnownFacts_pre": 1.0}
            for a, b, c in zip(es, ps, ns, strict=True)]
    objective = sequential_objective(OBJECTIVES["counterfact"])
    assert objective.suites == ("counterfact", "general")
    s = score_rows(rows, objective, CF_METRICS + GENERAL_METRICS)
    assert math.isclose(s.score, 4 / (1 / .75 + 1 / .5 + 1 / .75 + 1 / .25))  # 0.4615...
    assert s.metrics["KnownFacts"][0] == .25
    # the same rows without the term: the single-edit objective's Score
    assert math.isclose(score_rows(rows, OBJECTIVES["counterfact"], CF_METRICS).score, 3 / (1 / .75 + 1 / .5 + 1 / .75))
    with pytest.raises(ValueError, match="editor alone"):
        sequential_objective(OBJECTIVES["peak"])
    # a model that answers none of the known facts has no KnownFacts on any row: no score, one reason
    unknown = [{k: v for k, v in r.items() if not k.startswith("KnownFacts")} for r in rows]
    with pytest.raises(Unmeasured, match="KnownFacts, a term of the objective Score\\+KnownFacts, is not measured"):
        score_rows(unknown, objective, CF_METRICS + GENERAL_METRICS)
    partly = [dict(r, KnownFacts_post=None) if i else r for i, r in enumerate(rows)]  # measured on some rows
    assert math.isclose(score_rows(partly, objective, CF_METRICS + GENERAL_METRICS).metrics["KnownFacts"][0], .25)


def test_layer_candidates_skip_layer_0_and_add_the_published_depth():
    curve = [0.9, 0.1, 0.3, 0.2, 0.05, 0.0, 0.0, 0.0]  # layer 0's artefact is the largest; past it: layer 2
    layers, why = layer_candidates("rome", "llama", 8, curve, [3], neighbourhood=0)
    # published: Llama-3-8B's layer 5 of 32 -> floor(5 * 8 / 32) = 1; the base file's layer 3
    assert why["peak_past_layer_0"] == 2 and why["published"] == [1]
    assert layers == [[1], [2], [3]]
    layers, _ = layer_candidates("rome", "llama", 8, curve, [3], neighbourhood=1)
    assert layers == [[0], [1], [2], [3], [4]]
    # a window method keeps the width and clips at the model's end
    layers, _ = layer_candidates("memit", "llama", 8, None, [5, 6, 7], neighbourhood=1)
    assert all(len(w) == 3 and w[-1] <= 7 for w in layers) and [5, 6, 7] in layers


def test_grids_and_candidates():
    tunable = {"layers": TUNE_LAYERS, "v_lr": (0.1, 0.5), "kl_factor": (0.0625,)}
    grids = knob_grids(tunable, {"app": {"alpha": (0.02, 0.2)}}, knobs=["layers", "v_lr", "app.alpha"],
                       grid=parse_grid(["v_lr=0.2,0.4,0.8"]), layers=[[3], [4]], tune_editor=False)
    assert grids == {"layers": ([3], [4]), "v_lr": (0.2, 0.4, 0.8), "app.alpha": (0.02, 0.2)}
    cands = candidates(grids)
    assert len(cands) == 12 and len({c.id for c in cands}) == 12
    assert cands[0].to_dict() == {"hparams": {"layers": [3], "v_lr": 0.2}, "plugins": {"app": {"alpha": 0.02}}}
    # with a plug-in attached and no --knobs, only the plug-in's knobs are searched
    only = knob_grids(tunable, {"app": {"alpha": (0.02, 0.2)}}, knobs=None, grid={}, layers=None, tune_editor=False)
    assert only == {"app.alpha": (0.02, 0.2)}
    with pytest.raises(EditscopeError, match="'nope' is not a declared knob"):
        knob_grids(tunable, {}, knobs=["nope"], grid={}, layers=None, tune_editor=True)
    assert parse_grid(["layers=[3];[4,5]"]) == {"layers": ([3], [4, 5])}


def test_free_start_skips_reserved_positions():
    reserved = Reserved("cf", ((0, 50, "a"), (0, 1000, "b"), (900, 925, "c"), (7000, 10000, "pool")))
    assert free_start(reserved, 10000, 24) == 1000
    tight = Reserved("cf", ((0, 10, "a"), (14, 20, "b")))
    assert free_start(tight, 30, 4) == 10  # the gap 10..13 holds exactly 4
    assert free_start(tight, 30, 5) == 20
    with pytest.raises(EditscopeError, match="no 20 consecutive records"):
        free_start(tight, 30, 20)


def test_tunable_declarations_are_checked_at_import():
    with pytest.raises(ValueError, match="outside the range"):
        class Bad(Params):  # noqa: F841
            RANGES = {"x": "(0, 1]"}
            TUNABLE = {"x": (0.5, 2.0)}
    import dataclasses

    from editscope.edit.plugins import PLUGINS
    from editscope.edit.registry import EDITORS

    classes = [c for c in [e.hparams_class for e in EDITORS.values()] + [s.hparams_class for s in PLUGINS.values()]
               if c.__module__.startswith("editscope.")]  # shipped ones (tests register plug-ins of their own)
    for cls in classes:  # every shipped editor and plug-in declares knobs
        assert cls.tunable(), cls
        assert set(cls.tunable()) <= {f.name for f in dataclasses.fields(cls)}, cls
    assert np.all([v in EDITORS["kn"].hparams_class.ranges()["lambda_new"]
                   for v in EDITORS["kn"].hparams_class.tunable()["lambda_new"]])
    # MEND's training lengths are snapshots of one training run: multiples of the shipped checkpoint interval
    import yaml

    from editscope.edit.hparams import shipped_hparams_path

    every = yaml.safe_load(shipped_hparams_path("mend", "smollm2-135m").read_text())["checkpoint_every"]
    assert all(n % every == 0 for n in EDITORS["mend"].hparams_class.tunable()["steps"])


def test_a_share_with_no_spread_keeps_a_width_by_wilson():
    # unedited NS 1 on all 6 cases: t's interval has no width; Wilson's low end for 6/6 is 6 / (6 + z^2) = .6097,
    # so one neighbour lost (5/6 = .833) passes and three lost (.5) do not; a non-share metric keeps t's (no width)
    z = 1.959963984540054
    rows = [{"ES_post": 1.0, "PS_post": 1.0, "NS_post": ns, "NS_pre": 1.0} for ns in [1, 1, 1, 1, 1, 0]]
    s = score_rows(rows, OBJECTIVES["counterfact"], CF_METRICS)
    assert s.guard_floor == pytest.approx(6 / (6 + z * z)) and s.local
    rows = [dict(r, NS_post=ns) for r, ns in zip(rows, [1, 1, 1, 0, 0, 0], strict=True)]
    assert not score_rows(rows, OBJECTIVES["counterfact"], CF_METRICS).local
    assert reference_ci(np.full(6, 1.0), share=False) == (1.0, 1.0, 1.0)  # not declared a share: t's, no width
    lo, hi = wilson_interval(0.5, 10)  # a textbook value: 5/10 -> [0.2366, 0.7634]
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_reported_intervals_stay_inside_a_share():
    # PS 1 on 7 of 8 cases: t's interval is .875 ± 2.3646 * .35355 / sqrt(8) = [.579, 1.171], shown cut at 1
    rows = [{"ES_post": 1.0, "PS_post": ps, "NS_post": 1.0, "NS_pre": 1.0} for ps in [1] * 7 + [0]]
    m, lo, hi = score_rows(rows, OBJECTIVES["counterfact"], CF_METRICS).metrics["PS"]
    assert m == pytest.approx(.875) and lo == pytest.approx(.875 - 2.3646243 * math.sqrt(1 / 8) / math.sqrt(8))
    assert hi == 1.0


def test_counterfact_and_zsre_objectives_are_the_suites_declared_scores():
    """The paper Scores (paper 002's S for CounterFact; the harmonic mean of eqs 21-23 for zsRE) come from the
    suites' own declarations, so the tune objective and the summary's Score cannot drift apart."""
    from editscope.suites import get_suite

    hand = {"counterfact": (("ES", "PS", "NS"), "NS"), "zsre": (("Efficacy", "Paraphrase", "Specificity"),
                                                                 "Specificity")}
    for suite, (components, guard) in hand.items():
        objective = OBJECTIVES[suite]
        assert tuple(c.label for c in objective.components) == components and objective.guard == guard
        declared = next(m for m in get_suite(suite).metrics_declared if m.name == "Score")
        assert declared.aggregate.of == components and not any(c.complement for c in objective.components)
