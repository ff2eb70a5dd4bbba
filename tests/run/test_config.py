"""Config validation: every problem names the key; nothing runs before the config, the hparams and every
dataset record are valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from editscope.cli import main
from editscope.errors import DataError, EditscopeError
from editscope.run import Runner, load_config, parse_config
from editscope.run.plan import Single
from tests.run.helpers import SUITES, base_config


def parse(**changes):
    return parse_config(base_config(**changes), where="exp.yaml", suites=SUITES)


def test_valid_config_defaults():
    cfg = parse()
    assert cfg.mode == Single() and cfg.mode.group_size == 1 and cfg.seed == 0
    assert [m.label for m in cfg.methods] == ["rome", "memit"]
    assert cfg.methods[1].overrides == {"v_steps": 2}
    (block,) = cfg.blocks
    assert (block.dataset, block.label, block.offset, block.limit) == ("counterfact", "counterfact", 0, 3)
    assert cfg.to_dict() == type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict()))).to_dict()
    assert parse(mode={"sequential": 4}).mode.label == "sequential:4"
    assert parse(output="elsewhere").digest() == cfg.digest() != parse(seed=1).digest()


@pytest.mark.parametrize(("changes", "message"), [
    ({"colour": 1}, "key 'colour': unknown key"),
    ({"model": 3}, "key 'model': expected a string"),
    ({"methods": "rome"}, "key 'methods': expected a list"),
    ({"methods": []}, "key 'methods': at least one method"),
    ({"methods": [{"name": "romee"}]}, "key 'methods[0].name': unknown edit method 'romee'; available: rome"),
    ({"methods": [{"nme": "rome"}]}, "key 'methods[0].nme': unknown key"),
    ({"methods": ["rome", "rome"]}, "key 'methods': method label 'rome' appears twice"),
    ({"methods": [{"name": "rome", "overrides": [1]}]}, "key 'methods[0].overrides': expected a mapping"),
    ({"methods": [{"name": "rome", "hparams": "no/such.yaml"}]}, "key 'methods[0].hparams': file not found"),
    ({"suites": ["nope"]}, "key 'suites[0].name': unknown suite 'nope'; available: "),
    ({"suites": [{"name": "rewrite_es", "options": 3}]}, "key 'suites[0].options': expected a mapping"),
    ({"suites": []}, "key 'suites': at least one suite"),
    ({"dataset": "nope"}, "key 'dataset': unknown dataset 'nope'"),
    ({"slice": {"limit": "3"}}, "key 'slice.limit': expected an integer"),
    ({"slice": {"stop": 3}}, "key 'slice.stop': unknown key"),
    ({"slice": {"offset": -1}}, "key 'slice.offset': must be >= 0"),
    ({"mode": {"batch": 0}}, "key 'mode.batch': must be >= 1"),
    ({"mode": "parallel"}, "key 'mode': expected 'single'"),
    ({"mode": {"stream": 2}}, "key 'mode.stream': unknown mode"),
    ({"seed": True}, "key 'seed': expected an integer"),
    ({"save_patches": "yes"}, "key 'save_patches': expected true or false"),
    ({"datasets": [{"dataset": "counterfact", "suites": ["rewrite_es"]}]}, "give either 'datasets'"),
])
def test_config_errors_name_the_key(changes, message):
    with pytest.raises(EditscopeError) as err:
        parse(**changes)
    assert str(err.value).startswith("exp.yaml: ")
    assert message in str(err.value)


def test_dataset_blocks():
    data = base_config()
    for key in ("dataset", "slice", "suites"):
        data.pop(key)
    data["datasets"] = [{"dataset": "counterfact", "suites": ["rewrite_es"]},
                        {"dataset": "counterfact", "label": "cf-late", "slice": {"offset": 10},
                         "suites": ["rewrite_es"]}]
    cfg = parse_config(data, suites=SUITES)
    assert [b.label for b in cfg.blocks] == ["counterfact", "cf-late"]
    data["datasets"][1].pop("label")
    with pytest.raises(EditscopeError, match="key 'datasets': dataset label 'counterfact' appears twice"):
        parse_config(data, suites=SUITES)
    data["datasets"][1] = {"dataset": "counterfact", "label": "x", "suites": ["rewrite_es"], "limit": 3}
    with pytest.raises(EditscopeError, match=r"key 'datasets\[1\]\.limit': unknown key"):
        parse_config(data, suites=SUITES)


def test_registered_suites_are_known():
    cfg = parse_config(base_config(suites=["counterfact", {"name": "one_to_n", "options": {"k": 5}}]))
    assert [s.name for s in cfg.blocks[0].suites] == ["counterfact", "one_to_n"]


def test_yaml_file_paths_are_relative_to_it(tmp_path):
    (tmp_path / "hp").mkdir()
    (tmp_path / "hp" / "rome.yaml").write_text("layers: [1]\nv_steps: 2\n")
    (tmp_path / "exp.yaml").write_text("model: tiny-llama\nmethods: [{name: rome, hparams: hp/rome.yaml}]\n"
                                       "dataset: counterfact\nsuites: [counterfact]\n")
    cfg = load_config(tmp_path / "exp.yaml")
    assert cfg.methods[0].hparams == str((tmp_path / "hp" / "rome.yaml").resolve())
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(EditscopeError, match="invalid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_cli_prints_one_line(tmp_path, capsys):
    (tmp_path / "exp.yaml").write_text("model: tiny-llama\nmethods: [romee]\ndataset: counterfact\n"
                                       "suites: [counterfact]\n")
    assert main(["run", str(tmp_path / "exp.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'methods[0].name': unknown edit method 'romee'" in err[0]


def test_bad_hparams_and_bad_records_fail_before_work(tmp_path, tiny_llama):
    cfg = parse(methods=[{"name": "rome", "overrides": {"v_stepz": 1}}])
    out = tmp_path / "out"
    with pytest.raises(EditscopeError, match="v_stepz"):
        Runner(cfg, out_dir=out, bundle=tiny_llama, suite_factories=SUITES, progress=False).run()
    assert not any(p.name != ".editscope.lock" for p in out.glob("*"))  # only the run lock: no work
    records = json.loads((Path(__file__).parents[1] / "fixtures" / "counterfact_rome_sample.json").read_text())
    del records[1]["requested_rewrite"]["subject"]
    bad = tmp_path / "cf.json"
    bad.write_text(json.dumps(records))
    cfg = parse(dataset=str(bad))
    with pytest.raises(DataError, match=r"cf.json:record 1: field"):
        Runner(cfg, out_dir=out, bundle=tiny_llama, suite_factories=SUITES, progress=False).run()
    assert not any(p.name != ".editscope.lock" for p in out.glob("*"))  # only the run lock: no work
