"""KN — knowledge neurons (Dai et al. 2022, "Knowledge Neurons in Pretrained Transformers", ACL; the KN baseline
of paper 003, ../shared/papers/003 §7 and App. B.1).

1. **Locate** (Dai et al. §3.2-3.3): for each prompt expressing the fact, integrated gradients of P(old answer's
   first token | prompt) over the MLP key activations of ``hp.layers`` (:func:`editscope.locate.knowledge_neurons`,
   eq. 2-3); the prompt's *coarse* neurons are those with Attr > t · max Attr (``adaptive_threshold`` t, the max
   over the searched layers). The *knowledge neurons* are the coarse neurons shared by more than a share p of the
   prompts (``share``). Prompts are ``prefix + request prompt`` for each of ``prefixes`` (an edit request carries
   no paraphrases; templates stand in for Dai et al.'s paraphrased prompts).
2. **Update** (Dai et al. §5.1, "Updating Facts"): for each knowledge neuron i, its value slot — column i of the
   MLP down projection W (out, in) — moves from the old answer's embedding towards the new one's:
   ``W[:, i] <- W[:, i] - λ1·t + λ2·t'``, with t, t' the embeddings of the old and new answers' first tokens.
   Dai et al. give no λ; the reference code (knowledge-neurons, used by EasyEdit) uses λ1 = λ2 = 2 and the
   *input* word embeddings of the model's greedy prediction (old) and the target. Here ``embedding: output``
   (default) takes the rows of the LM head (the direction that raises the answer's logit; the same rows for tied
   models), ``input`` the token embeddings; ``old_answer: target_true`` (default) the request's true answer,
   ``argmax`` the model's greedy next token as the reference does.
   ``activation_sign`` (default on; off = the reference): the update is multiplied by sign(k_i), the sign of the
   neuron's key activation at the first prompt's last token. A neuron adds k_i·v_i to the residual; Dai et al.'s
   GELU keys of located neurons are positive, but gated MLPs (SwiGLU: LLaMA, SmolLM2) have negative keys with
   positive attribution, where the unsigned update pushes the output *away* from the new answer (measured on
   SmolLM2: the target's margin fell on both CounterFact cases tried).

No loss is optimised, so loss-term plug-ins (APP) do not apply: the registry declares ``optimises=False``.

Speed: IG is nearly all of an edit's time. On SmolLM2 (30 layers, m = 20, 3 prompts; 2 heavily shared cores) one
edit took 260-320 s with whole-prompt IG rows and 87-107 s with one-token rows on a cached prefix (the default of
:func:`editscope.locate.knowledge_neurons`, same numbers), IG still > 99% of it. The attributions depend on the
weights, the prompts and the IG settings only, not on λ, t, p or the embedding choice, so they are cached on disk
(``EDITSCOPE_HOME/kn/``, keyed by the weights' current fingerprint and those inputs): a second edit of the same
fact on the same weights — another λ in ``editscope tune``, a rerun — skips IG and gives the same ΔW.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from editscope.atomic import atomic_write
from editscope.data.records import EditRequest
from editscope.edit.hparams import HParams
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import run_until
from editscope.locate import LocatePrompt, encode_prompt
from editscope.locate.attribution import knowledge_neurons
from editscope.locate.prompt import answer_prob
from editscope.paths import home
from editscope.progress import report

OLD_ANSWERS = ("target_true", "argmax")
EMBEDDINGS = ("output", "input")


@dataclass
class KNHParams(HParams):
    """``layers``: where neurons are searched (Dai et al.: all layers); ``steps``: Riemann steps m of the
    integral (Dai et al.: 20); ``adaptive_threshold``: t (Dai et al.: 0.2); ``share``: p, a neuron must be coarse
    in more than p·(number of prompts) prompts; ``max_neurons``: keep at most this many (highest summed
    attribution; None: no cap)."""

    method = "kn"
    PLAN_LAYERS = "all"  # a plan without a file: neurons searched in every layer, as Dai et al.
    steps: int = 20
    adaptive_threshold: float = 0.2
    share: float = 0.5
    prefixes: list[str] = field(default_factory=lambda: [""])
    lambda_old: float = 2.0
    lambda_new: float = 2.0
    old_answer: str = "target_true"
    embedding: str = "output"
    max_neurons: int | None = None
    activation_sign: bool = True

    #: adaptive_threshold: t as a share of the largest attribution; share: p; lambda_old/lambda_new: the multiples
    #: of the answer embeddings subtracted/added (a negative one reverses the edit).
    RANGES = {"steps": "[1, 10000]", "adaptive_threshold": "[0, 1]", "share": "[0, 1)", "lambda_old": "[0, 1e3]",
              "lambda_new": "[0, 1e3]", "max_neurons": "[1, inf)"}
    #: KN's λ: the reference code's 2 over-edits small models (neighbours flip with the edit; on SmolLM2 every λ of
    #: 0.1 or more broke NS), so the grid reaches two decades lower; layers: all are searched
    #: λ below 0.01 is for models whose neurons move the answer more: Gemma3-270M chose λ_new 0.003.
    TUNABLE = {"lambda_old": (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 2.0),
               "lambda_new": (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 2.0)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        if not self.prefixes:
            raise EditscopeError(f"{where}: key 'prefixes': at least one prefix ('' = the bare prompt)")
        if self.old_answer not in OLD_ANSWERS:
            raise EditscopeError(f"{where}: key 'old_answer': one of {', '.join(OLD_ANSWERS)}, got {self.old_answer!r}")
        if self.embedding not in EMBEDDINGS:
            raise EditscopeError(f"{where}: key 'embedding': one of {', '.join(EMBEDDINGS)}, got {self.embedding!r}")


def coarse_neurons(attr: np.ndarray, threshold: float) -> np.ndarray:
    """Dai et al. §3.3: the mask of neurons whose attribution exceeds ``threshold`` × the maximum attribution."""
    top = float(attr.max())
    if top <= 0:
        return np.zeros(attr.shape, dtype=bool)
    return attr > threshold * top


def select_neurons(attrs: Sequence[np.ndarray], hp: KNHParams) -> list[tuple[int, int]]:
    """Knowledge neurons (Dai et al. §3.3): coarse in more than ``hp.share`` of the prompts; ``attrs`` are per prompt,
    [n searched layers, mlp]; returns (layer, neuron) pairs in model layer numbers, strongest first."""
    counts = sum(coarse_neurons(a, hp.adaptive_threshold).astype(np.int64) for a in attrs)
    keep = counts > hp.share * len(attrs)
    total = np.sum(attrs, axis=0)
    rows, cols = np.nonzero(keep)
    order = np.argsort(-total[rows, cols], kind="stable")
    if hp.max_neurons is not None:
        order = order[: hp.max_neurons]
    return [(hp.layers[int(rows[i])], int(cols[i])) for i in order]


def answer_embeddings(bundle, engine: ScoringEngine, hp: KNHParams) -> torch.Tensor:
    """The [vocab, hidden] embedding table whose rows are the answers' directions (see the module docstring)."""
    path = bundle.arch.lm_head if hp.embedding == "output" else bundle.arch.embed
    return bundle.model.get_submodule(path).weight.detach()


def key_signs(engine: ScoringEngine, prompt: LocatePrompt, layers: Sequence[int]) -> torch.Tensor:
    """sign(k) of the MLP keys of ``layers`` at the prompt's last token, [len(layers), mlp]."""
    names = [f"blocks.{layer}.mlp_key" for layer in layers]
    with torch.no_grad():
        store = run_until(engine.model, engine.arch, names,
                          lambda: answer_prob(engine, torch.tensor([prompt.ids], device=engine.bundle.device),
                                              prompt.answer_id))
    return torch.stack([torch.sign(store[name][0, prompt.last].float()) for name in names])


def _attributions(engine: ScoringEngine, request: EditRequest, hp: KNHParams
                  ) -> tuple[list[np.ndarray], int, torch.Tensor]:
    """IG attributions per prompt ([len(hp.layers), mlp] each), the old answer's token id and the key signs of the
    first prompt ([len(hp.layers), mlp])."""
    attrs, old_id, signs = [], None, None
    answer = request.target_true if hp.old_answer == "target_true" else None
    for prefix in hp.prefixes:
        prompt = encode_prompt(engine, prefix + request.prompt, request.subject, answer)
        if old_id is None:  # the first prompt fixes the old answer token (argmax: its greedy token) for all
            old_id = prompt.answer_id
            signs = key_signs(engine, prompt, hp.layers)
        prompt = dataclasses.replace(prompt, answer_id=old_id)
        with torch.enable_grad():
            result = knowledge_neurons(engine, prompt, steps=hp.steps, layers=list(hp.layers))
        attrs.append(np.asarray(result.neurons[hp.layers], dtype=np.float32))
    return attrs, int(old_id), signs


def attribution_cache_path(engine: ScoringEngine, request: EditRequest, hp: KNHParams):
    """Where :func:`_attributions` of ``request`` under ``hp`` on the weights as they are now is cached: keyed by
    the weights' current fingerprint (edited weights have another) and every input the attributions depend on."""
    key = {"prompt": request.prompt, "subject": request.subject, "target_true": request.target_true,
           "layers": list(hp.layers), "steps": hp.steps, "prefixes": list(hp.prefixes), "old_answer": hp.old_answer}
    digest = hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=12).hexdigest()
    return home() / "kn" / engine.bundle.fingerprint / f"{digest}.safetensors"


def cached_attributions(engine: ScoringEngine, request: EditRequest, hp: KNHParams
                        ) -> tuple[list[np.ndarray], int, torch.Tensor, bool]:
    """:func:`_attributions`, read from the disk cache when present (last value: whether it was); a damaged cache
    file is recomputed and rewritten."""
    path = attribution_cache_path(engine, request, hp)
    if path.is_file():
        try:
            with safe_open(str(path), "pt") as f:
                attrs = f.get_tensor("attributions")
                signs = f.get_tensor("signs")
                old_id = int(f.metadata()["old_id"])
            return [a.numpy() for a in attrs], old_id, signs, True  # host: read from a file
        except (SafetensorError, OSError, KeyError, ValueError):
            pass
    attrs, old_id, signs = _attributions(engine, request, hp)
    tensors = {"attributions": torch.from_numpy(np.stack(attrs)).contiguous(), "signs": signs.contiguous()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata={"old_id": str(old_id)}))
    return attrs, old_id, signs, False


def locate_request(engine: ScoringEngine, request: EditRequest, hp: KNHParams
                   ) -> tuple[list[tuple[int, int]], int, torch.Tensor, bool]:
    """The knowledge neurons of ``request``'s old fact, the old answer's token id, the key signs of the first
    prompt ([len(hp.layers), mlp]) and whether the attributions came from the cache."""
    if hp.old_answer == "target_true" and request.target_true is None:
        raise EditscopeError(f"kn: request {request.text!r} has no target_true (set old_answer: argmax to use the "
                             "model's greedy prediction)")
    attrs, old_id, signs, cached = cached_attributions(engine, request, hp)
    return select_neurons(attrs, hp), old_id, signs, cached


def compute(bundle, requests: Sequence[EditRequest], hp: KNHParams, state=None, *, engine: ScoringEngine,
            runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()) -> tuple[dict[str, torch.Tensor], dict]:
    if extra_terms:  # the registry refuses plug-ins first (optimises=False); this guards direct calls
        raise EditscopeError("kn does not optimise a loss, so loss-term plug-ins cannot be attached to it")
    table = answer_embeddings(bundle, engine, hp)
    params = dict(bundle.model.named_parameters())
    out_in: dict[int, torch.Tensor] = {}
    info: dict = {"neurons": [], "old_token": [], "new_token": [], "attributions_cached": []}
    for i, request in enumerate(requests, 1):
        report("kn: locating the neurons of request", i, len(requests))
        neurons, old_id, signs, cached = locate_request(engine, request, hp)
        _, cont = engine.encode_pair(request.text, request.target_new)
        new_id = int(cont[0])
        move = hp.lambda_new * table[new_id].float() - hp.lambda_old * table[old_id].float()
        for layer, neuron in neurons:
            if layer not in out_in:
                weight = bundle.arch.as_out_in(params[bundle.arch.weight_name(layer)])
                out_in[layer] = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
            sign = float(signs[hp.layers.index(layer), neuron]) if hp.activation_sign else 1.0
            out_in[layer][:, neuron] += (sign * move).to(out_in[layer].dtype)
        info["neurons"].append([[layer, neuron] for layer, neuron in neurons])
        info["old_token"].append(old_id)
        info["new_token"].append(new_id)
        info["attributions_cached"].append(cached)
    deltas = {bundle.arch.weight_name(layer): bundle.arch.from_out_in(d).contiguous() for layer, d in out_in.items()}
    return deltas, info
