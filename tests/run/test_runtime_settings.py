"""Edit runtime settings (forward strategy, v*/z request batching) are configuration: recorded in run.json, the rows
and the config digest; a resume under other values is refused naming the setting; environment variables only
supply defaults."""

from __future__ import annotations

import dataclasses
import json

import pytest

from editscope.edit.runtime import EditRuntime, RuntimeSettings
from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config, read_results
from tests.run.helpers import SUITES, base_config

METHODS = [{"name": "rome", "overrides": {"v_steps": 2}}]


def _run(bundle, out, **changes):
    cfg = parse_config(base_config(methods=METHODS, slice={"offset": 0, "limit": 2}, **changes), suites=SUITES)
    return Runner(cfg, out_dir=out, bundle=bundle, suite_factories=SUITES, progress=False, log=lambda _m: None).run()


def test_settings_in_force_are_recorded_and_a_changed_one_refuses_the_resume(tiny_bundles, tmp_path, monkeypatch):
    bundle = tiny_bundles["llama"]
    monkeypatch.delenv("EDITSCOPE_FORWARD", raising=False)
    monkeypatch.delenv("EDITSCOPE_VSTAR_BATCH", raising=False)
    _run(bundle, tmp_path / "a", runtime={"forward": "full"})
    meta = json.loads((tmp_path / "a" / "run.json").read_text())
    assert meta["runtime"] == {"forward": "full", "vstar_batch": "auto"}
    assert all(r["runtime"] == meta["runtime"] for r in read_results(tmp_path / "a" / "results.jsonl"))
    assert _run(bundle, tmp_path / "a", runtime={"forward": "full"}).written == 0  # same settings: resumes

    with pytest.raises(EditscopeError, match=r"runtime forward=full, this run has forward=fast"):
        _run(bundle, tmp_path / "a")  # the config no longer says full: the default fast is in force
    monkeypatch.setenv("EDITSCOPE_VSTAR_BATCH", "2")  # an environment default counts the same as the config
    with pytest.raises(EditscopeError, match=r"vstar_batch=auto, this run has vstar_batch=2 .*EDITSCOPE_VSTAR_BATCH"):
        _run(bundle, tmp_path / "a", runtime={"forward": "full"})


def test_digest_changes_with_non_default_settings_only():
    cfg = parse_config(base_config(), suites=SUITES)
    assert cfg.digest({"forward": "fast", "vstar_batch": "auto"}) == cfg.digest()  # older runs keep their digest
    assert cfg.digest({"forward": "plain", "vstar_batch": "auto"}) != cfg.digest()
    assert cfg.digest({"forward": "fast", "vstar_batch": 4}) != cfg.digest()


def test_bad_settings_are_one_line_errors(monkeypatch):
    with pytest.raises(EditscopeError, match=r"key 'runtime.forward': must be one of fast, full, plain"):
        parse_config(base_config(runtime={"forward": "quick"}), where="x.yaml", suites=SUITES)
    with pytest.raises(EditscopeError, match=r"key 'runtime.vstar_batch': must be auto or a positive integer"):
        parse_config(base_config(runtime={"vstar_batch": 0}), where="x.yaml", suites=SUITES)
    with pytest.raises(EditscopeError, match=r"key 'runtime.speed': unknown key"):
        parse_config(base_config(runtime={"speed": 1}), where="x.yaml", suites=SUITES)
    monkeypatch.setenv("EDITSCOPE_FORWARD", "quick")
    with pytest.raises(EditscopeError, match=r"EDITSCOPE_FORWARD: must be one of"):
        EditRuntime.from_settings()
    assert EditRuntime.from_settings({"forward": "full"}).settings.forward == "full"  # the caller's value wins


def test_a_config_parses_its_settings_once_into_frozen_values(monkeypatch):
    monkeypatch.setenv("EDITSCOPE_VSTAR_BATCH", "3")
    cfg = parse_config(base_config(runtime={"forward": "full"}), suites=SUITES)
    settings = cfg.settings
    assert settings == RuntimeSettings(forward="full", vstar_batch=3)  # the config's key, the environment's default
    monkeypatch.setenv("EDITSCOPE_VSTAR_BATCH", "5")
    assert cfg.settings is settings  # parsed once: later reads (runner, worker, plan, card) see the same values
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.forward = "fast"  # type: ignore[misc]
    assert dataclasses.replace(cfg, seed=1).settings.vstar_batch == 5  # another config parses its own
