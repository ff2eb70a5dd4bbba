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
- **The hidden state** (``state`` option): "the hidden states of the final output token" (§3.1.2) at the prompt's
  last token. ``final_norm`` (default) reads the output of the final norm, the state the LM head reads and what
  HF's ``output_hidden_states[-1]`` returns in every supported family (GPT-2/GPT-J apply ``ln_f``, LLaMA/Gemma
  ``norm`` before appending it) — the usual way to get "the last layer's hidden state", so most likely what the
  paper read (hook point ``final``). ``resid`` reads the residual stream after the last block, before the final
  norm (``blocks.{L-1}.resid_post``): there a few dimensions of huge magnitude dominate (SmolLM2), so every
  cosine is close to 1 and differences between editors shrink. The probe records the point as ``"state"``.

Probe (JSON)::

    {"state": "final" | "blocks.29.resid_post",
     "evk": [{"prompt", "source": "edit"|"neighborhood", "drift", "sigma", "index", "h": [float, ...]}, ...],
     "text": [{"prompt", "h": [float, ...]}, ...]}

``h`` is rounded to 7 significant digits (cosine error far below 1e-6). The pre-edit probe holds the unedited
vectors, the post-edit probe the edited ones; noise is seeded per (seed, case, prompt, drift, σ, index), so
both probes perturb identically.

Metrics (post-only, cosines; paper prints ×100): ``EVK_ES`` (mean over every instance at ``sigma``),
``EVK_ES_subject`` / ``EVK_ES_relation`` / ``EVK_ES_all`` (per drift type), ``EVK_TS``; with ``sigmas`` (a
sweep, e.g. [0.05, 0.1, 0.3, 0.5, 1.0]) also ``EVK_ES@σ`` and ``EVK_ES_{drift}@σ`` per swept σ, and the report
figure of stability vs σ per method (:meth:`EvkSuite.figures`).

Embedding map (paper 004 Fig. 5; option ``embedding_map``): a report figure placing the stored final-token states
of the edit prompt's EVK instances (at ``sigma``, coloured by drift type) and of the text prompts in two dimensions,
before the edit (hollow) and after it (filled, one panel per method), all in one projection fitted on every point
shown, so panels share axes. ``pca`` (default): the first two principal axes of the centred states
(:func:`pca_2d`; axes give the share of variance each explains); ``umap``: UMAP (McInnes & Healy 2018, the paper's
choice), only when the ``umap`` package is installed (not a dependency); ``none``: no map. At most ``MAP_CASES``
cases are drawn (the first of the rows), so large runs stay readable.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from editscope.data.evk import DRIFTS, evk_instances

if TYPE_CHECKING:  # tensors only in signatures: importing the suite must not load torch
    import torch
from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics.registry import MetricSpec
from editscope.metrics.stability import embedding_stability, text_stability
from editscope.suites.base import Suite, SuiteFigure, check_choice

_P = "004 (EVK), §3.1.2"
SOURCES = ("edit", "neighborhood", "both")
TEXT_SOURCES = ("auto", "attribute", "neighborhood")
#: ``state`` option -> (engine ``hidden_states`` kind, what the protocol note calls it)
STATES = {"final_norm": ("final", "the final norm's output (HF hidden_states[-1])"),
          "resid": ("resid_post", "the last block's residual state before the final norm")}
_ROWS_PER_FORWARD = 64
MAPS = ("pca", "umap", "none")
#: the embedding map draws the states of at most this many cases
MAP_CASES = 200


def _round(vec: np.ndarray) -> list[float]:
    return [float(f"{x:.7g}") for x in vec.tolist()]


def _spec(name: str, what: str, equation: str = "eq 9") -> MetricSpec:
    return MetricSpec(name, _P, equation, True, (-1.0, 1.0), unit="cosine", paper_scale=100,
                      pairing="post_only", description=what)


def _sigma_tag(sigma: float) -> str:
    return f"@{sigma:g}"


class EvkSuite(Suite):
    """EVK-Bench ES/TS; options documented in the module docstring."""

    reads_prompt_embeddings = True

    name = "evk"
    card_section = "evk-stability"

    def __init__(self, *, sigma: float = 0.3, instances_per_type: int = 1, drifts: Sequence[str] = DRIFTS,
                 source: str = "edit", text: str = "auto", sigmas: Sequence[float] | None = None,
                 seed: int = 0, state: str = "final_norm",
                 embedding_map: Literal["pca", "umap", "none"] = "pca") -> None:
        check_choice(self.name, "state", state, tuple(STATES))
        check_choice(self.name, "embedding_map", embedding_map, MAPS)
        if embedding_map == "umap" and importlib.util.find_spec("umap") is None:
            raise EditscopeError("evk suite: option embedding_map umap needs the umap package "
                                 "(pip install umap-learn), or use pca")
        check_choice(self.name, "source", source, SOURCES)
        check_choice(self.name, "text", text, TEXT_SOURCES)
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
        self.state = state
        self.embedding_map = embedding_map

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
        return {"name": "paper" if self.state == "final_norm" else "resid",
                "note": (f"paper 004 eq 9: cosine of {STATES[self.state][1]} at the final token; "
                         f"{self.instances_per_type} instance(s) per drift type at sigma={self.sigma:g} "
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

    def _state_name(self, engine: Scorer) -> str:
        return "final" if self.state == "final_norm" else f"blocks.{engine.n_layers - 1}.resid_post"

    def _states(self, engine: Scorer, contexts: list[str], embeds: list[torch.Tensor | None]) -> np.ndarray:
        layer = engine.n_layers - 1
        out = []
        for start in range(0, len(contexts), _ROWS_PER_FORWARD):
            chunk = slice(start, start + _ROWS_PER_FORWARD)
            h = engine.hidden_states(contexts[chunk], [layer], kind=STATES[self.state][0],
                                     context_embeds=embeds[chunk])
            out.append(h[:, 0].float().cpu().numpy())
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

    # -- report ------------------------------------------------------------------------------------
    def stability_by_sigma(self, rows: Sequence[dict[str, Any]],
                           methods: Sequence[str]) -> dict[str, dict[str, list[tuple[float, float, float, float]]]]:
        """``{method: {panel: [(σ, mean, ci95_low, ci95_high), ...] by increasing σ}}`` from the results rows; panel
        ``"all instances"`` is ``EVK_ES`` / ``EVK_ES@σ``, one panel per drift type ``EVK_ES_{drift}[@σ]``. Means
        over cases with a value (Student t CI, as the summary's)."""
        from editscope.metrics.intervals import mean_ci

        sigmas = sorted([self.sigma, *self.sweep])
        panels = {"all instances": "EVK_ES", **{f"{d} drift": f"EVK_ES_{d}" for d in self.drifts}}
        out: dict[str, dict[str, list[tuple[float, float, float, float]]]] = {}
        for m in methods:
            sel = [r["metrics"].get(self.name, {}) for r in rows if r["method"] == m]
            if not sel:
                continue
            out[m] = {}
            for panel, base in panels.items():
                points = []
                for sigma in sigmas:
                    key = base + ("" if sigma == self.sigma else _sigma_tag(sigma))
                    mean, lo, hi, _ = mean_ci([v for v in (r.get(key) for r in sel) if v is not None])
                    if np.isfinite(mean):
                        points.append((sigma, mean, lo, hi))
                out[m][panel] = points
        return out

    def embedding_points(self, rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
        """The states the embedding map draws, from the results rows: ``{"h": (n, d) array, "kind": drift type or
        "text", "when": "pre" | "post", "method": None (pre) or the method, "key": (case id, "evk" | "text", index
        in the probe)}`` (lists of n). The edit prompt's EVK instances at ``sigma`` and the text prompts; pre
        states once per case (the unedited model's, shared by the methods), post states per method; final rows
        only (not lifelong checkpoints), the first ``MAP_CASES`` cases."""
        h: list[list[float]] = []
        out: dict[str, list[Any]] = {"kind": [], "when": [], "method": [], "key": []}
        cases: list[str] = []
        pre_seen: set[str] = set()
        for r in rows:
            if r.get("checkpoint") or r.get("method") not in methods:
                continue
            pre, post = r.get("pre", {}).get(self.name), r.get("post", {}).get(self.name)
            if not pre or not post:
                continue
            case = str(r["case_id"])
            if case not in cases:
                if len(cases) >= MAP_CASES:
                    continue
                cases.append(case)
            sel = [("evk", j, i["drift"]) for j, i in enumerate(pre["evk"])
                   if i["sigma"] == self.sigma and i["source"] == "edit"]
            sel += [("text", j, "text") for j in range(len(pre["text"]))]
            probes = [("post", post, r["method"])]
            if case not in pre_seen:
                pre_seen.add(case)
                probes.insert(0, ("pre", pre, None))
            for when, probe, method in probes:
                for part, j, kind in sel:
                    h.append(probe[part][j]["h"])
                    out["kind"].append(kind)
                    out["when"].append(when)
                    out["method"].append(method)
                    out["key"].append((case, part, j))
        return {"h": np.asarray(h, dtype=np.float64), **out}

    def map_coordinates(self, h: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, tuple[float, float] | None]:
        """2-D coordinates of the rows of ``h`` by the ``embedding_map`` projection, and for PCA the share of the
        variance on each axis (None for UMAP, which has no such share)."""
        if self.embedding_map == "umap":
            import umap  # optional; checked in __init__

            return np.asarray(umap.UMAP(n_components=2, random_state=seed).fit_transform(h)), None
        coords, explained = pca_2d(h)
        return coords, explained

    def figures(self, dataset: str, rows: Sequence[dict[str, Any]], methods: Sequence[str], *,
                seed: int = 0) -> list[SuiteFigure]:
        """With a σ sweep: Embedding Stability vs σ per method, overall and per drift type (where an editor's
        effect on the embedding neighbourhood fades; paper 004 §3.1.1 "by controlling the perturbation strength
        σ, EVK instances span semantic neighborhoods at varying distances"). The embedding map (paper 004 Fig. 5,
        module docstring) unless ``embedding_map: none``."""
        out: list[SuiteFigure] = []
        curves = self.stability_by_sigma(rows, methods) if self.sweep else {}
        if curves:
            from editscope.suites._evk_figures import stability_vs_sigma

            out.append(SuiteFigure(
                f"evk-sigma-{dataset}", f"EVK-Bench Embedding Stability vs σ ({dataset})",
                f"Mean cosine between pre- and post-edit states ({STATES[self.state][1]}, final token) on EVK "
                f"instances with drift N(0, σ²I), {self.instances_per_type} per drift type and σ; error bars are 95% "
                "CIs over cases; the dashed line is 1 (no change). Paper 004 eq 9 at every σ of the sweep.",
                stability_vs_sigma(curves, self.sigma)))
        if self.embedding_map != "none":
            points = self.embedding_points(rows, methods)
            if len(points["h"]) >= 3 and np.ptp(points["h"], axis=0).any():
                from editscope.suites._evk_figures import embedding_map

                coords, explained = self.map_coordinates(points["h"], seed=seed)
                name = "PCA" if self.embedding_map == "pca" else "UMAP"
                n_cases = len({k[0] for k in points["key"]})
                out.append(SuiteFigure(
                    f"evk-map-{dataset}", f"EVK instances before and after the edit, {name} ({dataset})",
                    f"Final-token states ({STATES[self.state][1]}) of the edit prompt's EVK instances (σ = "
                    f"{self.sigma:g}, coloured by drift type) and of the text prompts (grey) of {n_cases} cases, "
                    f"projected to 2-D by {name} fitted on all points shown; hollow: the unedited model (the same in "
                    "every panel), filled: after the edit, one panel per method, a thin line joins each instance's "
                    "two states. Cf. paper 004 Fig. 5 (UMAP there).",
                    embedding_map(coords, points, [m for m in methods if m in set(points["method"])], name,
                                  explained)))
        return out


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    """The rows of ``x`` on its first two principal axes, and the share of the total variance each axis explains.

    PCA (Pearson 1901): with ``X_c`` the row-centred matrix, the axes are the top eigenvectors of ``X_cᵀ X_c`` and the
    coordinates ``X_c V``; computed from whichever of ``X_cᵀ X_c`` (d × d) or ``X_c X_cᵀ`` (n × n, whose eigenvectors
    ``u`` give the coordinates ``u·√λ``) is smaller, in float64. Signs are fixed so that each axis's coordinate of
    largest magnitude is positive (an eigenvector's sign is arbitrary)."""
    xc = np.asarray(x, dtype=np.float64)
    xc = xc - xc.mean(axis=0)
    n, d = xc.shape
    if n <= d:
        lam, u = np.linalg.eigh(xc @ xc.T)
        lam, u = lam[::-1], u[:, ::-1]
        coords = u[:, :2] * np.sqrt(np.clip(lam[:2], 0.0, None))
    else:
        lam, v = np.linalg.eigh(xc.T @ xc)
        lam, v = lam[::-1], v[:, ::-1]
        coords = xc @ v[:, :2]
    lam = np.clip(lam, 0.0, None)
    total = float(lam.sum())
    if coords.shape[1] < 2:
        coords = np.pad(coords, ((0, 0), (0, 2 - coords.shape[1])))
    flip = np.sign(coords[np.abs(coords).argmax(axis=0), range(2)])
    coords = coords * np.where(flip == 0, 1.0, flip)
    share = tuple(float(v / total) if total > 0 else 0.0 for v in (lam[:2] if len(lam) >= 2 else [*lam, 0.0]))
    return coords, (share[0], share[1])


def _cosines(pre: list[list[float]], post: list[list[float]], fn) -> np.ndarray:
    """Row-wise cosines; rows that are identical are exactly 1 (cos(h, h) = 1, without rounding error)."""
    a, b = np.asarray(pre, dtype=np.float64), np.asarray(post, dtype=np.float64)
    cos = np.asarray(fn(a, b), dtype=np.float64)
    same = np.all(a == b, axis=1)
    cos[same] = 1.0
    return cos


__all__ = ["MAPS", "SOURCES", "STATES", "TEXT_SOURCES", "EvkSuite", "pca_2d"]
