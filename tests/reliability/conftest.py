from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_llama(tiny_bundles):
    return tiny_bundles["llama"]
