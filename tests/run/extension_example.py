"""What a user writes to extend editscope, all in one module: an editor, a loss-term plug-in, a metric, a suite
and an evaluation protocol, each registered with one line. A run config loads it with
``plugin_modules: [tests.run.extension_example]`` (``tests/run/test_extension.py`` runs it end to end).

* ``half_rome``: ROME's update scaled by 0.5 (ROME's hparams, its v* optimisation, so plug-ins apply);
* ``ridge``: a plug-in adding ``weight · ‖δ‖²`` on the v* offset δ to the loss;
* ``p_new``: a metric, P(target_new | prompt) = exp(sum of the target's token log-probs), before and after;
* ``p_new``: the suite that emits it on every case's rewrite prompt;
* ``said``: an evaluation protocol -- the model's greedy answer to the rewrite prompt (at most 4 tokens, cut at a
  full stop), judged whole by exact match against target_new; it declares ``p_new`` as its teacher-forced
  counterpart, so the summary pairs the two per case;
* ``quoted``: an editor that is not a weight delta -- a context edit stating each new fact as a quotation before
  the prompt (its store of facts is the sequential state);
* ``doubled``: a memory editor -- a one-layer codebook whose value is twice the layer's own output for the edited
  prompt, in force for that prompt alone (radius 0);
* ``olmo``: a model family -- the architecture map of OLMo 1 (``config.model_type`` "olmo", which editscope does not
  ship), and :func:`save_tiny_olmo`, a tiny random-init OLMo saved as a local folder a run config names as its model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from editscope.data.records import Case
from editscope.edit import rome
from editscope.edit.context import key_statistics
from editscope.edit.context_edit import ContextEdit, ContextHParams, ContextStore, fact_text
from editscope.edit.grace import GraceCodebook, GraceHParams
from editscope.edit.memory import MemoryEdit
from editscope.edit.objective import Term, VStep
from editscope.edit.plugins import PluginHParams, PluginSpec, register_plugin
from editscope.edit.registry import Editor, register_editor
from editscope.lm.archs import ARCHS, ArchMap
from editscope.lm.tiny import gpt2_tokenizer
from editscope.metrics.answers import JUDGES
from editscope.metrics.registry import MetricSpec
from editscope.suites import register_suite
from editscope.suites.base import Suite

SCALE = 0.5


# -- an editor ---------------------------------------------------------------------------------------------------
def half_rome(bundle, requests, hp, state, *, engine, runtime, extra_terms=(), presolved=None):
    """ROME's ΔW (same hparams, same plug-in terms, same presolved statistics), times 0.5."""
    deltas, info = rome.compute(bundle, requests, hp, state, engine=engine, runtime=runtime, extra_terms=extra_terms,
                                presolved=presolved)
    return {name: SCALE * delta for name, delta in deltas.items()}, {**info, "scale": SCALE}


HALF_ROME = register_editor(Editor("half_rome", "HalfROME", rome.RomeHParams, half_rome, optimises=True,
                                   presolve=key_statistics))


# -- editors that are not weight deltas ------------------------------------------------------------------------------
@dataclass
class QuotedHParams(ContextHParams):
    method = "quoted"
    instruction: str = "Quoted from the latest records:\n"


def quoted_edit(bundle, requests, hp, store) -> ContextEdit:
    """Every fact the store holds, quoted, before every prompt."""
    return ContextEdit(method="quoted", hparams=hp.to_dict(), fingerprint=bundle.base_fingerprint,
                       facts=store.facts, instruction=hp.instruction, model_name=bundle.name)


def quoted(bundle, requests, hp, state, **_):
    state.add([f'"{fact_text(r)}"' for r in requests])
    return quoted_edit(bundle, requests, hp, state), {"quoted": len(state.facts)}


QUOTED = register_editor(Editor("quoted", "Quoted", QuotedHParams, quoted, optimises=False, writes="",
                                state_class=ContextStore, kind="context",
                                reinstate=lambda b, hp, s: quoted_edit(b, [], hp, s)))


@dataclass
class DoubledHParams(GraceHParams):
    method = "doubled"


def doubled_edit(bundle, hp, book) -> MemoryEdit:
    module = bundle.arch.layer_module_path(hp.layers[0], "mlp_out")
    width = bundle.model.get_submodule(module).weight.shape
    empty = book.size == 0
    return MemoryEdit(method="doubled", hparams=hp.to_dict(), fingerprint=bundle.base_fingerprint, module=module,
                      keys=torch.zeros(0, width[1]) if empty else book.keys,  # host
                      values=torch.zeros(0, width[0]) if empty else book.values,  # host
                      radii=torch.zeros(0, dtype=torch.float64) if empty else book.radii,  # host
                      labels=book.labels, model_name=bundle.name)


def doubled(bundle, requests, hp, state, *, engine, **_):
    """One codebook entry per request: key = the projection's input at the prompt's last token, value = twice its
    output there, radius 0."""
    module = bundle.model.get_submodule(bundle.arch.layer_module_path(hp.layers[0], "mlp_out"))
    for request in requests:
        key = engine.hidden_states([request.text], hp.layers, kind="mlp_key")[0, 0]
        with torch.no_grad():
            own = module.forward(key[None])[0]
        state._add(key.float().cpu(), request.target_new, 0.0, 2 * own)
    return doubled_edit(bundle, hp, state), {"entries": state.size}


DOUBLED = register_editor(Editor("doubled", "Doubled", DoubledHParams, doubled, optimises=False, writes="",
                                 state_class=GraceCodebook, kind="memory",
                                 reinstate=lambda b, hp, s: doubled_edit(b, hp, s)))


# -- a loss-term plug-in -----------------------------------------------------------------------------------------
@dataclass
class RidgeHParams(PluginHParams):
    weight: float = 0.0


@dataclass
class RidgeTerm(Term):
    weight: float
    name: str = "ridge"

    def __call__(self, step: VStep) -> torch.Tensor:
        if step.delta is None:  # weight-optimising editors have no δ
            return step.hidden.new_zeros(())
        return self.weight * step.delta.pow(2).sum()


RIDGE = register_plugin(PluginSpec("ridge", "Ridge", RidgeHParams, lambda hp: RidgeTerm(hp.weight),
                                   "weight · ‖δ‖² on the v* offset δ (extension example)"))


# -- a metric (pure) and its declaration -------------------------------------------------------------------------
def p_new(logprob_sum: float) -> float:
    """P(target_new | prompt): the exponential of the summed token log-probabilities of the target."""
    return math.exp(logprob_sum)


P_NEW = MetricSpec("p_new", "example", "exp(sum log P(target_new tokens | prompt))", True, (0.0, 1.0), "prob",
                   description="probability of the new target after the rewrite prompt")


# -- a suite -----------------------------------------------------------------------------------------------------
class PNewSuite(Suite):
    """P(target_new | rewrite prompt) before and after the edit."""

    name = "p_new"
    metrics_declared = (P_NEW,)

    def probe_many(self, engine, cases: Sequence[Case]) -> list[dict[str, Any]]:
        scores = engine.score([(c.request.text, c.request.target_new) for c in cases])
        return [{"prompts": [{"prompt": c.request.text, "role": "rewrite", "candidates": [
            {"text": c.request.target_new, "kind": "new", "logprob_sum": s.sum, "n_tokens": s.n_tokens}]}]}
            for c, s in zip(cases, scores, strict=True)]

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        pre_lp, post_lp = (p["prompts"][0]["candidates"][0]["logprob_sum"] for p in (pre, post))
        return {"p_new_pre": p_new(pre_lp), "p_new_post": p_new(post_lp)}


register_suite(PNewSuite)


# -- an evaluation protocol --------------------------------------------------------------------------------------
SAID = MetricSpec("said", "example", "exact match of the greedy answer with target_new", True, (0.0, 1.0), "share",
                  description="the edit's new target is what the model says")


class SaidSuite(Suite):
    """Does the model say the new target? Its greedy answer to the rewrite prompt, judged by exact match."""

    name = "said"
    metrics_declared = (SAID,)
    counterparts = {"p_new": (("p_new_post", "said_post"),)}
    TOKENS = 4

    @property
    def protocol(self) -> dict[str, str]:
        return {"name": "said", "note": f"greedy answer of at most {self.TOKENS} tokens, exact match"}

    def probe_many(self, engine, cases: Sequence[Case]) -> list[dict[str, Any]]:
        answers = engine.answer([c.request.text for c in cases], max_new_tokens=self.TOKENS, stop=(".",))
        return [{"prompts": [{"prompt": c.request.text, "role": "rewrite", "answer": a,
                              "gold": [c.request.target_new]}]} for c, a in zip(cases, answers, strict=True)]

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        judge = JUDGES["exact_match"]
        said = [judge(q["prompt"], q["answer"], q["gold"]) for q in (pre["prompts"][0], post["prompts"][0])]
        return {"said_pre": said[0], "said_post": said[1]}


register_suite(SaidSuite)


# -- a model family ----------------------------------------------------------------------------------------------
#: OLMo 1: LLaMA's module names; its layer norms have no parameters. Pre-norm, so the MLP output adds linearly to the
#: residual stream (no ``mlp_post_norm``) and every editor accepts it. Hook points follow from the paths.
OLMO = ARCHS.register(ArchMap(
    family="olmo", model_types=("olmo",), base="model", embed="model.embed_tokens", blocks="model.layers",
    attn="self_attn", attn_out="self_attn.o_proj", mlp="mlp", mlp_in="mlp.up_proj", mlp_out="mlp.down_proj",
    final_norm="model.norm", lm_head="lm_head", notes="OLMo 1: pre-norm gated MLP, layer norms without parameters"))


def save_tiny_olmo(folder: Path, seed: int = 0) -> Path:
    """A tiny random-init OLMo 1 (4 layers, hidden 64) with GPT-2's tokenizer, saved as a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, OlmoConfig

    config = OlmoConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=256, vocab_size=50257, bos_token_id=50256,
                        eos_token_id=50256, pad_token_id=None)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # a wider init than the default, so log-probs differ between tokens
        generator = torch.Generator().manual_seed(seed)
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.08)
    model.save_pretrained(folder)
    gpt2_tokenizer().save_pretrained(folder)
    return folder
