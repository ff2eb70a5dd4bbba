"""Declared hparams ranges (Params.RANGES): an absurd value is refused on load, naming the file, key and range."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from editscope.edit import EDITORS, get_editor
from editscope.edit.hparams import Params, Range, config_root, load_yaml
from editscope.edit.plugins import PLUGINS
from editscope.errors import EditscopeError
from editscope.ranges import FLOAT32_TINY


def _yaml(tmp_path, method: str, text: str):
    path = tmp_path / f"{method}.yaml"
    path.write_text(text)
    return path


# one case per class of absurd value: (method, YAML, key, the range the message must name)
ABSURD = [
    ("rome", "layers: [1]\nv_lr: 1e38\n", "v_lr", "[1.1754944e-38, 10]"),  # a learning rate that overflows inside Adam
    ("rome", "layers: [1]\nv_lr: 0\n", "v_lr", "[1.1754944e-38, 10]"),
    ("memit", "layers: [1]\nv_steps: 1000000000000\n", "v_steps", "[1, 10000]"),  # runs for hours
    ("ft", "layers: [1]\nsteps: 0\n", "steps", "[1, 10000]"),
    ("ft", "layers: [1]\nlr: 100.0\n", "lr", "[1.1754944e-38, 10]"),
    # a threshold that edits nothing
    ("alphaedit", "layers: [1]\nnullspace_threshold: -1\n", "nullspace_threshold", "[1.1754944e-38, inf)"),
    ("alphaedit", "layers: [1]\nL2: 0\n", "L2", "[1.1754944e-38, 1e12]"),
    ("memit", "layers: [1]\nmom2_update_weight: -5\n", "mom2_update_weight", "[0, 1e12]"),
    ("rome", "layers: [1]\nclamp_norm_factor: 0\n", "clamp_norm_factor", "[1.1754944e-38, 1e6]"),  # norm / factor > 0
    ("rome", "layers: [1]\nkl_factor: -0.5\n", "kl_factor", "[0, 1e6]"),  # a loss weight below 0
    ("rome", "layers: [1]\nstop_loss: -1\n", "stop_loss", "[0, 1e6]"),
    ("rect", "layers: [1]\nrect_share: 1.5\n", "rect_share", "[1.1754944e-38, 1]"),  # a share above 1
    ("kn", "layers: [1]\nshare: -0.1\n", "share", "[0, 1)"),
    ("kn", "layers: [1]\nadaptive_threshold: 2\n", "adaptive_threshold", "[0, 1]"),
    ("mend", "layers: [1]\nedit_lr: 1e20\n", "edit_lr", "[1.1754944e-38, 10]"),
    ("mend", "layers: [1]\nrank: 0\n", "rank", "[1, 100000]"),
    ("evk_edit", "layers: [1]\nevk_n: 100000\n", "n", "[1, 1000]"),  # checked through its EVK-Align settings
]


@pytest.mark.parametrize(("method", "text", "key", "rng"), ABSURD, ids=[f"{c[0]}-{c[2]}" for c in ABSURD])
def test_absurd_value_is_refused_naming_file_key_and_range(tmp_path, method, text, key, rng):
    path = _yaml(tmp_path, method, text)
    with pytest.raises(EditscopeError, match=rf"key '{key}': must be in {re.escape(rng)}, got ") as err:
        load_yaml(path, get_editor(method).hparams_class)
    assert "\n" not in str(err.value)
    if method != "evk_edit":  # evk_* keys are validated as EVK-Align's, under their own label
        assert str(err.value).startswith(f"{path}: key '{key}'")


def test_an_override_out_of_range_names_the_override(tmp_path):
    path = _yaml(tmp_path, "rome", "layers: [1]\n")
    with pytest.raises(EditscopeError, match=r"^--set v_lr=1\.0e\+38 \(over .*rome\.yaml\): key 'v_lr': must be in "
                                             r"\[1\.1754944e-38, 10\], got 1e\+38$"):
        load_yaml(path, get_editor("rome").hparams_class, {"v_lr": 1e38})


def test_plugin_values_out_of_range_are_refused():
    with pytest.raises(EditscopeError, match=r"key 'max_share_below': must be in \[0, 1\], got 2"):
        PLUGINS["app"].attach({"max_share_below": 2.0})
    with pytest.raises(EditscopeError, match=r"key 'n': must be in \[1, 1000\], got 5000"):
        PLUGINS["evk_align"].attach({"n": 5000})
    with pytest.raises(EditscopeError, match="key 'alpha': must be a finite number >= 0"):  # the older message stays
        PLUGINS["app"].attach({"alpha": -1.0})


def test_bounds_are_inclusive_or_exclusive_as_written(tmp_path):
    cls = get_editor("rome").hparams_class
    assert load_yaml(_yaml(tmp_path, "rome", "layers: [1]\nv_lr: 10\nv_steps: 10000\n"), cls).v_lr == 10.0
    assert load_yaml(_yaml(tmp_path, "rome", "layers: [1]\nv_steps: 1\nstop_loss: 0\n"), cls).v_steps == 1
    rng = Range.parse("(0, 1]")
    assert 1 in rng and 0.5 in rng and 0 not in rng and 1.0001 not in rng
    assert 1e300 in Range.parse("[0, inf)") and -1e-9 not in Range.parse("[0, inf)")
    with pytest.raises(ValueError, match="range"):
        Range.parse("0..1")
    with pytest.raises(ValueError, match="lower bound above"):
        Range.parse("[2, 1]")


def _param_classes() -> list[type[Params]]:
    return [e.hparams_class for e in EDITORS.values()] + [p.hparams_class for p in PLUGINS.values()]


def test_every_declared_range_names_a_field_and_every_default_lies_in_it():
    classes = _param_classes()
    assert len(classes) >= 10
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}
        ranges = cls.ranges()
        assert set(ranges) <= names, (cls, set(ranges) - names)
        cls().check(f"<{cls.__name__} defaults>")  # the defaults are in range


def test_learning_rates_and_step_counts_are_bounded_everywhere():
    # every editor that optimises declares its rate and step count: none is left unbounded
    for cls in _param_classes():
        for name in (f.name for f in dataclasses.fields(cls)):
            if name in ("v_lr", "lr", "edit_lr", "lr_lr"):
                assert str(cls.ranges()[name]) == "[1.1754944e-38, 10]", (cls, name)
            if name in ("v_steps",) or (name == "steps" and cls.owner() in ("ft", "kn")):
                assert str(cls.ranges()[name]) == "[1, 10000]", (cls, name)


def test_every_shipped_config_lies_in_the_ranges():
    files = sorted(config_root().glob("*/*.yaml"))
    assert len(files) >= 40
    for path in files:
        load_yaml(path, get_editor(path.parent.name).hparams_class)  # no depth: the ranges and the other checks


@pytest.mark.parametrize("raw", ["1e-320", "1e-39", "5e-45"])
def test_a_positive_knob_too_small_to_change_a_float32_weight_is_refused(tmp_path, raw):
    # FT's L-inf bound at a denormal was accepted and the edit changed nothing: a float32 weight cannot move by it
    path = _yaml(tmp_path, "ft", f"layers: [1]\nnorm_constraint: {raw}\n")
    with pytest.raises(EditscopeError) as err:
        load_yaml(path, get_editor("ft").hparams_class)
    assert str(err.value) == (f"{path}: key 'norm_constraint': must be in [1.1754944e-38, inf), got {float(raw)} "
                              "(below the smallest normal float32 a value cannot change a float32 weight)")
    assert torch.tensor(float(raw), dtype=torch.float32).abs() < torch.finfo(torch.float32).tiny  # why: a denormal


def test_the_positive_bound_is_the_smallest_normal_float32(tmp_path):
    tiny = torch.finfo(torch.float32).tiny
    assert tiny <= FLOAT32_TINY and torch.tensor(FLOAT32_TINY, dtype=torch.float32).item() == tiny
    rng = Range.parse("(0, inf)")
    assert (rng.lo, rng.lo_open, str(rng)) == (FLOAT32_TINY, False, "[1.1754944e-38, inf)")
    assert FLOAT32_TINY in rng and 1e-38 not in rng and 0 not in rng and Range.parse(str(rng)) == rng
    assert str(Range.parse("[0, 1e6]")) == "[0, 1e6]" and 1e-320 in Range.parse("[0, 1e6]")  # 0 means "off": kept
    assert str(Range.parse("[1e-40, 1]")) == "[1.1754944e-38, 1]"
    with pytest.raises(ValueError, match="smallest normal float32"):
        Range.parse("(0, 1e-39]")
    # the bound moves a float32 weight at 0: the smallest knob the ranges accept still changes something
    w0 = torch.zeros(3)
    assert torch.clamp(w0 + 1.0, w0 - FLOAT32_TINY, w0 + FLOAT32_TINY).ne(w0).all()
    # at the bound FT loads; every declared positive knob shows the bound, none still reads "(0,"
    cls = get_editor("ft").hparams_class
    hp = load_yaml(_yaml(tmp_path, "ft", "layers: [1]\nnorm_constraint: 1.1754944e-38\n"), cls)
    assert hp.norm_constraint == FLOAT32_TINY
    texts = [str(r) for c in _param_classes() for r in c.ranges().values()]
    assert not [t for t in texts if t.startswith("(0,")] and sum(t.startswith("[1.1754944e-38,") for t in texts) >= 8
