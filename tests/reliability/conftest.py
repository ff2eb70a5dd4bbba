from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama(tiny_bundles):
    return tiny_bundles["llama"]


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, tiny_llama):
    """A finished one-case tiny-llama ROME run (results.jsonl, run.json, summaries), to read, never to write."""
    import json

    from editscope.paths import data_file
    from editscope.run import Runner, load_config

    tmp = tmp_path_factory.mktemp("run")
    records = json.loads(data_file("counterfact/counterfact-edit-1k.json").read_text())[:1]
    (tmp / "data.json").write_text(json.dumps(records))
    config = {"model": "tiny-llama", "output": str(tmp / "out"), "methods": [{"name": "rome", "overrides":
              {"v_steps": 2}}], "dataset": str(tmp / "data.json"), "slice": {"limit": 1}, "suites": ["counterfact"]}
    (tmp / "cfg.yaml").write_text(json.dumps(config))  # JSON is YAML
    Runner(load_config(str(tmp / "cfg.yaml")), bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    return tmp / "out"
