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


@pytest.mark.slow
def test_wheel_installs_and_edits_outside_the_repo(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO), "-w",
          str(dist)], cwd=tmp_path)
    (wheel,) = dist.glob("editscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "editscope/configs/hparams/rome/tiny-llama.yaml" in names and "editscope/configs/demo.yaml" in names
    assert "editscope/corpus/wikitext-2-raw_wiki.test.raw.txt.gz" in names and "editscope/corpus/NOTICE" in names

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
    shipped = yaml.safe_load((REPO / "src/editscope/configs/hparams/rome/tiny-llama.yaml").read_text())
    hparams = Patch.load(work / "p.safetensors").hparams
    assert {k: hparams[k] for k in shipped} == shipped  # it found and used the shipped hparams
    assert str(REPO) not in out.stdout + out.stderr
