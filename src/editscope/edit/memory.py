"""Module memories: a layer's output governed by a store beside the weights (GRACE's codebook).

A :class:`MemoryEdit` wraps one module (the MLP's down projection of one block) by a forward hook installed on
:meth:`apply` and removed on :meth:`revert`; the base weights are never written. The store is a codebook of entries
(key, value, radius): for a row whose query — the module's input at the row's query token, its prompt's last token
(:class:`editscope.lm.bundle.MemoryRead`, set by the scoring engine) — lies within an entry's radius of its nearest
key (Euclidean distance), the module's output at the query token *and every later position* (the answer's tokens,
teacher-forced or generated) is that entry's value; every other row is left exactly as the module computed it
(Hartvigsen et al., "Aging with GRACE", NeurIPS 2023, §3.1 eq. 1-2). Outside the engine (a forward with no read
positions set) the query is each row's last token and only that position is governed.

While decoding with a key/value cache, each new token's forward continues the row's choice made on its prompt: the
value goes on governing the row's later positions.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from editscope.edit.intervention import StoredEdit
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle, MemoryRead

FORMAT = "editscope-memory-1"


@dataclass(frozen=True)
class SearchKeys:
    """Keys as :func:`nearest` searches them: in float64, with their squared norms ‖k‖², both computed once for
    many searches (a codebook's keys are never written into; 17,732 keys of width 1,536 are ~200 MB in float64)."""

    keys: torch.Tensor
    norms: torch.Tensor

    @classmethod
    def of(cls, keys: torch.Tensor) -> SearchKeys:
        k = keys.double()
        return cls(k, (k * k).sum(dim=1))


def nearest(queries: torch.Tensor, keys: torch.Tensor | SearchKeys) -> tuple[torch.Tensor, torch.Tensor]:
    """(distance, index) of each query's nearest key, Euclidean, in float64, ties to the earlier key. The nearest
    key is the one minimising ‖k‖² − 2 q·k (one matmul; ‖q‖² is the same for every key), its distance then computed
    directly as ‖q − k‖, so a query equal to a key is at distance 0 (the expanded form alone would leave ~1e-6)."""
    search = keys if isinstance(keys, SearchKeys) else SearchKeys.of(keys)
    q = queries.double()
    k, norms = search.keys.to(q.device), search.norms.to(q.device)
    index = (norms[None, :] - 2 * q @ k.T).argmin(dim=1)  # argmin: the first of equal values
    return (q - k[index]).norm(dim=1), index


def govern(inputs: torch.Tensor, output: torch.Tensor, read: MemoryRead | None, keys: torch.Tensor | SearchKeys,
           values: torch.Tensor, radii: torch.Tensor, owner: int, replacement: str = "answer") -> torch.Tensor:
    """The module's output with the codebook applied (see the module docstring); ``output`` itself when no row's
    query falls within a radius (so those logits are bit-equal to the unedited model's). ``replacement``: ``answer``
    governs the query token and every later position, ``prompt`` the positions before the query token (whose keys
    and values a decoding cache then carries)."""
    if radii.shape[0] == 0 or output.dim() != 3:  # a call on bare vectors is not a sequence to govern
        return output
    batch, width = output.shape[0], output.shape[1]
    if read is not None and read.positions is None:  # a decoding step: continue each row's choice
        chosen = read.chosen.get(owner)
        if replacement == "prompt":  # the prompt's positions were governed in the forward that read it
            return output
        if chosen is None or not bool((chosen >= 0).any()):
            return output
        hit = chosen >= 0
        rows = values.to(output)[chosen.clamp(min=0)]
        return torch.where(hit[:, None, None], rows[:, None, :].expand_as(output), output)
    where = (read.positions if read is not None else
             torch.full((batch,), width - 1, dtype=torch.long, device=output.device)).to(output.device)
    queries = inputs[torch.arange(batch, device=output.device), where]
    dist, index = nearest(queries, keys)
    hit = dist <= radii.double().to(dist.device)[index]
    if read is not None:
        read.chosen[owner] = torch.where(hit, index, torch.full_like(index, -1))
    if not bool(hit.any()):
        return output
    columns = torch.arange(width, device=output.device)[None, :]
    if replacement == "prompt":
        span = columns < where[:, None]
    else:
        span = columns >= where[:, None] if read is not None else columns == where[:, None]
    governed = (span & hit[:, None])[..., None]
    return torch.where(governed, values.to(output)[index][:, None, :].expand_as(output), output)


@dataclass(eq=False, kw_only=True)
class ModuleMemory(StoredEdit):
    """A memory at one module of the model (``module``, its dotted path), installed as a forward hook: a subclass
    gives the hook (:meth:`_hook`); installing, removing and the one-line error for a module the model lacks are
    here."""

    kind: ClassVar[str] = "memory"

    module: str
    _handle: Any = field(default=None, repr=False)

    @abstractmethod
    def _hook(self, target: Bundle, module: torch.nn.Module) -> Callable[..., torch.Tensor]:
        """The forward hook ``(module, args, output) -> output`` acting for this memory on ``target``."""

    def _attach(self, target: Bundle) -> None:
        try:
            module = target.model.get_submodule(self.module)
        except AttributeError:
            raise EditscopeError(f"{self.method} memory: module {self.module!r} does not exist in "
                                 f"{target.name}") from None
        self._handle = module.register_forward_hook(self._hook(target, module))
        target.count_memory(+1)

    def _detach(self, target: Bundle) -> None:
        self._handle.remove()
        self._handle = None
        target.count_memory(-1)


@dataclass(eq=False, kw_only=True)
class MemoryEdit(ModuleMemory):
    """A codebook at one module (see the module docstring): ``keys`` [N, d_in], ``values`` [N, d_out], ``radii``
    [N] (float64) and each entry's ``labels`` (the answer it was trained for)."""

    FORMAT: ClassVar[str] = FORMAT

    keys: torch.Tensor
    values: torch.Tensor
    radii: torch.Tensor
    labels: tuple[str, ...] = ()
    replacement: str = "answer"
    #: ``keys`` as :func:`nearest` searches them, when whoever built the memory holds them already (a GRACE codebook
    #: does); None: computed once on install. Derived from ``keys``, so never saved.
    search_keys: SearchKeys | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = self.keys.shape[0]
        if self.replacement not in ("answer", "prompt"):
            raise EditscopeError(f"{self.method} memory: replacement {self.replacement!r} is not answer or prompt")
        if self.values.shape[0] != n or self.radii.shape[0] != n or len(self.labels) != n:
            raise EditscopeError(f"{self.method} memory: {n} keys, {self.values.shape[0]} values, "
                                 f"{self.radii.shape[0]} radii, {len(self.labels)} labels (one of each per entry)")
        if self.search_keys is not None and self.search_keys.keys.shape != self.keys.shape:
            raise EditscopeError(f"{self.method} memory: search keys of shape {tuple(self.search_keys.keys.shape)} "
                                 f"for keys of shape {tuple(self.keys.shape)}")

    @property
    def size(self) -> int:
        return int(self.keys.shape[0])

    def _hook(self, target: Bundle, module: torch.nn.Module) -> Callable[..., torch.Tensor]:
        owner = id(self)
        keys = SearchKeys.of(self.keys) if self.search_keys is None else self.search_keys  # once per install

        def hook(_module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            return govern(args[0], output, target.read, keys, self.values, self.radii, owner, self.replacement)
        return hook

    def fields(self) -> dict[str, Any]:
        return {"module": self.module, "labels": list(self.labels), "replacement": self.replacement}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"keys": self.keys, "values": self.values, "radii": self.radii}

    def describe(self) -> str:
        return f"codebook     {self.size} entries at {self.module} (values replace its output: {self.replacement})"

    @classmethod
    def load(cls, path: str | Path, *, trust_unverified: bool | None = None) -> MemoryEdit:
        """Read a file :meth:`save` wrote (content digest checked first; one line naming the file and key)."""
        common, tensors = cls.read(path, trust_unverified)
        f = common.pop("fields")
        if not isinstance(f.get("module"), str) or not isinstance(f.get("labels"), list):
            raise EditscopeError(f"{path}: memory edit metadata: key 'fields': 'module' (a string) and 'labels' (a "
                                 "list) are required")
        missing = {"keys", "values", "radii"} - set(tensors)
        if missing:
            raise EditscopeError(f"{path}: memory edit: tensor(s) {sorted(missing)} missing")
        if f.get("replacement", "answer") not in ("answer", "prompt"):
            raise EditscopeError(f"{path}: memory edit metadata: key 'fields': replacement must be answer or prompt")
        return cls(module=f["module"], labels=tuple(f["labels"]), replacement=f.get("replacement", "answer"),
                   keys=tensors["keys"], values=tensors["values"],
                   radii=tensors["radii"], **common)
