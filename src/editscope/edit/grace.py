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

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import torch

from editscope.data.records import EditRequest
from editscope.edit.hparams import HParams, OwnLayer, check_convention
from editscope.edit.memory import MemoryEdit, SearchKeys, nearest
from editscope.edit.state import EditState
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.full_forward import select_rows
from editscope.lm.partial_forward import BlockForward, SuffixForward, continuation_nll
from editscope.progress import report

REPLACEMENTS = ("answer", "prompt")
CONVENTIONS: dict[str, dict[str, str]] = {"paper": {"replacement": "answer"}, "reference": {"replacement": "prompt"}}


@dataclass
class GraceHParams(HParams):
    """One layer; ``eps_init``: the initial deferral radius ε (in the down projection's input space); ``n_iter``
    and ``lr``: the value's training; ``stop_loss``: stop training once the target NLL (mean per token) is below."""
    # derived layers follow GRACE's own published late layer (EasyEdit's GRACE configs; hparams.derived_layers)
    LAYER_RULE = "own"
    OWN_LAYERS = {"llama": OwnLayer("LLaMA-2-7B", 32, 27, "zjunlp/EasyEdit hparams/GRACE/llama-7b.yaml"),
                  "gptj": OwnLayer("GPT-J 6B", 28, 25, "zjunlp/EasyEdit hparams/GRACE/gpt-j-6b.yaml")}

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


class _Room:
    """Spare rows after a tensor's last one, allocated ahead so that appending a row copies nothing. Every codebook
    forked from one another shares the room; a codebook of n rows writes row n in place only while none has written
    past n (``filled == n``), so the rows a codebook or an edit holds never change after it got them."""

    def __init__(self, rows: torch.Tensor, capacity: int) -> None:
        self.buffer = torch.empty((capacity, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        self.buffer[:rows.shape[0]] = rows
        self.filled = int(rows.shape[0])


def _appended(rows: torch.Tensor, row: torch.Tensor, room: _Room | None) -> tuple[torch.Tensor, _Room]:
    """``rows`` with ``row`` after them (a view of ``room``'s buffer), and the room; a new room of twice the rows
    when this one is full, holds other rows or has been written past them (one copy per doubling)."""
    n = int(rows.shape[0])
    if room is None or room.filled != n or n == room.buffer.shape[0] or rows.data_ptr() != room.buffer.data_ptr():
        room = _Room(rows, capacity=max(64, 2 * (n + 1)))
    room.buffer[n] = row
    room.filled = n + 1
    return room.buffer[:n + 1], room


class GraceCodebook(EditState):
    """The codebook: ``keys`` [N, d_in], ``values`` [N, d_out] (float32), ``radii`` [N] (float64), ``labels``;
    rows are appended into spare room (:class:`_Room`) and otherwise replaced, never written into."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                 radii: torch.Tensor | None = None, labels: Sequence[str] = ()) -> None:
        self.keys, self.values, self.radii = keys, values, radii
        self.labels: tuple[str, ...] = tuple(labels)
        self._rooms: tuple[_Room | None, ...] = (None,) * 5  # keys, values, radii, search keys and norms
        self._search: SearchKeys | None = None  # the keys as nearest() reads them, grown beside the keys

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
        d, j = self._nearest(key)
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

    def _nearest(self, key: torch.Tensor) -> tuple[float, int]:
        """(distance, index) of the key nearest ``key``."""
        dist, index = nearest(key[None], self.search_keys())
        return float(dist[0]), int(index[0])

    def search_keys(self) -> SearchKeys:
        """The keys as :func:`nearest` searches them (float64, with their squared norms), grown with the keys."""
        if self._search is None or self._search.keys.shape[0] != self.size:
            self._search = SearchKeys.of(self.keys)
        return self._search

    def _add(self, key: torch.Tensor, label: str, radius: float, value: torch.Tensor) -> int:
        value = value.detach().float().cpu()
        rad = torch.tensor(radius, dtype=torch.float64)
        if self.keys is None:
            self.keys, self.values, self.radii = key[None].clone(), value[None].clone(), rad[None]
        else:
            search, new = self.search_keys(), SearchKeys.of(key[None])
            rooms = self._rooms
            self.keys, k = _appended(self.keys, key, rooms[0])
            self.values, v = _appended(self.values, value, rooms[1])
            self.radii, r = _appended(self.radii, rad, rooms[2])
            keys64, k64 = _appended(search.keys, new.keys[0], rooms[3])
            norms, n = _appended(search.norms, new.norms[0], rooms[4])
            self._search, self._rooms = SearchKeys(keys64, norms), (k, v, r, k64, n)
        self.labels = self.labels + (label,)
        return self.size - 1

    def set_values(self, indices: Sequence[int], values: torch.Tensor) -> None:
        """Entries ``indices`` take ``values`` [len(indices), d_out] (one copy of the codebook's values per call)."""
        updated = self.values.clone()
        updated[torch.tensor(list(indices), dtype=torch.long)] = values.detach().float().cpu()
        self.values = updated


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
                      search_keys=None if empty else book.search_keys(),  # the codebook grew them beside its keys
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
    """v minimising the NLL of the target after the prompt with v as the module's output (``hp.where``), trained
    from ``start``: (v, final loss, steps taken); :func:`train_values` for one request."""
    values, losses, steps = train_values(engine, module, layer, [request], start[None], hp)
    return values[0], losses[0], steps[0]


def train_values(engine: ScoringEngine, module: torch.nn.Module, layer: int, requests: Sequence[EditRequest],
                 starts: torch.Tensor, hp: GraceHParams) -> tuple[torch.Tensor, list[float], list[int]]:
    """One value per request, each trained as if alone (§3.2): Adam at ``hp.lr`` on the NLL (mean per target token)
    of the request's target after its prompt with the value as the module's output, from ``starts`` [B, d_out],
    for ``hp.n_iter`` steps or until the loss is below ``hp.stop_loss`` (checked before each step; the value is kept
    as it was then). Returns (values [B, d_out], final losses, steps taken).

    The requests run as one batch: each value acts on its own row only, the loss is the sum of the rows' losses and
    Adam works element by element, so each value follows the steps it would take alone; a row that stops leaves
    the batch. Each step runs blocks ``layer``.. only (the blocks below cannot see a value): under ``where:
    answer`` only the positions from the query token to the last target token's predecessor
    (:class:`~editscope.lm.partial_forward.SuffixForward`, the prompt's earlier positions read from a key/value
    cache), under ``where: prompt`` (or a row past a sliding window) every position
    (:class:`~editscope.lm.partial_forward.BlockForward`); the head at the target positions only.
    ``tests/edit/test_beyond_weights.py`` holds both to a plain loop of full forwards, one request at a time."""
    batch = engine.prepare([(r.text, r.target_new) for r in requests])
    queries = [n - 1 for n in batch.context_lengths]
    values = starts.detach().clone().float().to(engine.bundle.device).requires_grad_(True)
    optimiser = torch.optim.Adam([values], lr=hp.lr)
    forward = _ValueForward(engine, module, layer, batch, queries, hp.where)
    kept, losses, steps = values.detach().clone(), [float("inf")] * len(requests), [hp.n_iter] * len(requests)
    active = list(range(len(requests)))  # batch rows still training
    for step in range(1, hp.n_iter + 1):
        report(f"grace: values of {len(active)} request(s), step", step, hp.n_iter)
        nll = forward.nll(values, active)
        current = nll.detach().tolist()
        going = [i for i, loss in enumerate(current) if not loss < hp.stop_loss]
        for i, loss in enumerate(current):
            losses[active[i]] = loss
            if loss < hp.stop_loss:  # stopped: the value as it is now
                kept[active[i]], steps[active[i]] = values.detach()[active[i]], step
        if not going:
            break
        # the values' gradient alone (the model's parameters keep no .grad); a stopped row's value is not read again
        values.grad = torch.autograd.grad(nll[going].sum(), [values])[0]
        optimiser.step()
        if len(going) < len(active):
            forward = forward.select(going)
            active = [active[i] for i in going]
    else:
        for r in active:  # ran all n_iter steps: the value after the last one
            kept[r] = values.detach()[r]
    return kept, losses, steps


class _ValueForward:
    """The final states of a batch of (prompt, target) rows with each row's value written at the module's output,
    through the fastest exact forward (:func:`train_values`), and each row's target NLL."""

    def __init__(self, engine: ScoringEngine, module: torch.nn.Module, layer: int, batch: TokenBatch,
                 queries: list[int], where: str) -> None:
        self.engine, self.module, self.batch, self.queries, self.where = engine, module, batch, queries, where
        last_read = [c + n - 2 for c, n in zip(batch.context_lengths, batch.continuation_lengths, strict=True)]
        self.suffix = (SuffixForward.build(engine, batch, queries, f"blocks.{layer}.mlp_out", last_read)
                       if where == "answer" else None)
        self.block = BlockForward(engine, batch, layer) if self.suffix is None else None

    def select(self, rows: list[int]) -> _ValueForward:
        out = copy.copy(self)
        out.batch, out.queries = select_rows(self.batch, rows), [self.queries[r] for r in rows]
        out.suffix = self.suffix.select(rows) if self.suffix is not None else None
        out.block = self.block.select(rows) if self.block is not None else None
        return out

    def nll(self, values: torch.Tensor, active: list[int]) -> torch.Tensor:
        """[A]: each row's target NLL with ``values[active[r]]`` written in row r."""
        mine = values[torch.tensor(active, dtype=torch.long, device=values.device)]
        if self.suffix is not None:  # every computed suffix position is the query's or a later one
            hidden = self.suffix.hidden_with(lambda x, rows: mine[rows][:, None, :].to(x).expand_as(x))
            return continuation_nll(self.engine, self.batch, hidden)
        columns = torch.arange(self.batch.input_ids.shape[1], device=values.device)[None, :]
        query = torch.tensor(self.queries, device=values.device)[:, None]
        span = (columns >= query) if self.where == "answer" else (columns < query)

        def replace(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
            return torch.where(span[:, :, None], mine[:, None, :].to(output), output)

        handle = self.module.register_forward_hook(replace)
        try:
            hidden = self.block.hidden()
        finally:
            handle.remove()
        return continuation_nll(self.engine, self.batch, hidden)


def compute(bundle: Bundle, requests: list[EditRequest], hp: GraceHParams, state: GraceCodebook, *,
            engine: ScoringEngine, **_: object) -> tuple[MemoryEdit, dict]:
    """Edit the requests one after another (Algorithm 1), each on the codebook the earlier ones left. Where a
    request lands depends on the keys and labels only, so every request is placed first, in order; then the values
    are trained in waves, wave k holding each entry's k-th request, started from the value the entry holds then
    (its placement value, or what the previous wave trained for it on expand): the same values as editing one
    request after another, trained together (:func:`train_values`)."""
    layer = hp.layers[0]
    module = bundle.model.get_submodule(module_path(bundle, hp))
    actions: dict[str, int] = {"new": 0, "expand": 0, "split": 0}
    # the keys are the projection's input, which no codebook at this projection (the one in force, or what the
    # earlier requests add) can change: one forward for the batch
    keys = engine.hidden_states([r.text for r in requests], [layer], kind="mlp_key")[:, 0]
    with torch.no_grad():
        owns = module.forward(keys.to(module.weight.dtype))  # forward(): the codebook's hook skipped
    entries = []
    for request, key, own in zip(requests, keys, owns, strict=True):
        if hp.val_init == "cold":  # the reference's default: uniform in [0, 1), from the edit's seeded stream
            own = torch.rand(own.shape, device=own.device, dtype=own.dtype)
        index, action = state.place(key, request.target_new.strip(), hp.eps_init, own)
        actions[action] += 1
        entries.append(index)
    losses, steps = [0.0] * len(requests), 0
    for wave in _waves(entries):
        starts = torch.stack([state.values[entries[r]] for r in wave])
        values, wave_losses, wave_steps = train_values(engine, module, layer, [requests[r] for r in wave], starts, hp)
        state.set_values([entries[r] for r in wave], values)  # a wave holds each entry once
        for r, loss in zip(wave, wave_losses, strict=True):
            losses[r] = loss
        steps += sum(wave_steps)
    info = {"codebook_size": state.size, "entries_new": actions["new"], "entries_expanded": actions["expand"],
            "entries_split": actions["split"], "value_loss": sum(losses) / len(losses), "value_steps": steps}
    return edit_of(bundle, requests, hp, state), info


def _waves(entries: Sequence[int]) -> list[list[int]]:
    """Request indices in waves: wave k holds, in request order, the k-th request placed on each entry."""
    waves: list[list[int]] = []
    seen: dict[int, int] = {}
    for r, entry in enumerate(entries):
        k = seen.get(entry, 0)
        seen[entry] = k + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(r)
    return waves
