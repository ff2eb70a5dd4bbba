"""Every shipped experiment config (configs/experiments/*.yaml and the demo) validates and names the paper table
it reproduces; the slow test runs each one end to end on one case per dataset block, on tiny-llama instead of
SmolLM2 (the configs' methods, plug-ins, modes, datasets and suite options unchanged; SmolLM2-specific hparams
files replaced by each editor's tiny-llama hparams), so CI stays within minutes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml

from editscope.edit.registry import get_editor
from editscope.paths import configs_dir
from editscope.run import Runner, load_config, parse_config, read_results
from editscope.run.config import NO_EDIT

CONFIGS = sorted((configs_dir() / "experiments").glob("*.yaml")) + [configs_dir() / "demo.yaml",
                                                                     configs_dir() / "demo-sample.yaml"]


def test_the_issue_configs_are_shipped():
    names = {p.stem for p in CONFIGS}
    assert {"lte-seqbatch-table1", "nkl-probing", "one-to-n-editing", "evk-table1", "peak-table3",
            "peak-table4"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_validates_and_names_its_paper(path: Path):
    config = load_config(path)
    head = re.split(r"\nmodels?:", path.read_text())[0]
    assert "paper" in head.lower() or path.stem.startswith("demo")  # the comment names the paper table it reproduces
    if path.parent.name == "experiments":
        assert "smollm2" in head.lower()  # and what replaces the paper's models (the substitutions)
    for spec in config.methods:  # hparams exist and validate for every configured model (no weights needed)
        if spec.name != NO_EDIT:
            for model in config.models or (config.model,):
                get_editor(spec.name).load_hparams(model, spec.hparams, spec.overrides or None)


def tiny(path: Path):
    """The config on tiny-llama: same methods (own hparams files and layer overrides dropped), plug-ins, mode,
    datasets, suites."""
    data = yaml.safe_load(path.read_text())
    data.pop("models", None)  # a models list runs each model as this single-model config does
    data["model"] = "tiny-llama"
    for m in data.get("methods", []):
        if isinstance(m, dict):
            m.pop("hparams", None)
            (m.get("overrides") or {}).pop("layers", None)  # SmolLM2 layer numbers; tiny-llama has 4 layers
    return parse_config(data, where=str(path), base_dir=path.parent)


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_runs_on_one_case(path: Path, tmp_path, tiny_llama):
    config = tiny(path)
    t0 = time.perf_counter()
    result = Runner(config, out_dir=tmp_path, bundle=tiny_llama, limit=1, progress=False, log=lambda _m: None).run()
    rows = read_results(tmp_path / "results.jsonl")
    assert result.total_rows == len(rows) == len(config.blocks) * len(config.methods)
    assert all(any(m for m in r["metrics"].values()) for r in rows)
    print(f"{path.stem}: {time.perf_counter() - t0:.1f} s")
