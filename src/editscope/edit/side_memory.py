"""Side memories: copies of one linear layer's weight, edited instead of it, and a router choosing per row which
copy the layer uses (WISE, Wang et al., "WISE: Rethinking the Knowledge Memory for Lifelong Model Editing of Large
Language Models", NeurIPS 2024, §2.3.1).

A :class:`SideMemoryEdit` holds M side weights W'_m (each in the module's own orientation) and a threshold ε_m per
memory. Installed as a forward hook on the module, for each row it computes every memory's activation score

    Δ_m(x) = mean over the row's routed positions of ‖a_t · W'_m − a_t · W‖₂      (``distance: output``, the paper's
                                                                                  Δ_act = ‖A(x)·(W'_v − W_v)‖₂)
    Δ_m(x) = mean over the routed positions of ‖σ(a_t · W'_m) − σ(a_t · W)‖₂     (``distance: activation``, the
                                                                                  reference code's: σ the model's
                                                                                  hidden activation)

where a_t is the module's input at position t and W the module's own weight. The memories whose score reaches their
threshold are candidates; the row uses the candidate of highest score (ties to the earlier memory) at every position,
or the module's own output when there is none — then the row's logits are bit-equal to the unedited model's.

The routed positions are the row's prompt: from its first real token to its query token (the prompt's last token,
:class:`editscope.lm.bundle.MemoryRead` set by the scoring engine), so a row's route does not depend on the
continuation being scored; while decoding with a key/value cache the new positions continue the row's choice. Outside
the engine (no read positions) every position of the row is routed on (the reference code's per-sequence mean).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from editscope.edit.memory import ModuleMemory
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle, MemoryRead

FORMAT = "editscope-side-memory-1"
DISTANCES = ("output", "activation")


def side_outputs(inputs: torch.Tensor, weights: torch.Tensor, transposed: bool, bias: torch.Tensor | None
                 ) -> torch.Tensor:
    """[M, ..., d_out]: the module's output with each side weight in place of its own (``transposed``: the weight is
    stored [d_in, d_out], GPT-2's Conv1D)."""
    w = weights.to(inputs)
    out = torch.einsum("...k,mkd->m...d", inputs, w) if transposed else torch.einsum("...k,mdk->m...d", inputs, w)
    return out if bias is None else out + bias.to(out)


def scores(output: torch.Tensor, side: torch.Tensor, span: torch.Tensor,
           act: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """[M, B]: each memory's activation score per row (module docstring) over the positions ``span`` [B, T] marks;
    ``act`` None: the output distance."""
    main = output.float()
    alt = side.float()
    diff = (act(alt) - act(main)[None]) if act is not None else (alt - main[None])
    dist = diff.norm(dim=-1)  # [M, B, T]
    weight = span.to(dist.dtype)
    return (dist * weight).sum(-1) / weight.sum(-1).clamp(min=1)


def route(inputs: torch.Tensor, output: torch.Tensor, read: MemoryRead | None, weights: torch.Tensor,
          thresholds: torch.Tensor, owner: int, transposed: bool, bias: torch.Tensor | None,
          act: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """The module's output with each row routed (module docstring); ``output`` itself when no row reaches a
    memory."""
    if weights.shape[0] == 0 or output.dim() != 3:  # a call on bare vectors is not a sequence to route
        return output
    batch, width = output.shape[0], output.shape[1]
    if read is not None and read.positions is None:  # a decoding step: continue each row's choice
        chosen = read.chosen.get(owner)
        if chosen is None or not bool((chosen >= 0).any()):
            return output
        side = side_outputs(inputs, weights, transposed, bias)
        picked = side[chosen.clamp(min=0), torch.arange(batch, device=output.device)]
        return torch.where((chosen >= 0)[:, None, None], picked.to(output), output)
    columns = torch.arange(width, device=output.device)[None, :]
    if read is None:
        span = torch.ones(batch, width, dtype=torch.bool, device=output.device)
    else:
        last = read.positions.to(output.device)[:, None]
        first = (read.starts.to(output.device)[:, None] if read.starts is not None else torch.zeros_like(last))
        span = (columns >= first) & (columns <= last)
    side = side_outputs(inputs, weights, transposed, bias)
    score = scores(output, side, span, act)  # [M, B]
    passing = score >= thresholds.to(score)[:, None]
    best = torch.where(passing, score, torch.full_like(score, -torch.inf)).argmax(0)
    hit = passing.any(0)
    if read is not None:
        read.chosen[owner] = torch.where(hit, best, torch.full_like(best, -1))
    if not bool(hit.any()):
        return output
    picked = side[best, torch.arange(batch, device=output.device)]
    return torch.where(hit[:, None, None], picked.to(output), output)


def activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's hidden activation by its config name (``silu``, ``gelu_new``, ...)."""
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise EditscopeError(f"side memory: unknown activation {name!r}")
    return ACT2FN[name]


@dataclass(eq=False, kw_only=True)
class SideMemoryEdit(ModuleMemory):
    """Side weights at one module (see the module docstring): ``weights`` [M, *module weight shape] (float32),
    ``thresholds`` [M] (float64), a name per memory (``labels``), the ``distance`` and, for the activation
    distance, the model's ``activation``."""

    FORMAT: ClassVar[str] = FORMAT

    weights: torch.Tensor
    thresholds: torch.Tensor
    labels: tuple[str, ...] = ()
    distance: str = "output"
    activation: str = ""

    def __post_init__(self) -> None:
        n = self.weights.shape[0]
        if self.distance not in DISTANCES:
            raise EditscopeError(f"{self.method} side memory: distance {self.distance!r} is not one of "
                                 f"{', '.join(DISTANCES)}")
        if self.distance == "activation" and not self.activation:
            raise EditscopeError(f"{self.method} side memory: the activation distance needs the model's activation")
        if self.thresholds.shape[0] != n or len(self.labels) != n:
            raise EditscopeError(f"{self.method} side memory: {n} weights, {self.thresholds.shape[0]} thresholds, "
                                 f"{len(self.labels)} labels (one of each per memory)")

    @property
    def size(self) -> int:
        return int(self.weights.shape[0])

    def _hook(self, target: Bundle, module: torch.nn.Module) -> Callable[..., torch.Tensor]:
        if tuple(self.weights.shape[1:]) != tuple(module.weight.shape):
            raise EditscopeError(f"{self.method} side memory: weights of shape {tuple(self.weights.shape[1:])} do not "
                                 f"fit {self.module} of {target.name} ({tuple(module.weight.shape)})")
        owner, transposed = id(self), type(module).__name__ == "Conv1D"
        bias = getattr(module, "bias", None)
        act = activation_fn(self.activation) if self.distance == "activation" else None
        weights = self.weights.to(module.weight.device)

        def hook(_module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            return route(args[0], output, target.read, weights, self.thresholds, owner, transposed, bias, act)
        return hook

    def fields(self) -> dict[str, Any]:
        return {"module": self.module, "labels": list(self.labels), "distance": self.distance,
                "activation": self.activation}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"weights": self.weights, "thresholds": self.thresholds}

    def describe(self) -> str:
        held = ", ".join(f"{name} (ε {float(eps):.3g})" for name, eps in zip(self.labels, self.thresholds, strict=True))
        return f"side memory  {self.size} at {self.module}: {held or 'none yet'}; distance {self.distance}"

    @classmethod
    def load(cls, path: str | Path, *, trust_unverified: bool | None = None) -> SideMemoryEdit:
        """Read a file :meth:`save` wrote (content digest checked first; one line naming the file and key)."""
        common, tensors = cls.read(path, trust_unverified)
        f = common.pop("fields")
        if not isinstance(f.get("module"), str) or not isinstance(f.get("labels"), list):
            raise EditscopeError(f"{path}: side memory metadata: key 'fields': 'module' (a string) and 'labels' (a "
                                 "list) are required")
        missing = {"weights", "thresholds"} - set(tensors)
        if missing:
            raise EditscopeError(f"{path}: side memory: tensor(s) {sorted(missing)} missing")
        return cls(module=f["module"], labels=tuple(f["labels"]), distance=str(f.get("distance", "output")),
                   activation=str(f.get("activation", "")), weights=tensors["weights"],
                   thresholds=tensors["thresholds"], **common)
