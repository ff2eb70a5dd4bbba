"""The key/value-cache argument of a model's forward, under every transformers 5.x.

transformers 5.24 renamed the forward argument ``past_key_values`` to ``cache`` (the old name warns on every call
and is removed in 5.40); 5.0–5.23 know only ``past_key_values``. The name is read from the module's own forward
signature, once per class, so the code passes whichever the installed version takes.
"""

from __future__ import annotations

import functools
import inspect

from torch import nn


@functools.cache
def _cache_arg(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters  # follows the deprecation wrapper's __wrapped__
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module: nn.Module, cache: object | None) -> dict:
    """Keyword arguments that hand ``cache`` (a transformers ``Cache``, or None for no cache) to ``module``'s
    forward, with ``use_cache`` set to match."""
    return {_cache_arg(type(module)): cache, "use_cache": cache is not None}
