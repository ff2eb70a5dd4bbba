"""A run config's dataset blocks, loaded: the cases of each slice (validated: a malformed record fails here, before any
work), its suites, what is edited per case, and the groups of consecutive cases the runner edits together (the groups
of one shard). The runner and the planner (:mod:`editscope.run.planned`) cut a config the same way through this
module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from editscope.data import load_cases
from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.run.config import RunConfig
from editscope.run.plan import chain_labels, order_label, order_permutation
from editscope.run.suites import SuiteFactory, make_suite
from editscope.suites.base import Suite


@dataclass
class Block:
    """One dataset block, loaded: its cases and suites."""

    label: str
    cases: list[Case]
    suites: dict[str, Suite]
    requests: list[tuple[EditRequest, ...]] = field(default_factory=list)  # what is edited, per case
    groups: list[tuple[int, list[int]]] = field(default_factory=list)  # (group index, case indices)
    threads: int | None = None  # the torch thread count its chain runs under (mode ``threads``; None: the process's)
    chain: int = 0  # which of its dataset block's chains (edit orders × thread counts) it is; 0: the block itself


def load_blocks(config: RunConfig, *, limit: int | None = None,
                suite_factories: Mapping[str, SuiteFactory] | None = None) -> list[Block]:
    """Cases (validated: a malformed record fails here, before any work) and suites of every block; a lifelong
    mode with ``orders: K`` adds each block in K − 1 seeded permutations of its cases (:func:`in_order`), and with
    ``threads`` each order once per torch thread count (:func:`~editscope.run.plan.chain_labels`: the same cases in the
    same order)."""
    blocks = []
    orders = getattr(config.mode, "orders", 1)
    threads = getattr(config.mode, "threads", ())  # each order's chain once per thread count
    for spec in config.blocks:
        n = spec.limit if limit is None else (limit if spec.limit is None else min(limit, spec.limit))
        cases = load_cases(spec.dataset, offset=spec.offset, limit=n)
        if not cases:
            raise EditscopeError(f"dataset {spec.label}: the slice (offset {spec.offset}, limit {n}) holds no cases")
        ids = [c.case_id for c in cases]
        if len(set(ids)) != len(ids):
            raise EditscopeError(f"dataset {spec.label}: case ids are not unique")
        suites = {s.name: make_suite(s.name, s.options, suite_factories) for s in spec.suites}
        block = Block(spec.label, cases, suites, [edit_requests(spec.label, suites, c) for c in cases])
        ordered = [block, *(in_order(block, config.seed, k) for k in range(1, orders))]
        blocks += [replace(ordered[k], label=label, threads=t, chain=c)
                   for c, (label, k, t) in enumerate(chain_labels(spec.label, orders, threads))]
    return blocks


def in_order(block: Block, seed: int, order: int) -> Block:
    """``block`` with its cases in edit order ``order`` (:func:`~editscope.run.plan.order_permutation`), labelled
    ``LABEL~orderK``: a block of its own, so each order is its own chain, resumed and sharded like any."""
    perm = order_permutation(len(block.cases), seed, order)
    return Block(order_label(block.label, order), [block.cases[i] for i in perm], block.suites,
                 [block.requests[i] for i in perm])


def edit_requests(label: str, suites: Mapping[str, Suite], case: Case) -> tuple[EditRequest, ...]:
    """What to edit for ``case``: every suite's ``edit_requests(case)`` (by default the case's requests; the
    one_to_n suite edits every valid answer). Suites of one block that choose edits must agree."""
    chosen: tuple[EditRequest, ...] | None = None
    chooser = None
    for name, suite in suites.items():
        if not suite.chooses_edits:  # declared: measures the model whatever is edited
            continue
        reqs = tuple(suite.edit_requests(case))
        if chosen is not None and reqs != chosen:
            raise EditscopeError(f"dataset {label}: suites {chooser} and {name} edit different things for case "
                                 f"{case.case_id}; put them in separate dataset blocks")
        chosen, chooser = reqs, name
    return chosen if chosen is not None else tuple(case.requests)


def assign_groups(blocks: Sequence[Block], group_size: int, shard: tuple[int, int]) -> None:
    """Cut each block into groups of ``group_size`` consecutive cases; keep this shard's groups: group ``g`` of chain
    ``c`` goes to shard ``(g + c) mod n``. A lifelong chain is one group, so the offset is what spreads a block's edit
    orders over the shards; a block's own chain (c = 0) is cut as it always was."""
    i, n = shard
    for block in blocks:
        idx = list(range(len(block.cases)))
        groups = [(g, idx[s:s + group_size]) for g, s in enumerate(range(0, len(idx), group_size))]
        block.groups = [(g, members) for g, members in groups if (g + block.chain) % n == i]


__all__ = ["Block", "assign_groups", "edit_requests", "in_order", "load_blocks"]
