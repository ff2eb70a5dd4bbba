"""hparams YAML validation: unknown keys, wrong types, out-of-range layers, overrides."""

from __future__ import annotations

import pytest

from editscope.edit import get_editor, parse_overrides
from editscope.edit.hparams import config_root, load_yaml
from editscope.edit.rome import RomeHParams
from editscope.errors import EditscopeError


def write(tmp_path, text: str):
    path = tmp_path / "h.yaml"
    path.write_text(text)
    return path


#: the layer counts of the real registry models with shipped files (from their configs)
REAL_DEPTHS = {"smollm2-135m": 30, "gemma3-270m": 18, "qwen2.5-coder-1.5b": 28}


def test_every_shipped_config_validates(tiny_bundles):
    # the paper models' files (GPT-2 XL, GPT-J, Llama-3-8B depths) are checked in test_derived_hparams.py
    files = sorted(p for p in config_root().glob("*/*.yaml") if p.stem not in ("gpt2-xl", "gpt-j-6b", "llama3-8b"))
    assert len(files) >= 6 * 5
    for path in files:
        editor = get_editor(path.parent.name)
        n_layers = REAL_DEPTHS.get(path.stem, tiny_bundles["llama"].n_layers)
        hp = load_yaml(path, editor.hparams_class, None, n_layers)
        # a context editor writes no layer: its hparams hold none
        assert (hp.LAYERLESS and not hp.layers) or (hp.layers and max(hp.layers) < n_layers), path


def test_unknown_key_names_file_and_key(tmp_path):
    path = write(tmp_path, "layers: [1]\nv_lrr: 0.5\n")
    with pytest.raises(EditscopeError, match=r"h\.yaml: key 'v_lrr': unknown"):
        load_yaml(path, RomeHParams)


@pytest.mark.parametrize("text,key", [
    ("layers: 1\n", "layers"),
    ("layers: [1]\nv_steps: 2.5\n", "v_steps"),
    ("layers: [1]\nmom2_adjustment: 'yes'\n", "mom2_adjustment"),
    ("layers: [1]\nv_lr: fast\n", "v_lr"),
])
def test_wrong_type(tmp_path, text, key):
    with pytest.raises(EditscopeError, match=rf"h\.yaml: key '{key}': expected"):
        load_yaml(write(tmp_path, text), RomeHParams)


def test_layer_out_of_range_and_rome_single_layer(tmp_path):
    with pytest.raises(EditscopeError, match=r"h\.yaml: key 'layers': layer 7 out of range 0\.\.3"):
        load_yaml(write(tmp_path, "layers: [7]\n"), RomeHParams, None, 4)
    with pytest.raises(EditscopeError, match="exactly one layer"):
        load_yaml(write(tmp_path, "layers: [1, 2]\n"), RomeHParams)


def test_ints_accepted_for_floats_and_overrides(tmp_path):
    hp = load_yaml(write(tmp_path, "layers: [1]\nv_lr: 1\n"), RomeHParams, parse_overrides(["v_steps=3"]), 4)
    assert hp.v_lr == 1.0 and isinstance(hp.v_lr, float) and hp.v_steps == 3
    with pytest.raises(EditscopeError, match="key 'nope'"):
        load_yaml(write(tmp_path, "layers: [1]\n"), RomeHParams, parse_overrides(["nope=1"]))
    with pytest.raises(EditscopeError, match="key=value"):
        parse_overrides(["v_lr"])


def test_missing_config_lists_available(tiny_bundles):
    with pytest.raises(EditscopeError, match="no hparams for rome on model 'nonexistent'"):
        get_editor("rome").load_hparams("nonexistent")
    with pytest.raises(EditscopeError, match="unknown edit method"):
        get_editor("nope")
