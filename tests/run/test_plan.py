"""The mode union (editscope.run.plan): every shipped config's canonical form (and so its digest) is what the
flat-field config of earlier versions wrote (tests/fixtures/config_dicts.json, saved from that code, with the
configs folder as ``{configs}``); the units of a lifelong group against a hand count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editscope.paths import configs_dir
from editscope.run import load_config, parse_config
from editscope.run.config import RunConfig
from editscope.run.plan import Batch, Lifelong, ProbeOnly, Sequential, Single
from tests.run.helpers import SUITES, base_config

SAVED = json.loads((Path(__file__).parents[1] / "fixtures" / "config_dicts.json").read_text())


@pytest.mark.parametrize("name", sorted(SAVED))
def test_shipped_configs_keep_their_canonical_form(name):
    stem, _, model = name.partition("@")
    config = load_config(configs_dir() / f"{stem}.yaml")
    if model:
        config = config.for_model(model)
    now = json.loads(json.dumps(config.to_dict(), sort_keys=True).replace(str(configs_dir()), "{configs}"))
    assert now == SAVED[name]
    assert RunConfig.from_dict(config.to_dict()) == config  # and it reads back


@pytest.mark.parametrize(("raw", "mode", "label"), [
    ("single", Single(), "single"),
    ({"batch": 4}, Batch(4), "batch:4"),
    ({"sequential": 3}, Sequential(3), "sequential:3"),
    ({"sequential_batches": {"batch": 2, "rounds": 5, "checkpoints": 2}}, Lifelong(2, 5, 2), "sequential_batches:2x5"),
])
def test_modes_parse_into_the_union(raw, mode, label):
    config = parse_config(base_config(mode=raw), where="t", suites=SUITES)
    assert config.mode == mode and config.mode.label == label
    assert RunConfig.from_dict(config.to_dict()).mode == mode


def test_probe_only_groups_sixteen_cases():
    config = parse_config(base_config(methods=["none"]), where="t", suites=SUITES)
    assert config.mode == ProbeOnly(16) and config.mode.label == "probe_only" and not config.mode.edits


def test_steps_cut_a_group_as_each_mode_edits_it():
    members = [10, 11, 12, 13, 14]
    assert Single().steps(members[:1]) == [[10]]
    assert Batch(5).steps(members) == [members]
    assert Sequential(5).steps(members) == [[10], [11], [12], [13], [14]]
    assert Lifelong(2, 3).steps(members) == [[10, 11], [12, 13], [14]]
    assert Sequential(5).chained and Lifelong(2, 3).chained and not Batch(5).chained
    # only a single group edits each case alone from the unedited model (a card replays it; v* windows open)
    assert [m.alone for m in (Single(), Batch(5), Sequential(5), Lifelong(2, 3), ProbeOnly(16))] == \
        [True, False, False, False, False]
    assert Lifelong(2, 3, (1, 2)).chain_schedule == ((1, 2), 2)  # where lm-eval tasks may run: chains alone
    assert all(m.chain_schedule is None for m in (Single(), Batch(5), Sequential(5), ProbeOnly(16)))


def test_lifelong_units_are_the_final_rows_and_each_checkpoints_cases():
    # 3 rounds of 2 cases, checkpoint every round, re-probe up to 10: after round 1 the 2 edited cases are probed,
    # after round 2 the 4; the last round's probe is the final rows (1 request per case)
    mode = Lifelong(2, 3, checkpoints=1, reprobe=10)
    members = [0, 1, 2, 3, 4, 5]
    units = mode.units(members, lambda i: 1, seed=0)
    assert units == [(i, None) for i in members] + [(0, 2), (1, 2)] + [(0, 4), (1, 4), (2, 4), (3, 4)]
    # two requests per case: edits applied count requests
    assert (0, 4) in mode.units(members, lambda i: 2, seed=0)
