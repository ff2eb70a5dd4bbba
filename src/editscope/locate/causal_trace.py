"""Causal tracing (ROME, Meng et al. 2022, §2.1; DESIGN.md "Hard-won details").

Three runs per fact: the clean run; the corrupted run, where Gaussian noise ε ~ N(0, ν²) is added to the
embeddings of the subject's tokens; and corrupted-with-restoration runs, where one hidden state h_i^(l) (token
i, layer l) is set back to its clean value. The *indirect effect* of a state is P*(answer) with it restored
minus P*(answer) corrupted (ROME eq. 1-2 and the IE definition of §2.1).

Choices (documented so numbers are reproducible):

- ν = ``noise`` × σ, ``noise`` = 3 as in ROME. ROME measured σ as the std of the *subject tokens'* embeddings
  over the subjects of its 1,209 known facts (``collect_embedding_std``); here σ is by default the std of every
  entry of the model's embedding table as the embedding layer outputs it (× Gemma's √d): a property of the
  model alone, no dataset needed, and on SmolLM2 within the same order (see :func:`embedding_std`).
  ``noise_std`` overrides σ.
- The noise is drawn once per fact (``samples`` rows, seeded) and reused for every restoration, as ROME does,
  so differences between restorations are not noise differences.
- Scored: the probability of the answer's *first* token at the last prompt position (ROME's ``predict_token``).
- Restored states: ``residual`` = the block output (``blocks.{l}.resid_post``), ``mlp`` = the MLP output
  (``blocks.{l}.mlp_out``), ``attn`` = the attention output (``blocks.{l}.attn_out``). MLP and attention are
  restored over a window of layers around l, ``range(max(0, l - w//2), min(L, l - (-w//2)))`` (ROME's
  ``trace_important_window``). ROME used w = 10 for GPT-2 XL (48 layers); the default here scales it to the
  model's depth, ``max(1, round(10 * L / 48))`` (6 for SmolLM2's 30 layers).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture, hooks
from editscope.locate.prompt import LocatePrompt, answer_prob
from editscope.locate.result import STATE_KINDS, LocateResult

POINT_OF_KIND = {"residual": "resid_post", "mlp": "mlp_out", "attn": "attn_out"}
Restore = Sequence[tuple[str, int]]  # (hook point name, token index) pairs restored together in one run


def embedding_std(engine: ScoringEngine) -> float:
    """σ of the noise: std of all entries of the embedding table as the embedding layer outputs them."""
    weight = engine.model.get_input_embeddings().weight.detach().float()
    return float(weight.std()) * engine.arch.embed_multiplier(engine.model.config)


def default_window(n_layers: int) -> int:
    """ROME's window of 10 layers (of GPT-2 XL's 48) scaled to ``n_layers``."""
    return max(1, round(10 * n_layers / 48))


def window_layers(layer: int, window: int, n_layers: int) -> range:
    """Layers restored together for a window centred on ``layer`` (ROME's ``trace_important_window``)."""
    return range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2)))


class CausalTracer:
    """Clean states, seeded subject noise and batched restoration runs for one prompt.

    ``restored_probs(restores)`` answers many restoration patterns at once: each pattern is a list of
    (hook point, token) pairs set back to their clean values in the same run; the answer probability is
    averaged over the ``samples`` noise rows. An empty pattern is the corrupted run.
    """

    def __init__(self, engine: ScoringEngine, prompt: LocatePrompt, *, samples: int = 10, noise: float = 3.0,
                 noise_std: float | None = None, seed: int = 0, token_budget: int = 4096) -> None:
        if prompt.subject_span is None:
            raise EditscopeError("causal tracing needs a subject to corrupt (no subject span)")
        if samples < 1:
            raise EditscopeError(f"samples must be >= 1, got {samples}")
        self.engine, self.prompt, self.samples = engine, prompt, samples
        self.n_layers = engine.bundle.n_layers
        self.sigma = embedding_std(engine) if noise_std is None else float(noise_std)
        self.noise_scale = float(noise) * self.sigma
        self.seed = seed
        self.rows_per_forward = max(samples, token_budget // max(1, len(prompt.ids)))
        start, end = prompt.subject_span
        gen = torch.Generator().manual_seed(seed)
        dim = engine.bundle.hidden_size
        noise = torch.randn((samples, end - start, dim), generator=gen)  # host generator: the same noise anywhere
        self.noise = (noise * self.noise_scale).to(engine.bundle.device)
        self.ids = torch.tensor([prompt.ids], device=engine.bundle.device)
        names = [f"blocks.{layer}.{point}" for layer in range(self.n_layers) for point in POINT_OF_KIND.values()]
        with torch.no_grad(), capture(engine.model, engine.arch, names) as store:
            self.clean_prob = float(answer_prob(engine, self.ids, prompt.answer_id)[0])
        self.clean = {name: store[name][0] for name in names}
        self.corrupted_prob = float(self.restored_probs([[]])[0])

    @torch.no_grad()
    def restored_probs(self, restores: Sequence[Restore], *, progress: bool = False) -> np.ndarray:
        """Mean P(answer) over the noise rows for each restoration pattern, batched; ``progress``: a tqdm bar on
        stderr over the patterns (it changes no number)."""
        out = np.empty(len(restores))
        bar = tqdm(total=len(restores), desc="causal trace", unit="restore", disable=not progress, leave=False)
        groups = max(1, self.rows_per_forward // self.samples)
        start, end = self.prompt.subject_span
        for first in range(0, len(restores), groups):
            chunk = restores[first:first + groups]
            n_rows = len(chunk) * self.samples
            noise = self.noise.repeat(len(chunk), 1, 1)
            plan: dict[str, list[tuple[int, int]]] = {}
            for g, pattern in enumerate(chunk):
                for name, token in pattern:
                    plan.setdefault(name, []).append((g, token))

            def corrupt(x: torch.Tensor, noise=noise) -> torch.Tensor:
                x = x.clone()
                x[:, start:end] += noise.to(x.dtype)
                return x

            def restorer(name: str, items: list[tuple[int, int]]):
                clean = self.clean[name]

                def restore(x: torch.Tensor) -> torch.Tensor:
                    x = x.clone()
                    for g, token in items:
                        x[g * self.samples:(g + 1) * self.samples, token] = clean[token]
                    return x

                return restore

            fns = {"embed": corrupt} | {name: restorer(name, items) for name, items in plan.items()}
            with hooks(self.engine.model, self.engine.arch, fns):
                probs = answer_prob(self.engine, self.ids.expand(n_rows, -1), self.prompt.answer_id)
            out[first:first + len(chunk)] = probs.view(len(chunk), self.samples).mean(1).double().cpu().numpy()
            bar.update(len(chunk))
        bar.close()
        return out


def _traced_tokens(tokens: str | Sequence[int], n_tokens: int, subject_last: int) -> list[int]:
    """The token indices ``tokens`` names: "all", "subject_last", or explicit indices within the prompt."""
    if tokens == "all":
        return list(range(n_tokens))
    if tokens == "subject_last":
        return [subject_last]
    token_list = [int(t) for t in tokens]
    if any(not 0 <= t < n_tokens for t in token_list):
        raise EditscopeError(f"token indices {token_list} outside the prompt's {n_tokens} tokens")
    return token_list


def _restorations(kinds: Sequence[str], token_list: list[int], window: int, n_layers: int,
                  subject_last: int) -> tuple[list[Restore], list[tuple[str, int, int]]]:
    """What each traced run restores, and where its result goes ((kind, layer, token)): per kind, layer and token
    the window of states around that layer; then, unless already traced, the MLP at the subject's last token
    (kind ``_mlp_last``), which the neuron scores always need."""
    patterns, where = [], []
    for kind in kinds:
        width = 1 if kind == "residual" else window
        for layer in range(n_layers):
            names = [f"blocks.{lay}.{POINT_OF_KIND[kind]}" for lay in window_layers(layer, width, n_layers)]
            for token in token_list:
                patterns.append([(name, token) for name in names])
                where.append((kind, layer, token))
    if not ("mlp" in kinds and subject_last in token_list):
        for layer in range(n_layers):
            names = [f"blocks.{lay}.mlp_out" for lay in window_layers(layer, window, n_layers)]
            patterns.append([(name, subject_last) for name in names])
            where.append(("_mlp_last", layer, subject_last))
    return patterns, where


def _place(where: list[tuple[str, int, int]], probs: np.ndarray, kinds: Sequence[str], n_layers: int,
           n_tokens: int, subject_last: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each traced probability in its kind's [layers, tokens] map (untraced: NaN), and the MLP's at the subject's
    last token per layer."""
    states = {kind: np.full((n_layers, n_tokens), np.nan) for kind in kinds}
    mlp_last = np.full(n_layers, np.nan)
    for (kind, layer, token), p in zip(where, probs, strict=True):
        if kind == "_mlp_last":
            mlp_last[layer] = p
            continue
        states[kind][layer, token] = p
        if kind == "mlp" and token == subject_last:
            mlp_last[layer] = p
    return states, mlp_last


def trace(engine: ScoringEngine, prompt: LocatePrompt, *, kinds: Sequence[str] = STATE_KINDS,
          tokens: str | Sequence[int] = "all", window: int | None = None, samples: int = 10, noise: float = 3.0,
          noise_std: float | None = None, seed: int = 0, progress: bool = True) -> LocateResult:
    """Causal tracing of one fact (ROME §2.1): per kind a [layers, tokens] map of P(answer) with that state
    (window) restored; untraced tokens are NaN. ``tokens``: "all", "subject_last", or explicit indices.

    Neuron scores (for KLoB) are the MLP indirect effect at the subject's last token, the same value for every
    neuron of a layer: causal tracing locates layers, not neurons. ``progress``: a tqdm bar on stderr over the
    (state, layer, token) restorations, the long part (it changes no number).
    """
    unknown = [k for k in kinds if k not in POINT_OF_KIND]
    if unknown or not kinds:
        raise EditscopeError(f"unknown trace kinds {unknown or kinds}; valid: {', '.join(POINT_OF_KIND)}")
    tracer = CausalTracer(engine, prompt, samples=samples, noise=noise, noise_std=noise_std, seed=seed)
    n_layers, n_tokens = tracer.n_layers, len(prompt.ids)
    subject_last = prompt.subject_span[1] - 1
    token_list = _traced_tokens(tokens, n_tokens, subject_last)
    window = default_window(n_layers) if window is None else int(window)
    patterns, where = _restorations(kinds, token_list, window, n_layers, subject_last)
    probs = tracer.restored_probs(patterns, progress=progress)
    states, mlp_last = _place(where, probs, kinds, n_layers, n_tokens, subject_last)
    effect = mlp_last - tracer.corrupted_prob
    neurons = np.repeat(effect[:, None], engine.arch.mlp_size(engine.model.config), axis=1)
    return LocateResult(
        method="causal_trace", prompt=prompt.text, answer=prompt.answer, neurons=neurons, states=states,
        tokens=[engine.tokenizer.decode([t]) for t in prompt.ids], subject_span=prompt.subject_span,
        answer_token=prompt.answer_id,
        meta={"clean_prob": tracer.clean_prob, "corrupted_prob": tracer.corrupted_prob, "samples": samples,
              "noise": noise, "sigma": tracer.sigma, "window": window, "seed": seed, "tokens": token_list,
              "mlp_indirect_effect": effect.tolist()},
    )
