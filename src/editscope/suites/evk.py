"""EVK-Bench suite: Embedding Stability and Text Stability (paper 004, ../shared/papers/004, §3.1.2, eq 9; §4.1).

ES = cos(h_pre, h_post) of the final-token last-layer hidden state of the unedited and the edited model on the
same EVK instance (an embedding-perturbed prompt, :mod:`editscope.data.evk`, eqs 4-8); TS is the same cosine
on plain text prompts. Both come from :mod:`editscope.metrics.stability`.

What the paper's text supports, and what this suite does:

- **Instances** are "constructed from prompts in the Counterfact benchmark" (§3.1.1); §4.1 perturbs "prompt
  embeddings initialized from CounterFact (2,000 samples)" and Fig. 5 places the instances around the "initial
  editing points": the *edit prompt* of each case (``source: edit``, the default). Neighbourhood prompts as the
  source (``source: neighborhood`` or ``both``) are an extension; CounterFact does not annotate their subject,
  so only All drift applies to them.
- **Count**: "for each initial embedding, we generate three additional EVK samples", 2,000 prompts -> 6,000
  instances, the three types "generated in equal quantities" (§3.1.1): one instance per drift type
  (``instances_per_type: 1``, default) at σ = 0.3 (``sigma``).
- **Text Stability** uses CounterFact's "attribution prompts" (§3.1.2; ROME's ``attribute_prompts``, in
  ``case.extra`` for ROME-format CounterFact). The shared EasyEdit-format CounterFact has none: there TS uses
  the case's neighbourhood (``locality_prompt``) prompts. ``text: auto`` (default) takes attribute prompts when
  the case has them, else neighbourhood prompts; ``attribute`` / ``neighborhood`` force one.
- **The hidden state** is the residual stream after the last block at the prompt's last token (the engine's
  ``blocks.{L-1}.resid_post``), recorded in the probe as ``"state"``. HF's ``hidden_states[-1]`` applies the
  final norm first; the paper does not say which it read.

Probe (JSON)::

    {"state": "blocks.29.resid_post",
     "evk": [{"prompt", "source": "edit"|"neighborhood", "drift", "sigma", "index", "h": [float, ...]}, ...],
     "text": [{"prompt", "h": [float, ...]}, ...]}

``h`` is rounded to 7 significant digits (cosine error far below 1e-6). The pre-edit probe holds the unedited
vectors, the post-edit probe the edited ones; noise is seeded per (seed, case, prompt, drift, σ, index), so
both probes perturb identically.

Metrics (post-only, cosines; paper prints ×100): ``EVK_ES`` (mean over every instance at ``sigma``),
``EVK_ES_subject`` / ``EVK_ES_relation`` / ``EVK_ES_all`` (per drift type), ``EVK_TS``; with ``sigmas`` (a
sweep, e.g. [0.05, 0.1, 0.3, 0.5, 1.0]) also ``EVK_ES@σ`` and ``EVK_ES_{drift}@σ`` per swept σ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from editscope.data.evk import DRIFTS, evk_instances
from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics.registry import MetricSpec
from editscope.metrics.stability import embedding_stability, text_stability
from editscope.suites.base import Suite

_P = "004 (EVK), §3.1.2"
SOURCES = ("edit", "neighborhood", "both")
TEXT_SOURCES = ("auto", "attribute", "neighborhood")
_ROWS_PER_FORWARD = 64


def _round(vec: np.ndarray) -> list[float]:
    return [float(f"{x:.7g}") for x in vec.tolist()]


def _spec(name: str, what: str, equation: str = "eq 9") -> MetricSpec:
    return MetricSpec(name, _P, equation, True, (-1.0, 1.0), unit="cosine", paper_scale=100,
                      pairing="post_only", description=what)


def _sigma_tag(sigma: float) -> str:
    return f"@{sigma:g}"


class EvkSuite(Suite):
    """EVK-Bench ES/TS; options documented in the module docstring."""

    name = "evk"

    def __init__(self, *, sigma: float = 0.3, instances_per_type: int = 1, drifts: Sequence[str] = DRIFTS,
                 source: str = "edit", text: str = "auto", sigmas: Sequence[float] | None = None,
                 seed: int = 0) -> None:
        if source not in SOURCES:
            raise EditscopeError(f"evk suite: source must be one of {', '.join(SOURCES)}, not {source!r}")
        if text not in TEXT_SOURCES:
            raise EditscopeError(f"evk suite: text must be one of {', '.join(TEXT_SOURCES)}, not {text!r}")
        bad = [d for d in drifts if d not in DRIFTS]
        if bad or not drifts:
            raise EditscopeError(f"evk suite: drifts must be a non-empty subset of {', '.join(DRIFTS)}, got {drifts}")
        sweep = [float(s) for s in (sigmas or [])]
        if any(s < 0 for s in [sigma, *sweep]):
            raise EditscopeError(f"evk suite: sigma values must be >= 0, got {[sigma, *sweep]}")
        if instances_per_type < 1:
            raise EditscopeError(f"evk suite: instances_per_type must be >= 1, got {instances_per_type}")
        self.sigma = float(sigma)
        self.sweep = [s for s in dict.fromkeys(sweep) if s != self.sigma]
        self.instances_per_type = int(instances_per_type)
        self.drifts = tuple(drifts)
        self.source = source
        self.text = text
        self.seed = int(seed)

    # -- declarations ------------------------------------------------------------------------------
    @property
    def metrics_declared(self) -> tuple[MetricSpec, ...]:
        specs = [_spec("EVK_ES", f"Embedding Stability, mean over all EVK instances at sigma={self.sigma:g}")]
        specs += [_spec(f"EVK_ES_{d}", f"Embedding Stability of {d}-drift instances at sigma={self.sigma:g}")
                  for d in self.drifts]
        specs.append(_spec("EVK_TS", "Text Stability on the case's text neighbours", "eq 9 on text prompts"))
        for s in self.sweep:
            specs.append(_spec(f"EVK_ES{_sigma_tag(s)}", f"Embedding Stability at sigma={s:g} (sweep)"))
            specs += [_spec(f"EVK_ES_{d}{_sigma_tag(s)}", f"Embedding Stability of {d} drift at sigma={s:g}")
                      for d in self.drifts]
        return tuple(specs)

    @property
    def protocol(self) -> dict[str, str]:
        """The paper's protocol (module docstring) with this suite's choices spelled out."""
        return {"name": "paper",
                "note": (f"paper 004 eq 9: cosine of the last block's residual state at the final token (before the "
                         f"final norm); {self.instances_per_type} instance(s) per drift type at sigma={self.sigma:g} "
                         f"from the {self.source} prompt(s); TS on {self.text} text prompts")}

    # -- probing -----------------------------------------------------------------------------------
    def text_prompts(self, case: Case) -> list[str]:
        """The TS prompts of ``case`` (module docstring, ``text`` option)."""
        attribute = [p for p, _ in case.extra.get("attribute_prompts", [])]
        neighbours = [p for p, _ in case.neighborhood]
        if self.text == "attribute":
            return attribute
        if self.text == "neighborhood":
            return neighbours
        return attribute or neighbours

    def instances(self, engine: Scorer, case: Case) -> list[dict[str, Any]]:
        """The EVK instances of ``case`` as dicts with ``"embeds"`` (not JSON: the probe drops them)."""
        out: list[dict[str, Any]] = []
        for sigma in [self.sigma, *self.sweep]:
            if self.source in ("edit", "both"):
                for req in case.requests:
                    for inst in evk_instances(engine, req.prompt, req.subject, sigma=sigma,
                                              n=self.instances_per_type, drifts=self.drifts, seed=self.seed,
                                              key=case.case_id):
                        out.append({"prompt": inst.text, "source": "edit", "drift": inst.drift, "sigma": sigma,
                                    "index": inst.index, "embeds": inst.embeds})
            if self.source in ("neighborhood", "both") and "all" in self.drifts:
                for prompt, _ in case.neighborhood:
                    # No subject annotation on neighbour prompts: the whole prompt is the "subject" slot,
                    # and only All drift applies.
                    for inst in evk_instances(engine, "{}", prompt, sigma=sigma, n=self.instances_per_type,
                                              drifts=("all",), seed=self.seed, key=case.case_id):
                        out.append({"prompt": inst.text, "source": "neighborhood", "drift": "all", "sigma": sigma,
                                    "index": inst.index, "embeds": inst.embeds})
        return out

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """Final-token last-layer states of every EVK instance and text prompt of each case."""
        probes = []
        for case in cases:
            insts = self.instances(engine, case)
            texts = self.text_prompts(case)
            contexts = [i["prompt"] for i in insts] + texts
            embeds: list[torch.Tensor | None] = [i["embeds"] for i in insts] + [None] * len(texts)
            states = self._states(engine, contexts, embeds)
            evk = [{k: v for k, v in inst.items() if k != "embeds"} | {"h": _round(states[j])}
                   for j, inst in enumerate(insts)]
            text = [{"prompt": p, "h": _round(states[len(insts) + j])} for j, p in enumerate(texts)]
            probes.append({"state": self._state_name(engine), "evk": evk, "text": text})
        return probes

    @staticmethod
    def _state_name(engine: Scorer) -> str:
        return f"blocks.{engine.n_layers - 1}.resid_post"

    def _states(self, engine: Scorer, contexts: list[str], embeds: list[torch.Tensor | None]) -> np.ndarray:
        layer = engine.n_layers - 1
        out = []
        for start in range(0, len(contexts), _ROWS_PER_FORWARD):
            chunk = slice(start, start + _ROWS_PER_FORWARD)
            h = engine.hidden_states(contexts[chunk], [layer], kind="resid_post", context_embeds=embeds[chunk])
            out.append(h[:, 0].float().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    # -- metrics -----------------------------------------------------------------------------------
    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        """ES per drift type and σ, and TS (paper 004 eq 9), from two probes of the same case."""
        if pre.get("state") != post.get("state"):
            raise EditscopeError(f"evk suite: case {case.case_id}: pre and post probes read different states "
                                 f"({pre.get('state')} vs {post.get('state')})")
        if len(pre["evk"]) != len(post["evk"]) or len(pre["text"]) != len(post["text"]):
            raise EditscopeError(f"evk suite: case {case.case_id}: pre and post probes hold different instances")
        row: dict[str, float] = {}
        if pre["evk"]:
            cos = _cosines([i["h"] for i in pre["evk"]], [i["h"] for i in post["evk"]], embedding_stability)
            for sigma in [self.sigma, *self.sweep]:
                tag = "" if sigma == self.sigma else _sigma_tag(sigma)
                at = [j for j, i in enumerate(pre["evk"]) if i["sigma"] == sigma]
                if at:
                    row[f"EVK_ES{tag}"] = float(np.mean(cos[at]))
                for d in self.drifts:
                    sel = [j for j in at if pre["evk"][j]["drift"] == d]
                    if sel:
                        row[f"EVK_ES_{d}{tag}"] = float(np.mean(cos[sel]))
        if pre["text"]:
            cos = _cosines([t["h"] for t in pre["text"]], [t["h"] for t in post["text"]], text_stability)
            row["EVK_TS"] = float(np.mean(cos))
        return row


def _cosines(pre: list[list[float]], post: list[list[float]], fn) -> np.ndarray:
    """Row-wise cosines; rows that are identical are exactly 1 (cos(h, h) = 1, without rounding error)."""
    a, b = np.asarray(pre, dtype=np.float64), np.asarray(post, dtype=np.float64)
    cos = np.asarray(fn(a, b), dtype=np.float64)
    same = np.all(a == b, axis=1)
    cos[same] = 1.0
    return cos


__all__ = ["SOURCES", "TEXT_SOURCES", "EvkSuite"]
