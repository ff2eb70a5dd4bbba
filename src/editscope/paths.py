"""Where editscope keeps its cache, finds the shared datasets (both configurable by environment) and its shipped
configs (package data, so a non-editable install finds them)."""

from __future__ import annotations

import os
from pathlib import Path

from editscope.errors import EditscopeError


def home() -> Path:
    """Cache root: ``$EDITSCOPE_HOME`` or ``~/.cache/editscope``; created on first use."""
    root = Path(os.environ.get("EDITSCOPE_HOME") or Path.home() / ".cache" / "editscope")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _data_candidate() -> Path:
    env = os.environ.get("EDITSCOPE_DATA")
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parents[2]
    path = repo_root.parent / "shared" / "data"
    return path if path.is_dir() else Path.cwd().parent / "shared" / "data"


def missing_data() -> str | None:
    """Why :func:`data_dir` finds no dataset folder (``dataset folder not found: PATH``), or None when it does."""
    path = _data_candidate()
    return None if path.is_dir() else f"dataset folder not found: {path}"


def data_dir() -> Path:
    """The shared datasets: ``$EDITSCOPE_DATA``, else ``../shared/data`` relative to the repository root."""
    if problem := missing_data():
        raise EditscopeError(f"{problem} (set EDITSCOPE_DATA to the folder holding counterfact/, zsre/, peak/, ...; "
                             f"without it, the packaged samples {', '.join(SAMPLES)} work)")
    return _data_candidate()


SAMPLES = ("counterfact-sample", "zsre-sample", "counterfact-train-sample")
"""Registered names of the datasets packaged with editscope (``sample/``; its NOTICE gives sources and licences)."""


def sample_file(name: str) -> Path:
    """A file of the packaged sample datasets (package data, so a pip install has it)."""
    return Path(__file__).resolve().parent / "sample" / name


def data_file(relative: str) -> Path:
    """A file under :func:`data_dir`, with a clear error when it is missing."""
    path = data_dir() / relative
    if not path.exists():
        raise EditscopeError(f"dataset file not found: {path}")
    return path


def configs_dir() -> Path:
    """The shipped configs (``hparams/{method}/{model}.yaml``, ``demo.yaml``, ``experiments/``), inside the package."""
    return Path(__file__).resolve().parent / "configs"


def config_path(name_or_path: str | Path) -> Path:
    """An experiment config file: the path as given when it exists; else, for a relative path, the shipped config
    it names: ``demo``, ``demo.yaml`` and ``configs/demo.yaml`` (the repository path before configs moved into
    the package) all give ``configs_dir() / "demo.yaml"``. A name that matches nothing is returned unchanged
    (the caller reports it missing)."""
    path = Path(name_or_path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    if not parts:
        return path
    shipped = configs_dir().joinpath(*parts)
    if not shipped.suffix:
        shipped = shipped.with_suffix(".yaml")
    return shipped if shipped.is_file() else path
