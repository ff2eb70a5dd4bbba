"""Forwards with a key/value cache use the argument name the installed transformers takes: no deprecation warning
(a FutureWarning on every forward once reached users' terminals), and the cache is really filled and read."""

from __future__ import annotations

import warnings

import torch
from transformers import DynamicCache

from editscope.lm.kv_cache import cache_kwargs


def test_cached_forward_warns_nothing_and_equals_the_full_forward(tiny):
    base = tiny.model.get_submodule(tiny.arch.base)
    ids = torch.tensor([[5, 17, 42, 8, 23, 11]], device=tiny.device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning from the forward fails the test
        full = base(input_ids=ids, use_cache=False).last_hidden_state
        cache = DynamicCache()
        base(input_ids=ids[:, :4], **cache_kwargs(base, cache))
        assert cache.get_seq_length() == 4  # the prefix's keys/values went into our cache object
        tail = base(input_ids=ids[:, 4:], position_ids=torch.tensor([[4, 5]], device=tiny.device),
                    attention_mask=torch.ones(1, 6, dtype=torch.long, device=tiny.device),
                    **cache_kwargs(base, cache)).last_hidden_state
    torch.testing.assert_close(tail, full[:, 4:], rtol=1e-4, atol=1e-5)


def test_no_cache_means_use_cache_false(tiny):
    base = tiny.model.get_submodule(tiny.arch.base)
    kwargs = cache_kwargs(base, None)
    assert kwargs["use_cache"] is False and list(kwargs.values()).count(None) == 1
