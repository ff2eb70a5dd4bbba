"""GRACE: General Retrieval Adaptors for Continual Editing (Hartvigsen et al., "Aging with GRACE: Lifelong Model
Editing with Discrete Key-Value Adaptors", NeurIPS 2023).

A codebook at one layer (a :class:`~editscope.edit.memory.MemoryEdit` on the block's MLP down projection, as
EasyEdit wraps it): the key of an edit is the down projection's input at the prompt's last token, h; its value
replaces the projection's output there and at every later position (the answer's) when a query lies within the
entry's deferral radius ε (§3.1, eq. 1-2). An edit (x, y) updates the codebook as Algorithm 1 (§3.2), with d the
distance from h to the nearest key K_j:

- empty codebook, or d > ε_j + ε_init: a new entry (h, v, ε_init, y);
- d ≤ ε_j + ε_init and y is K_j's label: *expand*, ε_j ← max(ε_j, d), and v_j is trained on the new input;
- d ≤ ε_j + ε_init and another label: *split*, ε_j ← d/2 and a new entry (h, v, d/2, y).

The value v starts at the projection's own output at h (``val_init: warm``; ``cold``: uniform in [0, 1), the
reference code's default) or the entry's value (expand), and is trained for ``n_iter`` Adam steps of learning rate
``lr`` on the NLL of y after x with v in place (§3.2 "values are trained by backpropagation"), stopping early below
``stop_loss``. The codebook is the sequential state (:class:`GraceCodebook`); every edit's intervention holds the
whole codebook after it.

Where the value goes (``replacement``, two named conventions; the key is read at the prompt's last token in both):
``answer`` (convention ``paper``, default) — the projection's output at the query token and every later position,
so the answer's teacher-forced and generated tokens are read under the value (the layer's output for the edited
input *is* the value, §3.1); ``prompt`` (convention ``reference``, Thartvigsen/GRACE ``replace_prompt``) — the
positions before the query token, so the answer reads the value only through attention. The reference's other
defaults are taken: ε_init 1.0, 100 steps of Adam at lr 1.0, Euclidean distance, radius expansion by coverage, and a
split that leaves the old radius 1e-5 short of d/2 so the midpoint belongs to the new entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import torch

from editscope.data.records import EditRequest
from editscope.edit.hparams import HParams, check_convention
from editscope.edit.memory import MemoryEdit, nearest
from editscope.edit.state import EditState
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle
from editscope.lm.engine import ScoringEngine
from editscope.lm.partial_forward import BlockForward

REPLACEMENTS = ("answer", "prompt")
CONVENTIONS: dict[str, dict[str, str]] = {"paper": {"replacement": "answer"}, "reference": {"replacement": "prompt"}}


@dataclass
class GraceHParams(HParams):
    """One layer; ``eps_init``: the initial deferral radius ε (in the down projection's input space); ``n_iter``
    and ``lr``: the value's training; ``stop_loss``: stop training once the target NLL (mean per token) is below."""
    LAYER_RULE = "single"  # derived layers follow ROME's layer (hparams.derived_layers)

    method = "grace"
    layers: list[int] = field(default_factory=lambda: [0])
    eps_init: float = 1.0
    n_iter: int = 100
    lr: float = 1.0
    stop_loss: float = 0.01
    val_init: str = "warm"
    convention: str = "paper"
    replacement: str | None = None

    RANGES: ClassVar[dict[str, str]] = {"eps_init": "(0, 1e6]", "n_iter": "[1, 10000]", "lr": "(0, 10]",
                                        "stop_loss": "[0, 100]"}
    TUNABLE: ClassVar[dict[str, tuple]] = {"eps_init": (1.0, 3.0, 10.0, 30.0)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        if len(self.layers) != 1:
            raise EditscopeError(f"{where}: key 'layers': GRACE keeps its codebook at one layer, got {self.layers}")
        check_convention(self, where, CONVENTIONS, {"replacement": REPLACEMENTS})
        if self.val_init not in ("warm", "cold"):
            raise EditscopeError(f"{where}: key 'val_init': must be one of warm, cold, got {self.val_init!r}")

    @property
    def where(self) -> str:
        """The replacement in force: the switch when set, else the convention's."""
        return self.replacement or CONVENTIONS[self.convention]["replacement"]

    def protocol(self) -> dict[str, str]:
        return {"convention": self.convention, "replacement": self.where}


class GraceCodebook(EditState):
    """The codebook: ``keys`` [N, d_in], ``values`` [N, d_out] (float32), ``radii`` [N] (float64), ``labels``;
    replaced, never written into."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                 radii: torch.Tensor | None = None, labels: Sequence[str] = ()) -> None:
        self.keys, self.values, self.radii = keys, values, radii
        self.labels: tuple[str, ...] = tuple(labels)

    @property
    def size(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[0])

    def without_edits(self) -> GraceCodebook:
        return GraceCodebook()

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {} if self.keys is None else {"keys": self.keys, "values": self.values, "radii": self.radii}
        return tensors, {"labels": list(self.labels)}

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], where: str) -> Self:
        labels = meta.get("labels")
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise EditscopeError(f"{where}: GRACE codebook: 'labels' must be a list of strings")
        if set(tensors) not in (set(), {"keys", "values", "radii"}):
            raise EditscopeError(f"{where}: GRACE codebook: tensors {sorted(tensors)}, expected keys, values, radii")
        if tensors and not tensors["keys"].shape[0] == tensors["values"].shape[0] == tensors["radii"].shape[0] == \
                len(labels):
            raise EditscopeError(f"{where}: GRACE codebook: entries of unequal number")
        return cls(tensors.get("keys"), tensors.get("values"), tensors.get("radii"), labels)

    # -- Algorithm 1's codebook update ------------------------------------------------------------------------
    def place(self, key: torch.Tensor, label: str, eps_init: float, start: torch.Tensor) -> tuple[int, str]:
        """Make room for an edit with key ``key`` and answer ``label`` (Algorithm 1): (the entry to train, what
        happened: ``new``, ``expand`` or ``split``). A new entry's value is ``start`` until the caller trains it."""
        key = key.detach().float().cpu()
        if self.size == 0:
            return self._add(key, label, eps_init, start), "new"
        dist, index = nearest(key[None], self.keys)
        d, j = float(dist[0]), int(index[0])
        radius = float(self.radii[j])
        if d > radius + eps_init:
            return self._add(key, label, eps_init, start), "new"
        radii = self.radii.clone()
        if self.labels[j] == label:
            radii[j] = max(radius, d)
            self.radii = radii
            return j, "expand"
        radii[j] = d / 2 - 1e-5
        self.radii = radii
        return self._add(key, label, d / 2, start), "split"

    def _add(self, key: torch.Tensor, label: str, radius: float, value: torch.Tensor) -> int:
        value = value.detach().float().cpu()[None]
        rad = torch.tensor([radius], dtype=torch.float64)
        if self.keys is None:
            self.keys, self.values, self.radii = key[None], value, rad
        else:
            self.keys = torch.cat([self.keys, key[None]])
            self.values = torch.cat([self.values, value])
            self.radii = torch.cat([self.radii, rad])
        self.labels = self.labels + (label,)
        return self.size - 1

    def set_value(self, index: int, value: torch.Tensor) -> None:
        values = self.values.clone()
        values[index] = value.detach().float().cpu()
        self.values = values


def module_path(bundle: Bundle, hp: GraceHParams) -> str:
    return bundle.arch.layer_module_path(hp.layers[0], "mlp_out")


def edit_of(bundle: Bundle, requests: Sequence[EditRequest], hp: GraceHParams, book: GraceCodebook) -> MemoryEdit:
    """The memory holding the whole codebook ``book``."""
    empty = book.size == 0
    module = bundle.model.get_submodule(module_path(bundle, hp))
    d_in, d_out = _widths(module)
    return MemoryEdit(method="grace", hparams=hp.to_dict(), fingerprint=bundle.base_fingerprint,
                      module=module_path(bundle, hp), replacement=hp.where,
                      keys=torch.zeros(0, d_in) if empty else book.keys,  # host: the codebook is kept there
                      values=torch.zeros(0, d_out) if empty else book.values,  # host
                      radii=torch.zeros(0, dtype=torch.float64) if empty else book.radii,  # host
                      labels=book.labels, model_name=bundle.name,
                      requests=[dict(prompt=r.prompt, subject=r.subject, target_new=r.target_new,
                                     target_true=r.target_true) for r in requests])


def _widths(module: torch.nn.Module) -> tuple[int, int]:
    """(input, output) width of a linear layer (GPT-2's Conv1D stores its weight transposed)."""
    weight = module.weight
    if type(module).__name__ == "Conv1D":
        return int(weight.shape[0]), int(weight.shape[1])
    return int(weight.shape[1]), int(weight.shape[0])


def train_value(engine: ScoringEngine, module: torch.nn.Module, layer: int, request: EditRequest,
                start: torch.Tensor, hp: GraceHParams) -> tuple[torch.Tensor, float, int]:
    """v minimising the NLL of the target after the prompt with v as the module's output from the prompt's last
    token on (Adam, ``hp.n_iter`` steps, stopping below ``hp.stop_loss``): (v, final loss, steps taken). The module
    sits in block ``layer``, so each step runs blocks ``layer``.. only
    (:class:`~editscope.lm.partial_forward.BlockForward`: the blocks below cannot see v) and the head at the target
    positions only: the model's full forward to float rounding, about twice as fast on SmolLM2 (layer 25 of 30)."""
    batch = engine.prepare([(request.text, request.target_new)])
    query = batch.context_lengths[0] - 1
    value = start.detach().clone().float().to(engine.bundle.device).requires_grad_(True)
    optimiser = torch.optim.Adam([value], lr=hp.lr)
    read = batch.target_mask[:, 1:].bool()  # position t predicts token t + 1
    tokens = batch.input_ids[:, 1:][read]
    n_target = float(batch.target_mask.sum())
    forward = BlockForward(engine, batch, layer)  # block ``layer``'s input, recorded once before v acts

    span = slice(query, None) if hp.where == "answer" else slice(0, query)

    def replace(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        out[:, span] = value.to(out)
        return out

    loss_value, steps = float("inf"), 0
    handle = module.register_forward_hook(replace)
    try:
        for steps in range(1, hp.n_iter + 1):  # noqa: B007 -- the count is returned
            optimiser.zero_grad()
            hidden = forward.hidden()[:, :-1][read]
            logprobs = engine.logits_from_hidden(hidden).log_softmax(-1).gather(-1, tokens[:, None])
            loss = -logprobs.sum() / n_target
            loss_value = float(loss.detach())
            if loss_value < hp.stop_loss:
                break
            # the value's gradient alone: the model's parameters keep no .grad
            value.grad = torch.autograd.grad(loss, [value])[0]
            optimiser.step()
    finally:
        handle.remove()
    return value.detach(), loss_value, steps


def compute(bundle: Bundle, requests: list[EditRequest], hp: GraceHParams, state: GraceCodebook, *,
            engine: ScoringEngine, **_: object) -> tuple[MemoryEdit, dict]:
    """Edit the requests one after another (Algorithm 1), each on the codebook the earlier ones left."""
    layer = hp.layers[0]
    module = bundle.model.get_submodule(module_path(bundle, hp))
    actions: dict[str, int] = {"new": 0, "expand": 0, "split": 0}
    losses, steps = [], 0
    for request in requests:
        # the key is the projection's input: a memory at this projection (the codebook in force) cannot change it
        key = engine.hidden_states([request.text], [layer], kind="mlp_key")[0, 0]
        with torch.no_grad():
            own = module.forward(key[None].to(module.weight.dtype))[0]  # forward(): the codebook's hook skipped
        if hp.val_init == "cold":  # the reference's default: uniform in [0, 1), from the edit's seeded stream
            own = torch.rand(own.shape, device=own.device, dtype=own.dtype)
        index, action = state.place(key, request.target_new.strip(), hp.eps_init, own)
        actions[action] += 1
        value, loss, n = train_value(engine, module, layer, request, state.values[index], hp)
        state.set_value(index, value)
        losses.append(loss)
        steps += n
    info = {"codebook_size": state.size, "entries_new": actions["new"], "entries_expanded": actions["expand"],
            "entries_split": actions["split"], "value_loss": sum(losses) / len(losses), "value_steps": steps}
    return edit_of(bundle, requests, hp, state), info
