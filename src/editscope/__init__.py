"""editscope: edit the factual knowledge of language models and measure everything an edit does."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["edit_and_evaluate"]


def __getattr__(name: str) -> Any:
    # lazy: ``import editscope`` (the CLI's start-up) imports no torch
    if name == "edit_and_evaluate":
        from editscope.evaluate import edit_and_evaluate

        return edit_and_evaluate
    raise AttributeError(f"module 'editscope' has no attribute {name!r}")
