"""A plug-in's values taken from an ``editscope tune`` output (``from: OUT/tuned.yaml``): the values come from the
file's ``provenance.plugins`` entry of that plug-in, keys given beside ``from`` override them, a run config resolves
the path against its own folder and stores the complete values, and a bad file is a one-line error naming it."""

from __future__ import annotations

import re

import pytest
import yaml

from editscope.cli import main
from editscope.edit.plugins import PLUGINS, parse_plugin_arg
from editscope.errors import EditscopeError
from editscope.run import load_config


def write_tuned(path, plugins):
    # the shape editscope tune writes: the editor's hparams, then a provenance block listing the plug-ins' values
    path.write_text(yaml.safe_dump({"layers": [1], "v_lr": 0.5, "provenance": {"tool": "editscope tune",
                                                                               "plugins": plugins}}))
    return path


def test_values_come_from_the_tuned_file_and_explicit_keys_win(tmp_path):
    tuned = write_tuned(tmp_path / "tuned.yaml", [{"name": "evk_align", "sigma": 0.05, "lam": 0.03, "n": 2}])
    plugin = PLUGINS["evk_align"].attach({"from": str(tuned)})
    assert (plugin.hparams.sigma, plugin.hparams.lam, plugin.hparams.n) == (0.05, 0.03, 2)
    assert plugin.hparams.k1 == 10  # a key the file does not give keeps its default
    name, values = parse_plugin_arg(f"evk_align:from={tuned},lam=0.3")
    plugin = PLUGINS[name].attach(values)
    assert (plugin.hparams.sigma, plugin.hparams.lam) == (0.05, 0.3)
    assert "from" not in plugin.to_dict()  # rows record the values in force, not where they came from


def test_run_config_resolves_against_its_folder_and_stores_values(tmp_path):
    (tmp_path / "hp").mkdir()
    write_tuned(tmp_path / "hp" / "tuned.yaml", [{"name": "app", "alpha": 0.02, "beta": 0.02, "gamma": 0.1}])
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"model": "tiny-llama", "dataset": "counterfact", "suites": ["counterfact"],
                                      "methods": [{"name": "rome", "plugins": [{"name": "app",
                                                                                "from": "hp/tuned.yaml"}]}]}))
    (plugin,) = load_config(config).methods[0].plugins
    assert (plugin["alpha"], plugin["beta"], plugin["gamma"]) == (0.02, 0.02, 0.1) and "from" not in plugin
    assert plugin["margin"] == 2.0


@pytest.mark.parametrize(("content", "message"), [
    (None, "key 'from': file not found"),
    ([{"name": "app", "alpha": 0.1}], "records no values of plug-in 'evk_align'"),
    ("no provenance", "records no values of plug-in 'evk_align'"),
])
def test_bad_tuned_file_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "tuned.yaml"
    if isinstance(content, list):
        write_tuned(path, content)
    elif content is not None:
        path.write_text("layers: [1]\n")
    with pytest.raises(EditscopeError) as err:
        PLUGINS["evk_align"].attach({"from": str(path)}, "<here>")
    text = str(err.value)
    assert text.startswith("<here>: ") and message in text and "\n" not in text
    if content is not None:
        assert str(path) in text


def test_a_tuned_file_with_a_yaml_error_says_so_in_one_line(tmp_path, capsys):
    # it was read as a file without values ("records no values"), hiding the broken YAML
    path = tmp_path / "tuned.yaml"
    path.write_text("layers: [1]\nprovenance:\n  plugins: [{name: evk_align, lam: 0.1\n")  # an unclosed flow mapping
    with pytest.raises(EditscopeError) as err:
        PLUGINS["evk_align"].attach(parse_plugin_arg(f"evk_align:from={path}")[1], "--plugin")
    assert str(err.value) == (f"--plugin: key 'from': {path}: invalid YAML: line 4, column 1: expected ',' or "
                              "'}', but got '<stream end>' (while parsing a flow mapping)")
    argv = ["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is in", "--subject", "Paris",
            "--target", "Rome", "--plugin", f"evk_align:from={path}"]
    assert main(argv) == 2  # refused before the model is loaded
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"editscope: error: --plugin[0] (evk_align): key 'from': {path}: invalid YAML: line 4, column 1: "
                     "expected ',' or '}', but got '<stream end>' (while parsing a flow mapping)"]
    path.write_bytes(b"provenance: \xff\xfe\n")  # not UTF-8: also one line naming the file
    with pytest.raises(EditscopeError, match=rf"^--plugin: key 'from': {re.escape(str(path))}: not a text \(UTF-8\)"):
        PLUGINS["evk_align"].attach({"from": str(path)}, "--plugin")
