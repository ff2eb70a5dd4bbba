"""Context prefixes, subject positions and keys k* shared by the locate-then-edit editors."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from editscope.data.records import EditRequest
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.loading import Bundle

PREFIX_STARTS = ("The", "Therefore", "Because", "I", "You")


def context_templates(engine: ScoringEngine, spec: Sequence[Sequence[int]], seed: int = 0) -> list[str]:
    """``["{}"] + [prefix + ". {}", ...]``: short random prefixes as in ROME §3.1 / MEMIT's reference code.

    For each ``[n_tokens, n_prefixes]`` in ``spec``, ``n_prefixes`` prefixes are sampled (top-5, seeded) from
    the starts :data:`PREFIX_STARTS` in turn, each ``n_tokens`` new tokens long. Braces and newlines are
    removed so a prefix never contains a template slot. Generated once per engine and (spec, seed), from the
    model as it is then (as ROME/MEMIT's template cache), and reused by later edits through the same engine.
    """
    key = ("context_templates", tuple(tuple(int(x) for x in s) for s in spec), int(seed))
    if key in engine.memo:
        return list(engine.memo[key])
    templates = ["{}"]
    for i, (n_tokens, n_prefixes) in enumerate(spec):
        starts = [PREFIX_STARTS[j % len(PREFIX_STARTS)] for j in range(n_prefixes)]
        texts = engine.generate(starts, max_new_tokens=int(n_tokens), top_k=5, seed=seed + i)
        for start, text in zip(starts, texts, strict=True):
            prefix = " ".join((start + text).replace("{", " ").replace("}", " ").split())
            templates.append(prefix + ". {}")
    engine.memo[key] = tuple(templates)
    return templates


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
                 layers: Sequence[int]) -> torch.Tensor:
    """k* per request and layer, [n_requests, n_layers, mlp] (float64): the MLP key at the subject's last token
    averaged over the context templates (ROME eq. 3; MEMIT eq. 18)."""
    out = []
    for request in requests:
        texts, positions = prompt_rows(engine, request, templates)
        states = engine.hidden_states(texts, list(layers), kind="mlp_key", positions=positions)
        out.append(states.double().mean(0))
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
        return module(keys.to(torch.float32)).double()


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
