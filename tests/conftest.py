"""Shared fixtures: tiny random-init models of each family (fast) and the real SmolLM2 (slow tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The tests compare with computations on CPU tensors: they run on the CPU also on a GPU machine (the default
# device is auto). Tests of other devices ask for them explicitly.
os.environ.setdefault("EDITSCOPE_DEVICE", "cpu")


def _xdist_threads() -> int | None:
    """Threads for one pytest-xdist worker (``make test`` runs two): the CPUs this process may use shared out
    among the workers, at least one; None outside xdist, or when the user set OMP_NUM_THREADS."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers or "OMP_NUM_THREADS" in os.environ:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(1, int(workers)))


# Each xdist worker computes with its share of the cores (two workers on two cores: one thread each), so the workers
# do not oversubscribe them. Set before torch and numpy start their thread pools; the subprocesses tests start
# inherit it.
_THREADS = _xdist_threads()
if _THREADS is not None:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, str(_THREADS))
    import torch

    torch.set_num_threads(_THREADS)

from editscope.lm.archs import ARCHS  # noqa: E402 -- after the thread settings above

#: the tiny models the family-generic tests (the ``tiny`` fixture) run on: one per architecture family the registry
#: holds (each family has a tiny model of its name, ``editscope.lm.tiny``), so a new family is tested by registering it
TINY_FAMILIES = list(ARCHS)
#: every tiny model in ``tiny_bundles``: the families and the variants family tests need (Llama 3.x rope scaling)
TINY_MODELS = [*TINY_FAMILIES, "llama3"]

#: caches under EDITSCOPE_HOME that are expensive to rebuild and keyed by what they hold (converted models, layer
#: statistics, tokenizers, trained MEND networks): tests share the user's; every other cache is the session's own
SHARED_CACHES = ("models", "gguf", "stats", "tokenizers", "mend")


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """EDITSCOPE_HOME for the test session: a temporary folder, so the caches tests write (the general suite's
    known facts, co-occurrence counts, TF-IDF) go away with it, with links to the user's :data:`SHARED_CACHES`."""
    real = Path(os.environ.get("EDITSCOPE_HOME") or Path.home() / ".cache" / "editscope")
    home = tmp_path_factory.mktemp("editscope-home")
    for name in SHARED_CACHES:
        (real / name).mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(real / name, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDITSCOPE_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def tiny_bundles():
    from editscope.lm import load

    return {name: load(f"tiny-{name}") for name in TINY_MODELS}


@pytest.fixture(scope="session", params=TINY_FAMILIES)
def tiny(request, tiny_bundles):
    return tiny_bundles[request.param]


@pytest.fixture(scope="session")
def smollm2():
    from editscope.lm import load

    return load("smollm2-135m")
