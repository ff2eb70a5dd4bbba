"""Named hook points and context managers that install hooks and always remove them (DESIGN.md rule 7).

Hook point names are stable across families (TransformerLens style); where each lives is data on the
architecture map (:attr:`ArchMap.hook_points`, pyvene style):

- ``embed``                  output of the token embedding (after Gemma's scaling)
- ``blocks.{i}.resid_pre``   residual stream entering block i (the block's input)
- ``blocks.{i}.resid_post``  residual stream after block i
- ``blocks.{i}.attn_out``    output of block i's attention output projection
- ``blocks.{i}.attn_heads``  input of that projection: per-head outputs, flat [.., n_heads * head_dim] for hook
  functions, [.., n_heads, head_dim] in :func:`capture`
- ``blocks.{i}.mlp_key``     input of block i's MLP down/out projection (the key k of ROME/MEMIT)
- ``blocks.{i}.mlp_out``     output of block i's MLP (the residual update, except after Gemma3's post-MLP norm)
- ``blocks.{i}.up_key``, ``blocks.{i}.up_out``     input and output of block i's MLP up/input projection
- ``blocks.{i}.gate_key``, ``blocks.{i}.gate_out`` input and output of a gated MLP's gate projection (where the
  family has one: :attr:`ArchMap.mlp_gate`)
- ``final``                  output of the final norm: the state the LM head reads at every position, which is
  HF's ``output_hidden_states[-1]`` in every supported family (GPT-2/GPT-J ``ln_f``, LLaMA/Gemma ``norm``)

A hook function receives the activation tensor and returns a replacement tensor or ``None`` (keep).
:func:`capture` records activations as ROME's ``nethook.TraceDict`` does: optionally keeping their graph,
stopping the forward once every point has fired, and recording gradients w.r.t. each point.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from editscope.errors import EditscopeError
from editscope.lm.archs import BLOCK_POINT_PREFIX, ArchMap, HookPoint

HookFn = Callable[[torch.Tensor], torch.Tensor | None]

_BLOCK_NAME = re.compile(r"^blocks\.(\d+)\.([a-z_]+)$")


def point_names(arch: ArchMap, n_layers: int) -> list[str]:
    """Every concrete hook point name of a model with ``n_layers`` blocks."""
    names = []
    for template in arch.hook_points:
        if template.startswith(BLOCK_POINT_PREFIX):
            names += [template.replace("{i}", str(i)) for i in range(n_layers)]
        else:
            names.append(template)
    return names


def _unknown(arch: ArchMap, name: str) -> EditscopeError:
    return EditscopeError(f"unknown hook point {name!r} for family {arch.family}; valid: "
                          + ", ".join(t.replace("{i}", "N") for t in arch.hook_points))


def point(model: nn.Module, arch: ArchMap, name: str) -> tuple[nn.Module, HookPoint]:
    """The module a hook point name refers to and its declaration."""
    if not name.startswith("blocks."):
        decl = arch.hook_points.get(name)
        if decl is None:
            raise _unknown(arch, name)
        return model.get_submodule(decl.path), decl
    match = _BLOCK_NAME.match(name)
    decl = arch.hook_points.get(f"{BLOCK_POINT_PREFIX}{match.group(2)}") if match else None
    if decl is None:
        raise _unknown(arch, name)
    layer = int(match.group(1))
    n_layers = arch.n_layers(model.config)
    if not 0 <= layer < n_layers:
        raise EditscopeError(f"hook point {name!r}: layer {layer} out of range 0..{n_layers - 1}")
    block = arch.block(model, layer)
    return (block.get_submodule(decl.path) if decl.path else block), decl


def resolve(model: nn.Module, arch: ArchMap, name: str) -> tuple[nn.Module, str]:
    """Map a hook point name to (module, "input" | "output")."""
    module, decl = point(model, arch, name)
    return module, decl.where


def _output_hook(fn: HookFn):
    def hook(_module, _args, output):
        if isinstance(output, tuple):
            new = fn(output[0])
            return output if new is None else (new, *output[1:])
        return fn(output)

    return hook


def _input_hook(fn: HookFn):
    def hook(_module, args, kwargs):
        # Blocks take the residual stream positionally in every supported family; keep a kwarg path anyway.
        if args:
            new = fn(args[0])
            return None if new is None else ((new, *args[1:]), kwargs)
        new = fn(kwargs["hidden_states"])
        return None if new is None else (args, {**kwargs, "hidden_states": new})

    return hook


@contextmanager
def hooks(model: nn.Module, arch: ArchMap, fns: Mapping[str, HookFn]) -> Iterator[None]:
    """Install ``{hook point: fn}`` for the duration of the block; removed on exit, also on error."""
    handles = []
    try:
        for name, fn in fns.items():
            module, where = resolve(model, arch, name)
            if where == "output":
                handles.append(module.register_forward_hook(_output_hook(fn)))
            else:
                handles.append(module.register_forward_pre_hook(_input_hook(fn), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


class StopForward(Exception):
    """Raised inside a forward by a ``stop_after`` capture once all its points fired; caught by that capture."""

    def __init__(self, owner: object) -> None:
        super().__init__("forward stopped after the last captured hook point")
        self.owner = owner


class Captured(dict):
    """Captured states by hook point name (last forward wins). With ``grad=True``, :attr:`grads` maps each
    name to d(loss)/d(state) once a backward has run through it (same shape as the state)."""

    def __init__(self) -> None:
        super().__init__()
        self.grads: dict[str, torch.Tensor] = {}


def _head_shapes(model: nn.Module, arch: ArchMap, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(heads, head size) of the points among ``names`` that are split per attention head."""
    shapes = {}
    for name in names:
        _, decl = point(model, arch, name)
        if decl.heads:
            shapes[name] = (arch.n_heads(model.config), arch.head_dim(model.config))
    return shapes


class _Recording:
    """The hook functions of one :func:`capture` and what they record: the states, their gradient hooks and, with
    ``stop_after``, the points yet to fire (the recording itself is the :class:`StopForward` owner)."""

    def __init__(self, names: Sequence[str], shapes: dict[str, tuple[int, int]], *, detach: bool, grad: bool,
                 stop_after: bool) -> None:
        self.store = Captured()
        self.shapes = shapes
        self.grad = grad
        self.stop_after = stop_after
        # the forward goes on from the stored state where its graph matters
        self.keep_graph = grad or not detach
        self.pending: set[str] = set(names)
        self.tensor_handles: list[Any] = []

    def recorder(self, name: str) -> HookFn:
        shape = self.shapes.get(name)

        def record(x: torch.Tensor) -> torch.Tensor | None:
            state = x.unflatten(-1, shape) if shape else x
            if self.grad:
                state = self._track_grad(name, state)
            self.store[name] = state if self.keep_graph else state.detach()
            if self.stop_after:
                self._fired(name)
            return self._fed_on(x, state, split=shape is not None)

        return record

    def _track_grad(self, name: str, state: torch.Tensor) -> torch.Tensor:
        """``state``, made a leaf that requires grad where no graph reaches it, with a hook storing its gradient."""
        if not state.requires_grad:
            state = state.detach().requires_grad_(True)
        self.tensor_handles.append(state.register_hook(lambda g: self.store.grads.__setitem__(name, g)))
        return state

    def _fired(self, name: str) -> None:
        """Stop the forward once every point has fired."""
        self.pending.discard(name)
        if not self.pending:
            raise StopForward(self)

    def _fed_on(self, x: torch.Tensor, state: torch.Tensor, *, split: bool) -> torch.Tensor | None:
        """What the forward goes on from: the stored tensor itself when its graph matters (a head-split view is a
        new tensor: feeding its flattening back puts it on the path to the loss), else the output unchanged."""
        if not self.keep_graph:
            return None
        if split:
            return state.flatten(-2)
        return state if state is not x else None

    def remove_tensor_hooks(self) -> None:
        for handle in self.tensor_handles:
            handle.remove()


@contextmanager
def capture(model: nn.Module, arch: ArchMap, names: Sequence[str], *, detach: bool = True,
            stop_after: bool = False, grad: bool = False) -> Iterator[Captured]:
    """Record the activations at ``names`` during forwards inside the block (ROME's ``nethook.TraceDict``).

    - ``detach=False`` keeps the states in the autograd graph (``grad=True`` implies it).
    - ``stop_after=True`` ends the forward as soon as every point has fired (the blocks after the last one do
      not run): the forward call raises :class:`StopForward`, which this context swallows at its end, so code
      after that call inside the ``with`` block is skipped — put the forward last, or use :func:`run_until`.
    - ``grad=True`` records in ``captured.grads`` the gradient of whatever is later back-propagated w.r.t. each
      state (a tensor hook on it). Where no graph reaches the state (frozen weights, token inputs) the state is
      made a leaf that requires grad and fed on in place of the original, so gradients exist without touching
      parameters; a state already in a graph is left in place.

    Module hooks and tensor hooks are all removed on exit, also on error.
    """
    recording = _Recording(names, _head_shapes(model, arch, names), detach=detach, grad=grad,
                           stop_after=stop_after)
    try:
        with hooks(model, arch, {name: recording.recorder(name) for name in names}):
            yield recording.store
    except StopForward as stop:
        if stop.owner is not recording:
            raise
    finally:
        recording.remove_tensor_hooks()


def run_until(model: nn.Module, arch: ArchMap, names: Sequence[str], fn: Callable[[], Any], *,
              detach: bool = True) -> Captured:
    """Call ``fn`` (a forward, or an engine call that runs one) until every point in ``names`` has fired, and
    return the captured states; the rest of that forward is skipped."""
    with capture(model, arch, names, detach=detach, stop_after=True) as store:
        fn()
    missing = [name for name in names if name not in store]
    if missing:
        raise EditscopeError(f"the call ran no forward through hook points {missing}")
    return store
