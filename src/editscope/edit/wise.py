"""WISE: a side memory for lifelong editing (Wang et al., "WISE: Rethinking the Knowledge Memory for Lifelong Model
Editing of Large Language Models", NeurIPS 2024, §2.3).

The main memory — one block's MLP down projection W_v — is never written; edits go into a side copy W'_v
(a :class:`~editscope.edit.side_memory.SideMemoryEdit`), and a router sends a query to the side memory when its
activation score Δ_act(x) = ‖A(x)·(W'_v − W_v)‖₂ reaches ε (§2.3.1; the score and the routing rule are in
:mod:`editscope.edit.side_memory`). Each edit (x_e, y_e) trains W'_v for up to ``n_iter`` SGD steps on

    L = L_edit + L_a,   L_edit = −log P(y_e | x_e) (mean per target token, over x_e and its context-template
                                                    variants: random model-written prefixes, as ROME's)
    L_a = max(0, Δ(x_i) − α) + max(0, β − Δ(x_e)) + max(0, γ − (Δ(x_e) − Δ(x_i)))      (§2.3.1, routing margins)

with x_i an irrelevant prompt (one record of ``irrelevant_pool``, chosen by a hash of the edit's prompt: never an
evaluated record, unlike the reference code, which uses the record's own locality prompt), and each term's mean
taken over the edit's rows. The step's gradient is masked to the current *knowledge shard* (a random ``mask_ratio``
share of W'_v's entries, drawn from a local generator seeded by ``mask_seed`` and the shard's number), and W'_v is
kept within ``norm_constraint`` of W_v entrywise after each step. Training stops early once the loss is at most 0.02
and moved by at most 1e-4 (the reference's meter). ε is ``act_ratio`` times the smallest mean Δ(x_e) an edit left.

Knowledge sharding and merging (§2.3.2): every ``save_freq`` edits the shard is saved and a fresh one (W'_v = W_v,
a new mask) begins; every ``merge_freq`` edits the saved shards are merged into one side memory by TIES
(:mod:`editscope.edit.ties`, density ``density``; an earlier merged memory joins the merge with weight 0.6 and the
shards share 0.4, as the reference code does). ``retrieve: false`` is WISE-Merge: the router picks among the merged
memory, the saved shards awaiting their merge and the current shard, all with the one ε; ``retrieve: true`` is
WISE-Retrieve: each merge becomes its own memory with its own ε (the least of its shards'), the saved shards and
the current shard theirs, and the router picks the candidate of highest score.

Conventions (named, paper by default): ``paper`` — Δ is the distance of the outputs (Δ_act above) and each hinge is
averaged over all its terms; ``reference`` (zjunlp/EasyEdit ``models/wise``) — Δ is the distance of the outputs
after the model's activation function σ(·), and each hinge is averaged over its violated terms only. Both route on
the prompt's tokens (the reference code averages over every token of the sequence fed, answer and padding
included). The reference code's merge of the unsaved shard at evaluation time is not taken: the router consults
the saved shards instead, so evaluating never changes the memory.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import torch

from editscope.data.records import EditRequest
from editscope.edit.context import context_templates, fill
from editscope.edit.hparams import HParams, OwnLayer, check_convention
from editscope.edit.side_memory import SideMemoryEdit, activation_fn, scores, side_outputs
from editscope.edit.state import EditState
from editscope.edit.ties import ties_merge
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.full_forward import select_rows
from editscope.lm.partial_forward import BlockForward, continuation_nll
from editscope.progress import report

CONVENTIONS: dict[str, dict[str, str]] = {"paper": {"distance": "output", "hinge": "all"},
                                          "reference": {"distance": "activation", "hinge": "violated"}}
STOP_LOSS, STOP_DELTA = 0.02, 1e-4  # the reference's early-stop meter
MERGED_WEIGHT = 0.6  # an earlier merged memory's TIES weight in a later merge (the shards share the rest)


@dataclass
class WiseHParams(HParams):
    """One layer (its MLP down projection); the routing margins α < β and γ; the shard and merge schedule; the
    side memory's training (``lr``, ``n_iter``, ``weight_decay``, ``norm_constraint``)."""
    # derived layers follow WISE's own published late layer (its authors' configs in EasyEdit; hparams.derived_layers)
    LAYER_RULE = "own"
    OWN_LAYERS = {"llama": OwnLayer("LLaMA-2-7B", 32, 27, "zjunlp/EasyEdit hparams/WISE/llama-7b.yaml"),
                  "gptj": OwnLayer("GPT-J 6B", 28, 21, "zjunlp/EasyEdit hparams/WISE/gpt-j-6B.yaml")}

    method = "wise"
    layers: list[int] = field(default_factory=lambda: [0])
    lr: float = 1.0
    n_iter: int = 70
    weight_decay: float = 1e-5
    norm_constraint: float = 1.0
    mask_ratio: float = 0.2
    mask_seed: int = 0
    alpha: float = 5.0
    beta: float = 20.0
    gamma: float = 10.0
    act_ratio: float = 0.88
    save_freq: int = 500
    merge_freq: int = 1000
    density: float = 0.53
    retrieve: bool = False
    context_templates: list[list[int]] = field(default_factory=lambda: [[5, 5], [10, 5]])
    template_seed: int = 0
    template_start: str | None = None
    irrelevant_pool: str = "counterfact-train"
    convention: str = "paper"

    RANGES: ClassVar[dict[str, str]] = {"lr": "(0, 10]", "n_iter": "[1, 10000]", "weight_decay": "[0, 1]",
                                        "norm_constraint": "(0, 1e6]", "mask_ratio": "(0, 1]", "alpha": "[0, 1e6]",
                                        "beta": "[0, 1e6]", "gamma": "[0, 1e6]", "act_ratio": "(0, 10]",
                                        "save_freq": "[1, 1e9]", "merge_freq": "[1, 1e9]", "density": "(0, 1]",
                                        "template_seed": "[0, 1e18]", "mask_seed": "[0, 1e18]"}
    TUNABLE: ClassVar[dict[str, tuple]] = {"lr": (0.1, 0.3, 1.0), "act_ratio": (0.5, 0.88, 1.0)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        if len(self.layers) != 1:
            raise EditscopeError(f"{where}: key 'layers': WISE keeps its side memory at one layer, got {self.layers}")
        check_convention(self, where, CONVENTIONS, {})
        if self.alpha >= self.beta:
            raise EditscopeError(f"{where}: keys 'alpha', 'beta': an irrelevant prompt's score must stay below an "
                                 f"edit's (alpha < beta), got alpha {self.alpha}, beta {self.beta}")
        if self.merge_freq % self.save_freq:
            raise EditscopeError(f"{where}: key 'merge_freq': a merge takes whole shards, so it must be a multiple of "
                                 f"save_freq ({self.save_freq}), got {self.merge_freq}")

    @property
    def distance(self) -> str:
        return CONVENTIONS[self.convention]["distance"]

    def protocol(self) -> dict[str, str]:
        return {"convention": self.convention, "distance": self.distance,
                "variant": "retrieve" if self.retrieve else "merge"}

    def memories_after(self, n: int) -> tuple[int, int, int]:
        """(merged, saved, current): the side memories :meth:`WiseMemory.record`'s schedule leaves in force after
        ``n`` edits from an empty memory -- WISE-Merge's one merged memory (WISE-Retrieve keeps each merge among the
        saved), the shards saved since the last merge, and 1 while a shard is being written (what ``plan`` counts)."""
        per_merge = self.merge_freq // self.save_freq
        merges, saved = n // self.merge_freq, n // self.save_freq - (n // self.merge_freq) * per_merge
        current = 1 if n % self.save_freq else 0
        if self.retrieve:
            return 0, saved + merges, current
        return min(merges, 1), saved, current


class WiseMemory(EditState):
    """The side memories: ``merged`` (WISE-Merge's merged memory, None before the first merge), ``saved`` (shards,
    or in WISE-Retrieve merged groups, awaiting their next merge, each with its least edit score in
    ``saved_min``), the current ``shard`` and its gradient ``mask`` (None: no edit yet in this shard), and the
    least edit score of the current shard (``shard_min``) and of every edit (``all_min``). Tensors are replaced,
    never written into."""

    def __init__(self, merged: torch.Tensor | None = None, saved: Sequence[torch.Tensor] = (),
                 saved_min: Sequence[float] = (), shard: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                 count: int = 0, shard_min: float = float("inf"), all_min: float = float("inf"),
                 merges: int = 0) -> None:
        self.merged, self.shard, self.mask = merged, shard, mask
        self.saved, self.saved_min = list(saved), list(saved_min)
        self.count, self.shard_min, self.all_min, self.merges = int(count), float(shard_min), float(all_min), merges

    def fork(self) -> Self:
        twin = super().fork()
        twin.saved, twin.saved_min = list(self.saved), list(self.saved_min)
        return twin

    def without_edits(self) -> WiseMemory:
        return WiseMemory()

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {f"saved.{i}": t for i, t in enumerate(self.saved)}
        for name in ("merged", "shard", "mask"):
            if getattr(self, name) is not None:
                tensors[name] = getattr(self, name)
        meta = {"saved_min": self.saved_min, "count": self.count, "shard_min": self.shard_min,
                "all_min": self.all_min, "merges": self.merges}
        return tensors, meta

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any], where: str) -> Self:
        n = len(meta.get("saved_min", []))
        expected = {f"saved.{i}" for i in range(n)}
        extra = set(tensors) - expected - {"merged", "shard", "mask"}
        if extra or not expected <= set(tensors) or (("shard" in tensors) != ("mask" in tensors)):
            raise EditscopeError(f"{where}: WISE memory: tensors {sorted(tensors)} do not match {n} saved shard(s)")
        try:
            return cls(tensors.get("merged"), [tensors[f"saved.{i}"] for i in range(n)],
                       [float(x) for x in meta["saved_min"]], tensors.get("shard"), tensors.get("mask"),
                       int(meta["count"]), float(meta["shard_min"]), float(meta["all_min"]), int(meta["merges"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise EditscopeError(f"{where}: WISE memory: metadata {exc!s} missing or malformed") from None

    # -- what the router sees -----------------------------------------------------------------------------
    def memories(self, hp: WiseHParams) -> tuple[list[torch.Tensor], list[float], list[str]]:
        """(side weights, their thresholds ε, their names) in force."""
        held = [(self.merged, self.all_min, "merged")] if self.merged is not None else []
        held += [(w, m, f"saved {i}") for i, (w, m) in enumerate(zip(self.saved, self.saved_min, strict=True))]
        held += [(self.shard, self.shard_min, "shard")] if self.shard is not None else []
        # WISE-Merge routes every memory with the one ε of all edits; WISE-Retrieve each with its own
        return ([w for w, _, _ in held], [hp.act_ratio * (m if hp.retrieve else self.all_min) for _, m, _ in held],
                [name for _, _, name in held])

    # -- the schedule (§2.3.2) ----------------------------------------------------------------------------
    def begin(self, base: torch.Tensor, hp: WiseHParams) -> None:
        """Before an edit: a fresh shard (W'_v = W_v and a new random mask) when the last one was saved."""
        if self.shard is not None:
            return
        generator = torch.Generator().manual_seed(hp.mask_seed * 1_000_003 + self.count // hp.save_freq)
        self.mask = torch.rand(base.shape, generator=generator) < hp.mask_ratio  # host: the state is kept there
        self.shard = base.detach().float().cpu().clone()

    def record(self, trained: torch.Tensor, score: float, base: torch.Tensor, hp: WiseHParams) -> None:
        """After an edit: keep the trained shard and its score; save and merge on schedule."""
        self.shard = trained.detach().float().cpu()
        self.shard_min, self.all_min = min(self.shard_min, score), min(self.all_min, score)
        self.count += 1
        if self.count % hp.save_freq == 0:
            self.saved, self.saved_min = self.saved + [self.shard], self.saved_min + [self.shard_min]
            self.shard, self.mask, self.shard_min = None, None, float("inf")
        if self.count % hp.merge_freq == 0:
            self.merge(base.detach().float().cpu(), hp)

    def merge(self, base: torch.Tensor, hp: WiseHParams) -> None:
        k = hp.merge_freq // hp.save_freq
        group, mins = self.saved[-k:], self.saved_min[-k:]
        if hp.retrieve:
            merged = ties_merge(base, group, [1.0 / k] * k, hp.density)
            self.saved, self.saved_min = self.saved[:-k] + [merged], self.saved_min[:-k] + [min(mins)]
        else:
            if self.merged is None:
                self.merged = ties_merge(base, group, [1.0 / k] * k, hp.density)
            else:
                weights = [(1.0 - MERGED_WEIGHT) / k] * k + [MERGED_WEIGHT]
                self.merged = ties_merge(base, group + [self.merged], weights, hp.density)
            self.saved, self.saved_min = self.saved[:-k], self.saved_min[:-k]
        self.merges += 1


def module_path(bundle: Bundle, hp: WiseHParams) -> str:
    return bundle.arch.layer_module_path(hp.layers[0], "mlp_out")


def edit_of(bundle: Bundle, requests: Sequence[EditRequest], hp: WiseHParams, memory: WiseMemory) -> SideMemoryEdit:
    """The side memory edit holding every memory of ``memory`` in force."""
    module = bundle.model.get_submodule(module_path(bundle, hp))
    weights, thresholds, names = memory.memories(hp)
    shape = tuple(module.weight.shape)
    return SideMemoryEdit(
        method="wise", hparams=hp.to_dict(), fingerprint=bundle.base_fingerprint, module=module_path(bundle, hp),
        weights=torch.stack(weights) if weights else torch.zeros(0, *shape),  # host: the memory is kept there
        thresholds=torch.tensor(thresholds, dtype=torch.float64), labels=tuple(names), distance=hp.distance,
        activation=str(getattr(bundle.config, "hidden_act", "") or getattr(bundle.config, "activation_function", "")),
        model_name=bundle.name, requests=[dict(prompt=r.prompt, subject=r.subject, target_new=r.target_new,
                                               target_true=r.target_true) for r in requests])


@functools.lru_cache(maxsize=4)
def _pool(name: str) -> tuple[tuple[str, str], ...]:
    """(prompt, true answer) of every single-request record of dataset ``name``."""
    from editscope.data import load_cases

    return tuple((c.requests[0].text, c.requests[0].target_true) for c in load_cases(name)
                 if len(c.requests) == 1 and c.requests[0].target_true)


def irrelevant(request: EditRequest, pool: str) -> tuple[str, str]:
    """The irrelevant prompt x_i of an edit: a record of ``pool`` chosen by a hash of the edit's prompt (the next
    one when it asks the edit's own prompt)."""
    records = _pool(pool)
    if len(records) < 2:
        raise EditscopeError(f"wise: irrelevant_pool {pool} holds {len(records)} usable record(s); need at least 2")
    i = zlib.crc32(request.text.encode("utf-8")) % len(records)
    if records[i][0] == request.text:
        i = (i + 1) % len(records)
    return records[i]


def hinge(x: torch.Tensor, hinge_mean: str) -> torch.Tensor:
    """The mean of max(0, x): over every term (``all``) or over the violated ones only (``violated``, 0 if none)."""
    positive = x.clamp(min=0)
    if hinge_mean == "all":
        return positive.mean()
    violated = x > 0
    return positive[violated].mean() if bool(violated.any()) else positive.sum() * 0.0


def margin_loss(edit_scores: torch.Tensor, irrelevant_scores: torch.Tensor, hp: WiseHParams) -> torch.Tensor:
    """L_a of the module docstring: edit scores above β, irrelevant ones below α, and every edit's score γ above
    every irrelevant one's."""
    how = CONVENTIONS[hp.convention]["hinge"]
    gap = hp.gamma - (edit_scores[:, None] - irrelevant_scores[None, :])
    return (hinge(irrelevant_scores - hp.alpha, how) + hinge(hp.beta - edit_scores, how) + hinge(gap, how))


def train_shard(engine: ScoringEngine, module: torch.nn.Module, layer: int, rows: list[tuple[str, str]], n_edit: int,
                shard: torch.Tensor, mask: torch.Tensor, hp: WiseHParams, *, what: str = "wise: training the side "
                "memory") -> tuple[torch.Tensor, float, float, int]:
    """W'_v after training on ``rows`` (the first ``n_edit`` the edit's, the rest irrelevant prompts) with the
    shard's ``mask``: (W'_v, the mean edit score of the last forward, the last loss, steps taken). Each step runs
    only what W'_v can change (:class:`_ShardForward`) and the head at the targets; each is reported as ``what``,
    step s/n_iter (:func:`editscope.progress.report`)."""
    batch = engine.prepare(rows)
    device = engine.bundle.device
    base = module.weight.detach()
    act = activation_fn(str(engine.bundle.config.hidden_act)) if hp.distance == "activation" else None
    columns = torch.arange(batch.input_ids.shape[1], device=device)[None, :]
    span = columns < torch.tensor(batch.context_lengths, device=device)[:, None]  # each row's prompt
    side = shard.to(device=device, dtype=torch.float32).clone().requires_grad_(True)
    lower, upper = base.float() - hp.norm_constraint, base.float() + hp.norm_constraint
    grad_mask = mask.to(device=device, dtype=torch.float32)
    optimiser = torch.optim.SGD([side], lr=hp.lr, weight_decay=hp.weight_decay)
    forward = _ShardForward(engine, module, layer, batch, n_edit)
    previous, loss_value, edit_score, steps = float("inf"), float("inf"), 0.0, 0
    for steps in range(1, hp.n_iter + 1):  # noqa: B007 -- the count is returned
        report(f"{what}, step", steps, hp.n_iter)
        hidden, main, out = forward.step(side)
        nll = continuation_nll(engine, forward.edits, hidden).mean()
        score = scores(main, out[None], span, act)[0]
        loss = nll + margin_loss(score[:n_edit], score[n_edit:], hp)
        loss_value, edit_score = float(loss.detach()), float(score[:n_edit].mean().detach())
        if abs(loss_value - previous) <= STOP_DELTA and loss_value <= STOP_LOSS:
            break
        previous = loss_value
        # W'_v's gradient alone, masked to the shard: the model's parameters keep no .grad
        side.grad = torch.autograd.grad(loss, [side])[0] * grad_mask
        optimiser.step()
        with torch.no_grad():
            side.copy_(torch.maximum(torch.minimum(side, upper), lower))
    return side.detach(), edit_score, loss_value, steps


class _ShardForward:
    """One training step's forward with the side weight W'_v in place of the module's own: the edit rows' final
    states and, for every row, the module's output with W_v and with W'_v (what the activation score compares).

    The module's input a is the same every step (the blocks below cannot see W'_v), so it is recorded once. Where
    the block adds the module's output to the residual stream as it is (no post-MLP norm) and a block follows, W'_v
    changes block ``layer + 1``'s input by a·(W'_v − W_v)ᵀ alone: each step runs blocks ``layer + 1``.. on the edit
    rows from that input (:class:`~editscope.lm.partial_forward.BlockForward`); elsewhere blocks ``layer``.. with the
    module's output swapped by a hook. The irrelevant rows are scored at the module only. Both equal a full forward
    with the hook to float rounding (``tests/edit/test_wise.py``)."""

    def __init__(self, engine: ScoringEngine, module: torch.nn.Module, layer: int, batch: TokenBatch,
                 n_edit: int) -> None:
        self.module, self.base = module, module.weight.detach()
        self.transposed, self.bias = type(module).__name__ == "Conv1D", getattr(module, "bias", None)
        self.edits = select_rows(batch, range(n_edit))  # the rows whose targets the loss reads
        self.additive = engine.arch.mlp_post_norm is None and layer + 1 < engine.n_layers
        key = f"blocks.{layer}.mlp_key"
        full = BlockForward(engine, batch, layer + 1 if self.additive else layer, also=[key])
        self.inputs = full.recorded[key]  # a, every row [B, T, d_in]
        self.main = side_outputs(self.inputs, self.base[None], self.transposed, self.bias)[0].detach()
        self.forward = full.select(range(n_edit))

    def step(self, side: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the edit rows' final states [n_edit, T, d], the module's output with W_v and with W'_v [B, T, d_out])."""
        out = side_outputs(self.inputs, side[None], self.transposed, self.bias)[0]
        n_edit = self.edits.input_ids.shape[0]
        if self.additive:
            shift = (out - self.main)[:n_edit].to(self.forward.entry.dtype)
            return self.forward.hidden(shift), self.main, out

        def swap(_module: torch.nn.Module, args: tuple, _output: torch.Tensor) -> torch.Tensor:
            return out[:n_edit].to(args[0].dtype)

        handle = self.module.register_forward_hook(swap)
        try:
            return self.forward.hidden(), self.main, out
        finally:
            handle.remove()


def compute(bundle: Bundle, requests: list[EditRequest], hp: WiseHParams, state: WiseMemory, *,
            engine: ScoringEngine, runtime: Any = None, **_: object) -> tuple[SideMemoryEdit, dict]:
    """Edit the requests one after another, each into the memory the earlier ones left."""
    module = bundle.model.get_submodule(module_path(bundle, hp))
    base = module.weight.detach()
    templates = context_templates(engine, hp.context_templates, hp.template_seed, hp.template_start,
                                  getattr(runtime, "templates", None))
    losses, scores_, steps = [], [], 0
    for i, request in enumerate(requests, 1):
        state.begin(base, hp)
        rows = [(fill(t, request.text), request.target_new) for t in templates]
        rows.append(irrelevant(request, hp.irrelevant_pool))
        trained, score, loss, n = train_shard(engine, module, hp.layers[0], rows, len(templates), state.shard,
                                              state.mask, hp, what=f"wise: edit {i}/{len(requests)}")
        state.record(trained, score, base, hp)
        losses.append(loss), scores_.append(score)
        steps += n
    info = {"edits_total": state.count, "merges": state.merges, "memories": len(state.memories(hp)[0]),
            "edit_score_mean": sum(scores_) / len(scores_), "epsilon": hp.act_ratio * state.all_min,
            "loss": sum(losses) / len(losses), "steps": steps}
    return edit_of(bundle, requests, hp, state), info
