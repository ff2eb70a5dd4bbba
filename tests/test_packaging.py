"""A non-editable install finds its shipped configs: build the wheel, install it into a fresh venv, run
``editscope edit`` on a tiny model from a folder outside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from editscope.edit.patch import Patch

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from the repository and installed into a fresh venv: (venv folder, its site-packages)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO), "-w",
          str(dist)], cwd=tmp_path)
    (wheel,) = dist.glob("editscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "editscope/configs/hparams/rome/tiny.yaml" in names and "editscope/configs/demo.yaml" in names
    assert "editscope/corpus/wikitext-2-raw_wiki.test.raw.txt.gz" in names and "editscope/corpus/NOTICE" in names
    assert {"editscope/sample/counterfact-edit-sample.json", "editscope/sample/zsre-sample.json",
            "editscope/sample/counterfact-train-sample.json", "editscope/sample/NOTICE",
            "editscope/configs/demo-sample.yaml", "editscope/sample/judge-labels/labels.jsonl",
            "editscope/sample/judge-labels/README.md"} <= set(names)  # judge-agreement's hand labels
    # the HTML pages are templates: without them the report and the cards cannot render
    assert {"editscope/report/templates/report.html", "editscope/report/templates/card.html",
            "editscope/report/templates/_tables.html", "editscope/report/templates/style.css",
            "editscope/report/templates/card.css"} <= set(names)

    # The project venv is itself a venv, so --system-site-packages would expose the base interpreter's
    # packages, not torch & co.: a .pth file adds the project venv's site-packages after the new venv's own
    # (its .pth files, such as the editable install's, are not processed, so the wheel's editscope wins).
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    (site / "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path)
    return venv, site


@pytest.mark.slow
def test_wheel_installs_and_edits_outside_the_repo(tmp_path, installed):
    venv, site = installed
    python = venv / "bin" / "python"
    work = tmp_path / "elsewhere"
    work.mkdir()
    # no data folder at all: the default corpus ROME's key statistics read ships with the package; a fresh cache
    # home makes it build the tokenizer and statistics itself
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(EDITSCOPE_DATA=str(tmp_path / "no-data-here"), EDITSCOPE_HOME=str(tmp_path / "home"))
    where = _run([str(python), "-c", "import editscope, editscope.edit.hparams as h; "
                  "print(editscope.__file__); print(h.config_root())"], cwd=work, env=env).stdout.split()
    assert all(str(site) in line for line in where), where  # the installed copy, not the repository's
    out = _run([str(venv / "bin" / "editscope"), "edit", "--model", "tiny-llama", "--method", "rome",
                "--prompt", "{} is a citizen of", "--subject", "Danielle Darrieux", "--target", " Japan",
                "--target-true", " France", "--json", "--save-patch", "p.safetensors"], cwd=work, env=env)
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["method"] == "rome" and result["post"]["target"] > result["pre"]["target"]
    shipped = yaml.safe_load((REPO / "src/editscope/configs/hparams/rome/tiny.yaml").read_text())
    hparams = Patch.load(work / "p.safetensors").hparams
    assert {k: hparams[k] for k in shipped} == shipped  # it found and used the shipped hparams
    assert str(REPO) not in out.stdout + out.stderr


@pytest.mark.slow
def test_demo_and_card_from_a_pip_install_without_data(tmp_path, installed):
    """A pip user with no data folder: the demo runs on the packaged sample and says so, and the card's collateral
    scan reads the packaged facts (SmolLM2; the session's cache home, so the converted model and statistics are
    shared with the other tests)."""
    venv, _site = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EDITSCOPE_DATA")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    editscope = str(venv / "bin" / "editscope")
    demo = _run([editscope, "demo", "--limit", "1", "--no-progress"], cwd=work, env=env)
    assert "dataset folder not found" in demo.stdout and "packaged sample" in demo.stdout
    rows = [json.loads(line) for line in (work / "runs" / "demo-sample" / "results.jsonl").read_text().splitlines()]
    assert sorted((r["dataset"], r["method"]) for r in rows) == [
        ("counterfact-sample", "alphaedit"), ("counterfact-sample", "memit"),
        ("zsre-sample", "alphaedit"), ("zsre-sample", "memit")]
    assert (work / "runs" / "demo-sample" / "report.html").is_file()

    card = _run([editscope, "inspect", "--method", "rome", "--prompt", "{} is a citizen of", "--subject",
                 "Danielle Darrieux", "--target", "Japan", "--target-true", "France", "--facts", "40",
                 "--generate", "0", "--json", "--no-progress"], cwd=work, env=env)
    assert "packaged sample" in card.stderr
    (page,) = work.glob("card-*.json")
    scan = json.loads(page.read_text())["collateral_scan"]
    assert scan["counted"] > 0  # SmolLM2 knows facts of the packaged pool
    assert str(REPO) not in demo.stdout + card.stdout + card.stderr
