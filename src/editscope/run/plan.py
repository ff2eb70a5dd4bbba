"""What a run edits, as data: the mode of a config as one tagged union, and the units of work it implies.

A config's ``mode`` (:attr:`editscope.run.config.RunConfig.mode`, parsed once) is one of :class:`Single`,
:class:`Batch`, :class:`Sequential`, :class:`Lifelong` or :class:`ProbeOnly`. Each says how many consecutive cases
make one *group* (the unit that is edited from the unedited model and restored after), which of a group's cases each
edit takes (:meth:`~Single.steps`), whether the edits of a group are chained (folded into the model one after
another, with one sequential editor state), which rows a method writes for a group (:meth:`~Single.units`: the
final rows, plus a lifelong chain's checkpoint rows) and its keys in the config's canonical form
(:meth:`~Single.to_dict`). The runner asks the mode; nothing compares mode names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

REPROBE = 1000  # cases a lifelong checkpoint re-probes at most (``reprobe``)
PROBE_GROUP = 16  # cases probed together in probe_only mode (one resume unit)

#: a row a method writes for a group: (case index in the block, edits applied when probed; None: the final row)
Unit = tuple[int, "int | None"]


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from the config seed and the identity of a unit of work (not from the order of work)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def reprobe_seed(seed: int, dataset: str, group: int) -> int:
    """The seed of a lifelong group's re-probe sample: no method in it, so every method samples alike (and the
    planner draws the same sample as the trial, with no model); the chains of one order under other thread counts
    sample alike too (:func:`seed_label`)."""
    return derived_seed(seed, seed_label(dataset), group, "reprobe")


def seed_label(label: str) -> str:
    """The block label a chain's seeds are drawn from: its own, less a thread count's mark (:func:`replica_label`),
    so that one order's chains under several thread counts edit and probe alike and differ only in their bits."""
    return label.rpartition(THREADS_MARK)[0] if label_threads(label) is not None else label


@dataclass(frozen=True)
class Single:
    """Every case edited alone, from the unedited model."""

    name = "single"
    chained = False
    edits = True
    #: every case edited alone from the unedited model: a card replays a case's edit as the run made it, and a
    #: window of independent edits may optimise several cases' v*/z together (runtime ``vstar_batch``)
    alone = True
    #: whether a group's chain saves a checkpoint file after each checkpoint round and resumes from it
    resumable = False

    @property
    def group_size(self) -> int:
        return 1

    @property
    def label(self) -> str:
        return self.name

    def steps(self, members: Sequence[int]) -> list[list[int]]:
        """The cases (block indices) of each edit of a group, in order."""
        return [[i] for i in members]

    def units(self, members: Sequence[int], n_requests: Callable[[int], int], seed: int) -> list[Unit]:
        """The rows one method writes for a group: one final row per case (:class:`Lifelong` adds checkpoints)."""
        return [(i, None) for i in members]

    def final_positions(self, group_size: int, seed: int) -> list[int]:
        """Positions in the group of the cases probed after the group's last edit: all of them."""
        return list(range(group_size))

    def pre_positions(self, group_size: int, seed: int) -> list[int]:
        """Positions in the group of the cases probed on the unedited model: all of them."""
        return list(range(group_size))

    def stratum(self, position: int, n_edited: int, group_size: int) -> tuple[bool, int] | None:
        """The stratum a probed row stands for where a probe took a sample (None: the rows are no sample)."""
        return None

    def is_checkpoint(self, r: int, n_rounds: int) -> bool:
        """Whether step ``r`` (1-based) of ``n_rounds`` ends with a probe before the group's last step: never here
        (:class:`Lifelong` probes between rounds)."""
        return False

    def edit_seeding(self, r: int) -> tuple[bool, tuple[int, ...]]:
        """How step ``r`` (1-based) of a group is seeded: (seeded by its identity, the round tag of that seed). The
        first step is; a ``sequential`` group's later edits continue the group's random stream."""
        return r == 1, ()

    @property
    def chain_schedule(self) -> tuple[int | tuple[int, ...], int] | None:
        """(checkpoints, batch) of a chain whose rounds may end with checkpoints (where lm-eval tasks run); None: the
        mode edits no such chain."""
        return None

    def step_name(self, r: int, case_ids: Sequence[str]) -> str:
        """The cases of step ``r``, as an editor's error names them."""
        return f"case {case_ids[0]}" if len(case_ids) == 1 else f"cases {case_ids[0]}..{case_ids[-1]}"

    def row_fields(self, position: int, rnd: int, edits: int, checkpoint: bool, group_size: int
                   ) -> dict[str, Any] | None:
        """What a row records of the probe that made it (None here; :class:`Lifelong`: the round, the edits on the
        model, whether it is a checkpoint row and, for a sampled probe, its stratum)."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The mode's keys of a config's canonical form (``run.json``, the digest): its name and group size."""
        return {"mode": self.name, "group_size": self.group_size}


@dataclass(frozen=True)
class Batch(Single):
    """``n`` consecutive cases edited in one edit."""

    n: int = 1
    name = "batch"
    alone = False

    @property
    def group_size(self) -> int:
        return self.n

    @property
    def label(self) -> str:
        return f"{self.name}:{self.n}"

    def steps(self, members: Sequence[int]) -> list[list[int]]:
        return [list(members)]


@dataclass(frozen=True)
class Sequential(Batch):
    """``n`` consecutive cases edited one after another, each edit on the model the previous ones left."""

    name = "sequential"
    chained = True

    def steps(self, members: Sequence[int]) -> list[list[int]]:
        return [[i] for i in members]


@dataclass(frozen=True)
class Lifelong(Single):
    """``rounds`` edits of ``batch`` cases each, chained (:class:`editscope.run.chain.GroupChain`); after each
    checkpoint round the cases edited so far are probed (the earlier ones: a fixed random sample of ``reprobe``
    once there are more). ``checkpoints`` names the checkpoint rounds: an int k, every k-th round (0: none), or a
    tuple of round numbers (1-based, increasing), e.g. a log scale that follows the first rounds closely and a long
    stream sparsely (:func:`checkpoint_due`). The last round's probe is the final rows either way.

    ``sampled``: the evaluation of a long stream costs what one checkpoint costs, whatever the stream's length. A
    checkpoint probes the batch just written (not every case edited since the previous checkpoint) and the fixed
    sample of ``reprobe`` earlier ones; the final rows are the same cut after the last round, and only the cases
    probed somewhere are probed before editing. Each row then records its stratum (the batch just written, or the
    earlier cases it was sampled from) with the stratum's size, so that tables and curves weigh the two by the
    number of cases they stand for (:func:`editscope.run.summary.summarize`).

    ``orders``: each dataset block is edited in this many orders, each its own chain: the block's own order and
    ``orders − 1`` seeded permutations of its cases (:func:`order_permutation`), each run as a block of its own
    labelled ``LABEL~orderK`` (:func:`editscope.run.blocks.load_blocks`); summaries add each checkpoint's spread
    across the orders (:func:`editscope.run.summary.across_orders`).

    ``threads``: the torch thread counts as a second source of spread. Each order's chain is run once under each
    count (a CPU matmul's last bits depend on it, and in a long chain such bits can decide where an editor breaks),
    each a block of its own: the first count's keeps the order's label, the others' are ``LABEL[~orderK]~threadsN``
    (:func:`chain_labels`); the spread across chains then covers orders and thread counts together. Empty: every
    chain runs under the process's own count."""

    batch: int = 1
    rounds: int = 1
    checkpoints: int | tuple[int, ...] = 0
    reprobe: int = REPROBE
    sampled: bool = False
    orders: int = 1
    threads: tuple[int, ...] = ()
    name = "sequential_batches"
    chained = True
    resumable = True
    alone = False

    @property
    def group_size(self) -> int:
        return self.batch * self.rounds

    @property
    def label(self) -> str:
        return f"{self.name}:{self.batch}x{self.rounds}"

    def steps(self, members: Sequence[int]) -> list[list[int]]:
        return [list(members[s:s + self.batch]) for s in range(0, len(members), self.batch)]

    def is_checkpoint(self, r: int, n_rounds: int) -> bool:
        """Round ``r`` (1-based) of ``n_rounds`` ends with a checkpoint probe (the last round's probe is the final
        rows')."""
        return checkpoint_due(self.checkpoints, r) and r < n_rounds

    def _new(self, n_edited: int) -> int:
        """How many of the ``n_edited`` cases a probe after them takes in full: those edited since the previous
        checkpoint (``sampled``: the batch just written; the last one may be short)."""
        done = -(-n_edited // self.batch)  # the round just edited
        if self.sampled:
            return n_edited - (done - 1) * self.batch
        previous = max((r for r in range(1, done) if checkpoint_due(self.checkpoints, r)), default=0)
        return n_edited - previous * self.batch

    def probed(self, n_edited: int, group_size: int, seed: int) -> list[int]:
        """Positions in the group of the cases a checkpoint after ``n_edited`` cases probes
        (:func:`reprobe_positions`; ``seed``: the group's re-probe seed)."""
        return reprobe_positions(n_edited, self._new(n_edited), self.reprobe, group_size, seed)

    def final_positions(self, group_size: int, seed: int) -> list[int]:
        return self.probed(group_size, group_size, seed) if self.sampled else list(range(group_size))

    def pre_positions(self, group_size: int, seed: int) -> list[int]:
        if not self.sampled:
            return list(range(group_size))
        n_rounds = -(-group_size // self.batch)
        probed = set(self.final_positions(group_size, seed))
        for r in range(1, n_rounds):
            if self.is_checkpoint(r, n_rounds):
                probed.update(self.probed(r * self.batch, group_size, seed))
        return sorted(probed)

    def stratum(self, position: int, n_edited: int, group_size: int) -> tuple[bool, int] | None:
        """``sampled``: (whether the row is of the batch just written, the number of cases of its stratum)."""
        if not self.sampled:
            return None
        new = self._new(n_edited)
        return (True, new) if position >= n_edited - new else (False, n_edited - new)

    def edit_seeding(self, r: int) -> tuple[bool, tuple[int, ...]]:
        """Every round seeded by its identity: a resumed chain edits round r exactly as an uninterrupted one."""
        return True, (r,)

    @property
    def chain_schedule(self) -> tuple[int | tuple[int, ...], int]:
        return self.checkpoints, self.batch

    def step_name(self, r: int, case_ids: Sequence[str]) -> str:
        return f"round {r} (cases {case_ids[0]}..{case_ids[-1]})"

    def row_fields(self, position: int, rnd: int, edits: int, checkpoint: bool, group_size: int
                   ) -> dict[str, Any] | None:
        fields: dict[str, Any] = {"checkpoint": checkpoint, "edits_applied": edits, "round": rnd}
        stratum = self.stratum(position, min(rnd * self.batch, group_size), group_size)
        if stratum is not None:  # a sampled probe: the row stands for the cases of its stratum
            fields["stratum"] = list(stratum)
        return fields

    def to_dict(self) -> dict[str, Any]:
        """``reprobe`` is recorded where it changes what is probed (so older runs keep their digest), ``sampled``
        where it is set."""
        every = self.checkpoints
        shape: dict[str, Any] = {"batch": self.batch, "rounds": self.rounds,
                                 "checkpoints": list(every) if isinstance(every, tuple) else every}
        if self.batch * (self.rounds - 1) > self.reprobe:
            shape["reprobe"] = self.reprobe
        if self.sampled:
            shape["sampled"] = True
        if self.orders > 1:
            shape["orders"] = self.orders
        if self.threads:
            shape["threads"] = list(self.threads)
        return super().to_dict() | shape

    def units(self, members: Sequence[int], n_requests: Callable[[int], int], seed: int) -> list[Unit]:
        units: list[Unit] = [(members[p], None) for p in self.final_positions(len(members), seed)]
        n_rounds = len(self.steps(members))
        for r in range(1, n_rounds):
            if self.is_checkpoint(r, n_rounds):
                applied = sum(n_requests(i) for i in members[:r * self.batch])
                units += [(members[p], applied) for p in self.probed(r * self.batch, len(members), seed)]
        return units


@dataclass(frozen=True)
class ProbeOnly(Single):
    """No edit: the unedited model's measurements, ``n`` cases probed together (one resume unit)."""

    n: int = PROBE_GROUP
    name = "probe_only"
    edits = False
    alone = False

    @property
    def group_size(self) -> int:
        return self.n


Mode = Single | Batch | Sequential | Lifelong | ProbeOnly


def mode_from_dict(data: Mapping[str, Any]) -> Mode:
    """Inverse of ``Mode.to_dict`` (the keys of a config's canonical form)."""
    name, n = data["mode"], int(data.get("group_size", 1))
    if name == "single":
        return Single()
    if name == "batch":
        return Batch(n)
    if name == "sequential":
        return Sequential(n)
    if name == "sequential_batches":
        every = data.get("checkpoints", 0)
        return Lifelong(data["batch"], data["rounds"], tuple(every) if isinstance(every, list) else every,
                        data.get("reprobe", REPROBE), bool(data.get("sampled", False)), int(data.get("orders", 1)),
                        tuple(int(t) for t in data.get("threads", ())))
    if name == "probe_only":
        return ProbeOnly(n)
    raise ValueError(f"unknown mode {name!r}")


ORDER_MARK = "~order"
"""Between a block's label and its order number in the label of a block edited in another order."""


def order_permutation(n: int, seed: int, order: int) -> list[int]:
    """The case order of edit order ``order`` of a block of ``n`` cases: order 0 is the block's own; order k ≥ 1 the
    permutation numpy's ``default_rng([seed, k])`` draws (``seed``: the config's)."""
    if order == 0:
        return list(range(n))
    return [int(i) for i in np.random.default_rng([int(seed), int(order)]).permutation(n)]


THREADS_MARK = "~threads"
"""Between a block's (order's) label and a torch thread count in the label of a chain run under that count."""


def order_label(label: str, order: int) -> str:
    """The label of ``label``'s block in edit order ``order`` (order 0 keeps the label)."""
    return label if order == 0 else f"{label}{ORDER_MARK}{order}"


def chain_labels(label: str, orders: int, threads: Sequence[int] = ()) -> list[tuple[str, int, int | None]]:
    """(label, edit order, torch thread count) of every chain of the block ``label``: each order (its label from
    :func:`order_label`) under each of ``threads``, the first count's chain keeping the order's label and the others'
    marked ``~threadsN`` (no count: the process's own, one chain per order)."""
    counts: list[int | None] = list(threads) or [None]
    return [(order_label(label, k) + ("" if i == 0 else f"{THREADS_MARK}{t}"), k, t)
            for k in range(orders) for i, t in enumerate(counts)]


def label_threads(label: str) -> int | None:
    """The torch thread count a block label :func:`replica_label` made names (None: none)."""
    head, mark, tail = label.rpartition(THREADS_MARK)
    return int(tail) if mark and tail.isdigit() else None


def base_label(label: str) -> tuple[str, int]:
    """(the block's own label, its edit order) of a block label :func:`order_label` or :func:`replica_label`
    made."""
    if label_threads(label) is not None:
        label = label.rpartition(THREADS_MARK)[0]
    head, mark, tail = label.rpartition(ORDER_MARK)
    return (head, int(tail)) if mark and tail.isdigit() else (label, 0)


def checkpoint_due(checkpoints: int | tuple[int, ...], r: int) -> bool:
    """Whether round ``r`` (1-based) is a checkpoint round of a ``checkpoints`` schedule: every k-th round for an int
    k (none for 0), the listed rounds for a tuple."""
    if isinstance(checkpoints, tuple):
        return r in checkpoints
    return bool(checkpoints) and r % checkpoints == 0


def reprobe_positions(n_edited: int, n_new: int, limit: int, group_size: int, seed: int) -> list[int]:
    """Positions (in edit order) of the edited cases a checkpoint probes: the ``n_new`` edited since the previous
    checkpoint (the efficacy of the batch just written; every case is thus first probed right after its edit, which
    the retention matrix counts on), and the earlier ones: all up to ``limit``; beyond, the ``limit`` of them with
    the smallest keys of one fixed random key per position of the group (from ``seed``: the config seed, dataset
    and group, not the method, so every method re-probes the same cases and they pair). The sample is nested: an
    earlier case left out at one checkpoint is never probed at a later one, so each sampled case's retention is
    followed from its edit on."""
    earlier = n_edited - n_new
    if earlier <= limit:
        return list(range(n_edited))
    keys = np.random.default_rng(seed).random(group_size)[:earlier]
    return sorted(np.argsort(keys, kind="stable")[:limit].tolist()) + list(range(earlier, n_edited))


__all__ = ["PROBE_GROUP", "REPROBE", "Batch", "Lifelong", "Mode", "ProbeOnly", "Sequential", "Single", "Unit",
           "checkpoint_due", "mode_from_dict", "reprobe_positions", "ORDER_MARK", "order_permutation", "order_label",
           "base_label", "THREADS_MARK", "chain_labels", "label_threads", "seed_label"]
