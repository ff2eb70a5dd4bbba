"""Context prefixes, subject positions and keys k* shared by the locate-then-edit editors."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from editscope.data.records import EditRequest
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.loading import Bundle
from editscope.stats import second_moments

PREFIX_STARTS = ("The", "Therefore", "Because", "I", "You")


def key_statistics(bundle: Bundle, hp, state=None) -> dict[int, torch.Tensor]:
    """The presolve of ROME and the MEMIT family: C = E[k kᵀ] of every layer ``hp.stats_layers()`` names, from the
    unedited weights (the convention for sequential editing); empty when the method uses C = I."""
    layers = hp.stats_layers()
    if not layers:
        return {}
    return second_moments(bundle, layers, token_budget=hp.stats_tokens(), weights="base",
                          stats_dtype=hp.stats_dtype())


def context_templates(engine: ScoringEngine, spec: Sequence[Sequence[int]], seed: int = 0,
                      start: str | None = None, cache: dict | None = None) -> list[str]:
    """``["{}"] + [prefix + ". {}", ...]``: short prefixes sampled from the model itself, as MEMIT's reference
    ``get_context_templates`` (kmeng01/memit memit_main.py; ROME §3.1, MEMIT §4.3 "random prefixes").

    For each ``[n_tokens, n_prefixes]`` in ``spec`` (one template *group*, see :func:`template_weights`),
    ``n_prefixes`` prefixes are sampled with top-5 sampling (seeded) from the starts :data:`PREFIX_STARTS` in
    turn; a prefix is ``n_tokens`` tokens long including its start word (the reference's ``max_out_len``).
    ``start`` is text put before the start word while sampling and dropped from the prefix: SmolLM2 predicts "-"
    with p ≈ 0.4 after a lone "The" at position 0 (giving "The-the-key-to-the-secret."), and fluent text after
    its document separator "<|endoftext|>The" — which is what a model whose tokenizer adds a BOS sees anyway.
    Braces are replaced by spaces (as the reference) and runs of whitespace collapsed, so a prefix never holds
    a template slot or a line break. With ``cache`` (an :class:`~editscope.edit.runtime.EditRuntime`'s
    ``templates``) they are generated once per model name and (spec, seed, start), from the model as it is then
    (as ROME/MEMIT's template cache), and reused by later edits through the same runtime.
    """
    key = (engine.bundle.name, tuple(tuple(int(x) for x in s) for s in spec), int(seed), start)
    if cache is not None and key in cache:
        return list(cache[key])
    templates = ["{}"]
    # Prefixes are free text sampled without the chat template (a chat-wrapped prompt gets them inside its user
    # turn, before the prompt): the same prefixes with and without it.
    with engine.plain():
        _sample_prefixes(engine, spec, seed, start, templates)
    if cache is not None:
        cache[key] = tuple(templates)
    return templates


def _sample_prefixes(engine: ScoringEngine, spec: Sequence[Sequence[int]], seed: int, start: str | None,
                     templates: list[str]) -> None:
    for i, (n_tokens, n_prefixes) in enumerate(spec):
        starts = [PREFIX_STARTS[j % len(PREFIX_STARTS)] for j in range(n_prefixes)]
        texts: dict[int, str] = {}
        by_length: dict[int, list[int]] = {}  # one sampling call per start length: every prefix has n_tokens
        for j, word in enumerate(starts):
            by_length.setdefault(len(engine.encode(word)), []).append(j)
        for length, rows in sorted(by_length.items()):
            prompts = [(start or "") + starts[j] for j in rows]
            new = engine.generate(prompts, max_new_tokens=max(1, int(n_tokens) - length), top_k=5,
                                  seed=seed + 1000 * i + length)
            texts.update({j: starts[j] + text for j, text in zip(rows, new, strict=True)})
        for j in range(n_prefixes):
            prefix = " ".join(texts[j].replace("{", " ").replace("}", " ").split())
            templates.append(prefix + ". {}")


def template_weights(spec: Sequence[Sequence[int]], key_average: str = "flat") -> torch.Tensor:
    """Weight of each template of :func:`context_templates` in the key average k* (float64, sums to 1).

    ``flat`` (convention ``paper``): uniform, k* = (1/N) Σ_j k(x_j + s) (ROME eq. 3; MEMIT eq. 18). ``grouped``
    (convention ``reference``): the mean within each template group, then the mean over groups, as MEMIT's
    ``compute_ks`` (kmeng01/memit compute_ks.py); the bare prompt is a group of its own, so with one group of
    prefixes it weighs ½.
    """
    sizes = [1] + [int(n) for _, n in spec]
    if key_average == "flat":
        return torch.full((sum(sizes),), 1.0 / sum(sizes), dtype=torch.float64)  # host: moved where the keys are
    if key_average == "grouped":
        return torch.cat([torch.full((n,), 1.0 / (len(sizes) * n), dtype=torch.float64) for n in sizes])  # host
    raise EditscopeError(f"unknown key_average {key_average!r} (known: flat, grouped)")


def fill(template: str, text: str) -> str:
    """Put ``text`` in the template's slot (``str.replace``, so braces in ``text`` are harmless)."""
    return template.replace("{}", text, 1)


def subject_last_token_index(engine: ScoringEngine, prompt_template: str, subject: str) -> int:
    """Index (in ``engine.encode`` of the filled prompt) of the subject's last token.

    ``prompt_template`` holds one ``{}`` where ``subject`` goes (text before it may include a context
    prefix). The subject's last token is the last token of the encoded text up to the end of the subject
    (as ROME's ``subject_last`` lookup); it must lie inside the encoded full text.
    """
    if prompt_template.count("{}") != 1:
        raise EditscopeError(f"prompt template must contain exactly one '{{}}': {prompt_template!r}")
    head = prompt_template[: prompt_template.index("{}")] + subject
    index = len(engine.encode(head)) - 1
    full = prompt_template.replace("{}", subject)
    if index < 0 or index >= len(engine.encode(full)):
        raise EditscopeError(f"subject {subject!r} has no token inside {full!r}")
    return index


def prompt_rows(engine: ScoringEngine, request: EditRequest, templates: Sequence[str]) -> tuple[list[str], list[int]]:
    """The filled prompts (template ∘ request prompt ∘ subject) and the subject's last token index in each."""
    texts, positions = [], []
    for template in templates:
        prompt_template = fill(template, request.prompt)
        texts.append(prompt_template.replace("{}", request.subject))
        positions.append(subject_last_token_index(engine, prompt_template, request.subject))
    return texts, positions


def subject_keys(engine: ScoringEngine, requests: Sequence[EditRequest], templates: Sequence[str],
                 layers: Sequence[int], weights: torch.Tensor | None = None) -> torch.Tensor:
    """k* per request and layer, [n_requests, n_layers, mlp] (float64): the MLP key at the subject's last token
    averaged over the context templates (ROME eq. 3; MEMIT eq. 18), uniformly or with ``weights`` per template
    (:func:`template_weights`)."""
    if weights is not None and len(weights) != len(templates):
        raise EditscopeError(f"{len(weights)} template weights for {len(templates)} templates")
    out = []
    for request in requests:
        texts, positions = prompt_rows(engine, request, templates)
        states = engine.hidden_states(texts, list(layers), kind="mlp_key", positions=positions).double()
        out.append(states.mean(0) if weights is None else torch.einsum("t,tld->ld", weights.to(states), states))
    return torch.stack(out)


def subject_states(engine: ScoringEngine, requests: Sequence[EditRequest], layer: int, kind: str) -> torch.Tensor:
    """The state ``kind`` (resid_post or mlp_key) at the subject's last token of each bare prompt, [n, dim]."""
    rows = [prompt_rows(engine, r, ["{}"]) for r in requests]
    texts = [t[0] for t, _ in rows]
    positions = [p[0] for _, p in rows]
    return engine.hidden_states(texts, [layer], kind=kind, positions=positions)[:, 0].double()


def mlp_out_of_keys(bundle: Bundle, layer: int, keys: torch.Tensor) -> torch.Tensor:
    """W k (+ bias) of the layer's MLP down projection, for keys [n, mlp] -> [n, hidden] (float64)."""
    module = bundle.arch.layer_module(bundle.model, layer, "mlp_out")
    with torch.no_grad():
        return module(keys.to(next(module.parameters()))).double()  # the model's own dtype and device


@contextmanager
def temporarily_added(bundle: Bundle, deltas: dict[str, torch.Tensor]):
    """Add ``deltas`` (growing while inside: new entries are added by the caller through the yielded function)
    and restore the exact original values on exit."""
    params = dict(bundle.model.named_parameters())
    originals: dict[str, torch.Tensor] = {}

    def add(name: str, delta: torch.Tensor) -> None:
        with torch.no_grad():
            if name not in originals:
                originals[name] = params[name].detach().clone()
            params[name].add_(delta.to(params[name].dtype))

    try:
        for name, delta in deltas.items():
            add(name, delta)
        yield add
    finally:
        with torch.no_grad():
            for name, original in originals.items():
                params[name].copy_(original)
