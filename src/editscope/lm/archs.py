"""Architecture facts as data: one small map per model family (module paths, dimensions, hook points, quirks).

The family is detected from ``config.model_type`` only; a model name never decides anything. All module
paths are relative to the ``*ForCausalLM`` object; per-layer paths are relative to one block. As pyvene keeps
one ``type_to_module_mapping`` per architecture, each map has its named hook points (:data:`HookPoint`: module
path, ``"input"`` or ``"output"``), derived from its module paths, and its family quirks (Gemma's final logit
soft-capping, sliding window, post-MLP norm and scaled embeddings) as fields that the engine and the hooks read.
``notes`` says, in words, what else sets a family apart (q/k norms, fused projections, parallel residual, layers
without rotary embeddings): facts a reader of ``editscope models --families`` needs, which no code branches on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal, NamedTuple

from editscope.errors import EditscopeError
from editscope.registry import Registry

if TYPE_CHECKING:  # the maps are data: reading one (a plan, a config check) loads no torch
    import torch
    from torch import nn


class HookPoint(NamedTuple):
    """Where a named hook point lives: a module path and whether the point is that module's first input or its
    output. ``path`` is relative to the block for ``blocks.{i}.*`` points ("" is the block itself) and to the
    model otherwise. ``heads`` marks a flat [.., n_heads * head_dim] tensor that :func:`editscope.lm.hooks.capture`
    returns as [.., n_heads, head_dim] (heads are contiguous in every supported family)."""

    path: str
    where: Literal["input", "output"]
    heads: bool = False


BLOCK_POINT_PREFIX = "blocks.{i}."


def _hook_points(embed: str, attn_out: str, mlp: str, mlp_in: str, mlp_out: str, final_norm: str,
                 mlp_gate: str | None) -> dict[str, HookPoint]:
    """The hook points every family has, from its module paths (see :mod:`editscope.lm.hooks` for meanings), plus
    the input and output of the MLP's up projection and, in a gated MLP, of its gate projection (what an editor of
    those matrices reads: its keys and the gradient at its output)."""
    gate = {} if mlp_gate is None else {"blocks.{i}.gate_key": HookPoint(mlp_gate, "input"),
                                        "blocks.{i}.gate_out": HookPoint(mlp_gate, "output")}
    return {
        "embed": HookPoint(embed, "output"),
        "final": HookPoint(final_norm, "output"),
        "blocks.{i}.resid_pre": HookPoint("", "input"),
        "blocks.{i}.resid_post": HookPoint("", "output"),
        "blocks.{i}.attn_out": HookPoint(attn_out, "output"),
        "blocks.{i}.attn_heads": HookPoint(attn_out, "input", heads=True),
        "blocks.{i}.mlp_key": HookPoint(mlp_out, "input"),
        "blocks.{i}.mlp_out": HookPoint(mlp, "output"),
        "blocks.{i}.up_key": HookPoint(mlp_in, "input"),
        "blocks.{i}.up_out": HookPoint(mlp_in, "output"),
        **gate,
    }


#: The MLP matrices an editor may write, by the names hparams use (``modules: [gate, up, down]``) -> the
#: :class:`ArchMap` field holding each one's path: ``down`` the output projection (LLaMA's down_proj, GPT-2's
#: c_proj), whose input is the key ROME/MEMIT edit against; ``up`` the input projection (up_proj, c_fc; Phi-3's fused
#: gate_up_proj); ``gate`` the gate projection of a gated MLP (gate_proj; none in GPT-2, GPT-J, GPT-NeoX or Phi-3).
MLP_MATRICES: dict[str, str] = {"gate": "mlp_gate", "up": "mlp_in", "down": "mlp_out"}

#: Each matrix's (key, output) hook points: its input and the tensor whose gradient an update is computed from
#: (for ``down``, the MLP's output, which is the down projection's output in every family).
MATRIX_POINTS: dict[str, tuple[str, str]] = {"gate": ("blocks.{i}.gate_key", "blocks.{i}.gate_out"),
                                            "up": ("blocks.{i}.up_key", "blocks.{i}.up_out"),
                                            "down": ("blocks.{i}.mlp_key", "blocks.{i}.mlp_out")}


@dataclass(frozen=True)
class ArchMap:
    """Where things live in one architecture family.

    ``mlp_out`` is the MLP's output (down) projection: its *input* is the key activation k that ROME/MEMIT
    edit against, its weight W maps k to the MLP's contribution to the residual stream. ``transposed`` is
    True when weights are stored as (in, out) — GPT-2's Conv1D — instead of torch's (out, in).

    Family quirks (None when the family has none): ``softcap_key`` names the config key of the final logit
    soft-capping c (logits <- c * tanh(logits / c), Gemma 2/3); ``sliding_window_key`` the config key of the
    local-attention window (a custom attention mask bypasses it, so the engine refuses longer rows);
    ``mlp_post_norm`` the block-relative path of a norm applied to the MLP output before it joins the residual
    (the post_feedforward_layernorm of Gemma 2/3 and OLMo 2: the residual update is not linear in the MLP output);
    ``embed_scale`` how the embedding module scales the token table ("sqrt_hidden": x sqrt(d), Gemma).
    ``start_token_keys`` are the tokenizer attributes tried in order for the token an empty context is scored
    from (BOS, else EOS: GPT-2's <|endoftext|> convention, as lm-evaluation-harness's rolling log-likelihood).
    ``mlp_in_parts`` is how many matrices the MLP input projection stacks along its output rows (2: Phi-3's fused
    ``gate_up_proj`` holds the gate and up projections, so its weight is (2 * mlp_size, d));
    ``n_kv_heads_keys`` the config keys of the key/value head count (grouped-query attention; unset: n_heads);
    ``mlp_gate`` the gate projection of a gated MLP (None where the family has none or fuses it into ``mlp_in``).
    """

    family: str
    model_types: tuple[str, ...]
    base: str
    embed: str
    blocks: str
    attn: str
    attn_out: str
    mlp: str
    mlp_in: str
    mlp_out: str
    final_norm: str
    lm_head: str
    transposed: bool = False
    n_layers_keys: tuple[str, ...] = ("num_hidden_layers",)
    hidden_keys: tuple[str, ...] = ("hidden_size",)
    mlp_keys: tuple[str, ...] = ("intermediate_size",)
    n_heads_keys: tuple[str, ...] = ("num_attention_heads",)
    head_dim_keys: tuple[str, ...] = ("head_dim",)
    softcap_key: str | None = None
    sliding_window_key: str | None = None
    mlp_post_norm: str | None = None
    embed_scale: Literal["sqrt_hidden"] | None = None
    start_token_keys: tuple[str, ...] = ("bos_token_id", "eos_token_id")
    mlp_in_parts: int = 1
    n_kv_heads_keys: tuple[str, ...] = ("num_key_value_heads",)
    mlp_gate: str | None = None
    notes: str = ""

    @cached_property
    def hook_points(self) -> Mapping[str, HookPoint]:
        """Name template -> where (``blocks.{i}.`` names are per block), derived from the module paths above, so a
        map states each path once."""
        return _hook_points(self.embed, self.attn_out, self.mlp, self.mlp_in, self.mlp_out, self.final_norm,
                            self.mlp_gate)

    # -- dimensions ---------------------------------------------------------------------------------
    def _config_value(self, config, keys: tuple[str, ...]) -> int | None:
        for key in keys:
            value = getattr(config, key, None)
            if value is not None:
                return int(value)
        return None

    def n_layers(self, config) -> int:
        return int(self._config_value(config, self.n_layers_keys))

    def hidden_size(self, config) -> int:
        return int(self._config_value(config, self.hidden_keys))

    def mlp_size(self, config) -> int:
        value = self._config_value(config, self.mlp_keys)
        # GPT-2 / GPT-J leave n_inner unset and use 4 * hidden.
        return value if value is not None else 4 * self.hidden_size(config)

    def n_heads(self, config) -> int:
        return int(self._config_value(config, self.n_heads_keys))

    def n_kv_heads(self, config) -> int:
        """Key/value heads (grouped-query attention); the query head count where the config sets none."""
        value = self._config_value(config, self.n_kv_heads_keys)
        return value if value is not None else self.n_heads(config)

    def head_dim(self, config) -> int:
        """Per-head width of the attention output projection's input (Gemma sets it apart from d / n_heads)."""
        value = self._config_value(config, self.head_dim_keys)
        return value if value is not None else self.hidden_size(config) // self.n_heads(config)

    # -- family quirks ------------------------------------------------------------------------------
    def _quirk(self, config, key: str | None) -> float | None:
        # A declared key may be unset for one model type of a family (LLaMA has no window, Mistral does).
        value = None if key is None else getattr(config, key, None)
        return None if value is None else float(value)

    def final_logit_softcap(self, config) -> float | None:
        """The final logit soft-capping c, or None (no capping)."""
        value = self._quirk(config, self.softcap_key)
        return value if value else None

    def sliding_window(self, config) -> int | None:
        """The local attention window in tokens, or None."""
        value = self._quirk(config, self.sliding_window_key)
        return int(value) if value else None

    def embed_multiplier(self, config) -> float:
        """Factor between the embedding module's output and its weight rows (Gemma: sqrt(d))."""
        return math.sqrt(self.hidden_size(config)) if self.embed_scale == "sqrt_hidden" else 1.0

    def start_token_id(self, tokenizer) -> int:
        """The token an empty context is scored from (see the class docstring)."""
        for key in self.start_token_keys:
            value = getattr(tokenizer, key)
            if value is not None:
                return int(value)
        raise EditscopeError(f"tokenizer has none of {', '.join(self.start_token_keys)}: cannot score an empty context")

    # -- module access ------------------------------------------------------------------------------
    def block_path(self, layer: int) -> str:
        return f"{self.blocks}.{layer}"

    def matrix_part(self, matrix: str) -> str:
        """The field (``part``) holding the MLP matrix ``matrix`` (a key of :data:`MLP_MATRICES`); one line naming
        the family where it has no such matrix."""
        part = MLP_MATRICES.get(matrix)
        if part is None:
            raise EditscopeError(f"unknown MLP matrix {matrix!r}; known: {', '.join(MLP_MATRICES)}")
        if getattr(self, part) is None:
            raise EditscopeError(f"the {self.family} architecture has no separate {matrix} projection "
                                 f"(its MLP matrices: {', '.join(self.matrices())})")
        return part

    def matrices(self) -> list[str]:
        """The MLP matrices (keys of :data:`MLP_MATRICES`) this family has."""
        return [m for m, part in MLP_MATRICES.items() if getattr(self, part) is not None]

    def layer_module_path(self, layer: int, part: str) -> str:
        """Full path of a per-layer part: ``part`` is one of attn, attn_out, mlp, mlp_in, mlp_gate, mlp_out."""
        return f"{self.block_path(layer)}.{getattr(self, part)}"

    def weight_name(self, layer: int, part: str = "mlp_out") -> str:
        """Parameter name (as in ``named_parameters``) of a per-layer part's weight."""
        return self.layer_module_path(layer, part) + ".weight"

    def module(self, model: nn.Module, path: str) -> nn.Module:
        return model.get_submodule(path)

    def block(self, model: nn.Module, layer: int) -> nn.Module:
        return model.get_submodule(self.block_path(layer))

    def layer_module(self, model: nn.Module, layer: int, part: str) -> nn.Module:
        return model.get_submodule(self.layer_module_path(layer, part))

    def as_out_in(self, weight: torch.Tensor) -> torch.Tensor:
        """View a stored weight in torch's (out, in) orientation."""
        return weight.T if self.transposed else weight

    def from_out_in(self, delta: torch.Tensor) -> torch.Tensor:
        """Turn an (out, in) matrix into the stored orientation of this family."""
        return delta.T if self.transposed else delta


_ROTARY_DECODER = dict(
    base="model",
    embed="model.embed_tokens",
    blocks="model.layers",
    attn="self_attn",
    attn_out="self_attn.o_proj",
    mlp="mlp",
    mlp_in="mlp.up_proj",
    mlp_gate="mlp.gate_proj",
    mlp_out="mlp.down_proj",
    final_norm="model.norm",
    lm_head="lm_head",
)

ARCHS: Registry[ArchMap] = Registry("architecture family", expected=ArchMap, name_of=lambda a: a.family,
                                     describe=lambda a: "model_type " + ", ".join(a.model_types))
"""Family name -> :class:`ArchMap` (add one with ``ARCHS.register(ArchMap(...))``)."""

for _arch in (
    ArchMap(
        family="gpt2",
        model_types=("gpt2",),
        base="transformer",
        embed="transformer.wte",
        blocks="transformer.h",
        attn="attn",
        attn_out="attn.c_proj",
        mlp="mlp",
        mlp_in="mlp.c_fc",
        mlp_out="mlp.c_proj",
        final_norm="transformer.ln_f",
        lm_head="lm_head",
        transposed=True,
        n_layers_keys=("n_layer",),
        hidden_keys=("n_embd",),
        mlp_keys=("n_inner",),
        n_heads_keys=("n_head",),
        notes="Conv1D weights stored (in, out)",
    ),
    ArchMap(
        family="gptj",
        model_types=("gptj",),
        base="transformer",
        embed="transformer.wte",
        blocks="transformer.h",
        attn="attn",
        attn_out="attn.out_proj",
        mlp="mlp",
        mlp_in="mlp.fc_in",
        mlp_out="mlp.fc_out",
        final_norm="transformer.ln_f",
        lm_head="lm_head",
        n_layers_keys=("n_layer",),
        hidden_keys=("n_embd",),
        mlp_keys=("n_inner",),
        n_heads_keys=("n_head",),
        notes="parallel attention + MLP residual, partial rotary",
    ),
    # LLaMA, Mistral and Qwen2 share module names (checked on tiny configs with transformers 5).
    # LLaMA has no window; Mistral and Qwen2 configs may set one. Llama 3.x's rope scaling ("llama3" rope type:
    # frequencies rescaled once, by position-independent factors) lives inside the rotary embedding: nothing here.
    ArchMap(family="llama", model_types=("llama", "mistral", "qwen2"), sliding_window_key="sliding_window",
            notes="LLaMA 1-3.x (incl. llama3 rope scaling), Mistral, Qwen2/2.5: pre-norm, gated MLP",
            **_ROTARY_DECODER),
    ArchMap(
        family="gemma3",
        model_types=("gemma3_text",),
        softcap_key="final_logit_softcapping",
        sliding_window_key="sliding_window",
        mlp_post_norm="post_feedforward_layernorm",
        embed_scale="sqrt_hidden",
        notes="scaled embeddings, norms before and after attention and MLP, local/global layers, q/k norms",
        **_ROTARY_DECODER,
    ),
    # Qwen3: LLaMA's module names plus per-head RMS norms of queries and keys inside the attention (q_norm,
    # k_norm); the small sizes (0.6B-4B) tie the LM head to the embeddings. A window only with use_sliding_window.
    ArchMap(family="qwen3", model_types=("qwen3",), sliding_window_key="sliding_window",
            notes="per-head q/k RMS norms; tied embeddings in the small sizes", **_ROTARY_DECODER),
    # Gemma 2: as Gemma 3 (scaled embeddings, a norm after the MLP, local/global layers, final logit
    # soft-capping) plus soft-capping of the attention logits, which transformers computes in eager attention.
    ArchMap(
        family="gemma2",
        model_types=("gemma2",),
        softcap_key="final_logit_softcapping",
        sliding_window_key="sliding_window",
        mlp_post_norm="post_feedforward_layernorm",
        embed_scale="sqrt_hidden",
        notes="scaled embeddings, norms before and after attention and MLP, local/global layers, attention and final "
              "logit soft-capping",
        **_ROTARY_DECODER,
    ),
    # Phi-3 and Phi-4 (model_type phi3): one fused query/key/value projection and one fused gate/up projection
    # (gate_up_proj, (2 * mlp_size, d)); the down projection is LLaMA's. Phi-3-mini-4k sets a window.
    ArchMap(family="phi3", model_types=("phi3",), sliding_window_key="sliding_window", mlp_in_parts=2,
            notes="Phi-3, Phi-4: fused qkv_proj and gate_up_proj",
            **{**_ROTARY_DECODER, "mlp_in": "mlp.gate_up_proj", "mlp_gate": None}),
    # Pythia / GPT-NeoX: attention and MLP both read the block input and add to the residual (use_parallel_residual,
    # Pythia's setting; the MLP output still adds linearly), partial rotary embeddings, an untied LM head
    # (embed_out in the checkpoints, lm_head in transformers 5).
    ArchMap(
        family="gpt_neox",
        model_types=("gpt_neox",),
        base="gpt_neox",
        embed="gpt_neox.embed_in",
        blocks="gpt_neox.layers",
        attn="attention",
        attn_out="attention.dense",
        mlp="mlp",
        mlp_in="mlp.dense_h_to_4h",
        mlp_out="mlp.dense_4h_to_h",
        final_norm="gpt_neox.final_layer_norm",
        lm_head="lm_head",
        notes="Pythia, GPT-NeoX: parallel attention + MLP residual, partial rotary, untied embed_out (lm_head)",
    ),
    # OLMo 2: no norm before attention or MLP; a norm after each (post_attention_layernorm,
    # post_feedforward_layernorm) before the residual add, and RMS norms of the full query and key projections.
    ArchMap(family="olmo2", model_types=("olmo2",), mlp_post_norm="post_feedforward_layernorm",
            notes="norms after attention and MLP (none before), q/k RMS norms", **_ROTARY_DECODER),
    # SmolLM3: LLaMA's module names; every no_rope_layer_interval-th layer (no_rope_layers[i] == 0) attends without
    # rotary embeddings (NoPE), decided inside the attention from the config.
    ArchMap(family="smollm3", model_types=("smollm3",), sliding_window_key="sliding_window",
            notes="every 4th layer without rotary embeddings (NoPE); tied embeddings", **_ROTARY_DECODER),
):
    ARCHS.register(_arch)


def _by_model_type() -> dict[str, ArchMap]:
    """``config.model_type`` -> map, over the families registered now."""
    return {mt: arch for arch in ARCHS.values() for mt in arch.model_types}


def supported_model_types() -> list[str]:
    return sorted(_by_model_type())


def arch_for_config(config) -> ArchMap:
    """The architecture map for a transformers config, chosen by ``config.model_type``."""
    model_type = getattr(config, "model_type", None)
    arch = _by_model_type().get(model_type)
    if arch is None:
        raise EditscopeError(
            f"unsupported architecture model_type={model_type!r}; supported: {', '.join(supported_model_types())}"
        )
    return arch
