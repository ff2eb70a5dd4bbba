from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama():
    from editscope.lm import load

    return load("tiny-llama")
