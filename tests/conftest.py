"""Shared fixtures: tiny random-init models of each family (fast) and the real SmolLM2 (slow tests)."""

from __future__ import annotations

import os

import pytest

# The tests compare with computations on CPU tensors: they run on the CPU also on a GPU machine (the default
# device is auto). Tests of other devices ask for them explicitly.
os.environ.setdefault("EDITSCOPE_DEVICE", "cpu")

TINY_FAMILIES = ["gpt2", "gptj", "llama", "gemma3"]


@pytest.fixture(scope="session")
def tiny_bundles():
    from editscope.lm import load

    return {family: load(f"tiny-{family}") for family in TINY_FAMILIES}


@pytest.fixture(scope="session", params=TINY_FAMILIES)
def tiny(request, tiny_bundles):
    return tiny_bundles[request.param]


@pytest.fixture(scope="session")
def smollm2():
    from editscope.lm import load

    return load("smollm2-135m")
