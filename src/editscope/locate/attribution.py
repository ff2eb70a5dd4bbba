"""Neuron attribution methods over the MLP key activations k (input of each block's down projection).

All score the probability f = P(answer's first token | prompt) at the last prompt position, and read the keys
at that position (the position that predicts the answer: Dai et al.'s [MASK] position for a causal LM).

- :func:`knowledge_neurons`: integrated gradients (Dai et al. 2022, "Knowledge Neurons", eq. 2-3), per layer:
  Attr(k_i) = k_i ∫₀¹ ∂f(α k)/∂k_i dα with the layer's keys scaled by α and a zero baseline, approximated by
  the Riemann sum (k_i/m) Σ_{j=1..m} ∂f((j/m) k)/∂k_i (Dai's rule, ``rule="right"``; ``"midpoint"`` uses
  α = (j - ½)/m, more accurate for the same m). Completeness: Σ_i Attr(k_i) ≈ f(k) − f(0). Families with a
  norm after the MLP (Gemma3's post-feedforward RMSNorm) break this: RMSNorm(α k W) does not depend on α > 0,
  so f(αk) is flat and jumps at α ≈ 0, and the Riemann sum sees none of f(k) − f(0) (measured on tiny-gemma3).
- :func:`grad_x_activation`: k_i ∂f/∂k_i (the one-step, α = 1 end of the same integral).
- :func:`activation`: |k_i| (a baseline that ignores the answer).
- :func:`random_scores`: standard-normal scores seeded by (seed, prompt): what KLoB numbers must beat.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from tqdm import tqdm
from transformers import DynamicCache

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture, hooks
from editscope.lm.kv_cache import cache_kwargs
from editscope.locate.prompt import LocatePrompt, answer_prob
from editscope.locate.result import LocateResult


def _keys(engine: ScoringEngine, prompt: LocatePrompt) -> torch.Tensor:
    """Clean MLP keys at the last prompt token, [layers, mlp]."""
    names = [f"blocks.{layer}.mlp_key" for layer in range(engine.bundle.n_layers)]
    with torch.no_grad(), capture(engine.model, engine.arch, names) as store:
        answer_prob(engine, torch.tensor([prompt.ids], device=engine.bundle.device), prompt.answer_id)
    return torch.stack([store[name][0, prompt.last].float() for name in names])


def _result(method: str, engine: ScoringEngine, prompt: LocatePrompt, neurons: np.ndarray, **meta) -> LocateResult:
    return LocateResult(method=method, prompt=prompt.text, answer=prompt.answer, neurons=neurons,
                        tokens=[engine.tokenizer.decode([t]) for t in prompt.ids], subject_span=prompt.subject_span,
                        answer_token=prompt.answer_id, meta=meta)


def ig_alphas(steps: int, rule: str) -> torch.Tensor:
    """The scaling points α_j of the Riemann sum (see the module docstring)."""
    if steps < 1:
        raise EditscopeError(f"steps must be >= 1, got {steps}")
    j = torch.arange(1, steps + 1, dtype=torch.float32)  # host: moved by the caller
    if rule == "right":
        return j / steps
    if rule == "midpoint":
        return (j - 0.5) / steps
    raise EditscopeError(f"rule must be 'right' or 'midpoint', not {rule!r}")


def _prefix_kv(engine: ScoringEngine, prompt: LocatePrompt) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values of every layer for the prompt's first T−1 tokens (clean, no grad)."""
    if len(prompt.ids) < 2:
        return []
    cache = DynamicCache()
    with torch.no_grad():
        ids = torch.tensor([prompt.ids[:-1]], device=engine.bundle.device)
        base = engine.model.get_submodule(engine.arch.base)
        base(input_ids=ids, **cache_kwargs(base, cache))
    return [(k, v) for k, v, *_ in cache]


def _last_token_probs(engine: ScoringEngine, prompt: LocatePrompt, prefix_kv: list, rows: int) -> torch.Tensor:
    """P(answer) for ``rows`` copies of the prompt's last token run on the cached first T−1 tokens (hooks apply)."""
    n, device = len(prompt.ids), engine.bundle.device
    cache = DynamicCache(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                                         for k, v in prefix_kv]) if prefix_kv else None
    base = engine.model.get_submodule(engine.arch.base)
    hidden = base(
        input_ids=torch.tensor([[prompt.ids[-1]]], device=device).expand(rows, 1),
        attention_mask=torch.ones((rows, n), dtype=torch.long, device=device),
        position_ids=torch.full((rows, 1), n - 1, dtype=torch.long, device=device),
        **cache_kwargs(base, cache)).last_hidden_state[:, -1]
    return engine.logits_from_hidden(hidden).float().softmax(-1)[:, prompt.answer_id]


@torch.enable_grad()  # gradients also when the caller runs under no_grad
def knowledge_neurons(engine: ScoringEngine, prompt: LocatePrompt, *, steps: int = 20, rule: str = "right",
                      layers: list[int] | None = None, token_budget: int = 1024, suffix: bool = True,
                      progress: bool = False) -> LocateResult:
    """Integrated-gradients attribution of every MLP neuron (Dai et al. 2022 eq. 2-3), batched over steps and
    over as many layers as ``token_budget`` allows in one forward/backward.

    ``suffix`` (default): only the last position depends on the scaled keys (causal attention), so the first T−1
    tokens run once with a cache and each (layer, α) is a one-token row — T times fewer token-layers than
    running the whole prompt per row, the same numbers (tested against ``suffix=False``). The whole prompt runs
    per row when the prompt is longer than the model's sliding window (the cache would be cut).

    ``progress``: a tqdm bar on stderr over the layers (each chunk of layers is one forward/backward of all its
    IG steps); it changes no number. Off by default: the KN editor calls this once per edit, under the runner's
    own bar; ``editscope locate`` turns it on."""
    keys = _keys(engine, prompt)
    n_layers = keys.shape[0]
    layers = list(range(n_layers)) if layers is None else list(layers)
    alphas = ig_alphas(steps, rule).to(keys.device)
    attr = torch.zeros_like(keys)
    window = engine.arch.sliding_window(engine.model.config)
    suffix = suffix and (window is None or len(prompt.ids) <= window)
    prefix_kv = _prefix_kv(engine, prompt) if suffix else []
    row_tokens = 1 if suffix else len(prompt.ids)
    per_forward = max(1, token_budget // (steps * row_tokens))
    position = -1 if suffix else prompt.last
    bar = tqdm(total=len(layers), desc=f"integrated gradients ({steps} steps)", unit="layer", disable=not progress,
               leave=False)
    for first in range(0, len(layers), per_forward):
        chunk = layers[first:first + per_forward]
        scaled = {layer: (alphas[:, None] * keys[layer]).requires_grad_(True) for layer in chunk}

        def scaler(g: int, layer: int, scaled: dict = scaled):
            def fn(x: torch.Tensor) -> torch.Tensor:
                x = x.clone()
                x[g * steps:(g + 1) * steps, position] = scaled[layer].to(x.dtype)
                return x

            return fn

        fns = {f"blocks.{layer}.mlp_key": scaler(g, layer) for g, layer in enumerate(chunk)}
        with hooks(engine.model, engine.arch, fns):
            if suffix:
                probs = _last_token_probs(engine, prompt, prefix_kv, len(chunk) * steps)
            else:
                ids = torch.tensor([prompt.ids], device=engine.bundle.device).expand(len(chunk) * steps, -1)
                probs = answer_prob(engine, ids, prompt.answer_id)
        grads = torch.autograd.grad(probs.sum(), [scaled[layer] for layer in chunk])
        for layer, grad in zip(chunk, grads, strict=True):
            attr[layer] = keys[layer] * grad.mean(0)
        bar.update(len(chunk))
    bar.close()
    return _result("kn", engine, prompt, attr.double().cpu().numpy(), steps=steps, rule=rule, layers=layers)


@torch.enable_grad()  # gradients also when the caller runs under no_grad
def grad_x_activation(engine: ScoringEngine, prompt: LocatePrompt, *, progress: bool = False) -> LocateResult:
    """k_i ∂f/∂k_i at the last prompt token for every layer, from one forward and backward (no bar: ``progress``
    is accepted as every locating method takes it)."""
    names = [f"blocks.{layer}.mlp_key" for layer in range(engine.bundle.n_layers)]
    with capture(engine.model, engine.arch, names, grad=True) as store:
        prob = answer_prob(engine, torch.tensor([prompt.ids], device=engine.bundle.device), prompt.answer_id)
        prob.sum().backward()
    scores = torch.stack([(store[n][0, prompt.last] * store.grads[n][0, prompt.last]).detach().float()
                          for n in names])
    return _result("grad_x_act", engine, prompt, scores.double().cpu().numpy(), prob=float(prob[0].detach()))


def activation(engine: ScoringEngine, prompt: LocatePrompt, *, progress: bool = False) -> LocateResult:
    """|k_i| at the last prompt token (one forward: no bar; ``progress`` is accepted as every method takes it)."""
    return _result("activation", engine, prompt, _keys(engine, prompt).abs().double().cpu().numpy())


def random_scores(engine: ScoringEngine, prompt: LocatePrompt, *, seed: int = 0,
                  progress: bool = False) -> LocateResult:
    """Standard-normal neuron scores, seeded by ``seed`` and the prompt text (distinct per sentence,
    reproducible); no model run, no bar (``progress`` is accepted as every method takes it)."""
    shape = (engine.bundle.n_layers, engine.arch.mlp_size(engine.model.config))
    rng = np.random.default_rng([seed, zlib.crc32(prompt.text.encode())])
    return _result("random", engine, prompt, rng.standard_normal(shape), seed=seed)
