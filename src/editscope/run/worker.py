"""Execution: one group worker that loads what a run needs and computes the rows of a group (a task).

The runner (:class:`editscope.run.runner.Runner`, the driver: plan, resume, lock, run.json, summaries) holds one
worker and hands it its tasks through an executor; a Ray actor (:mod:`editscope.run.ray_executor`) holds a worker of
its own, on its own copy of the model. The worker's state is explicit: the method states' templates (AlphaEdit's
projectors, computed once per method), the engine's prompt format, the lm-eval hook the driver attaches, and the
runtime (whose template cache the editors share across groups).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from editscope.data import DATASETS, dataset_path
from editscope.data.records import Case
from editscope.edit.registry import get_editor
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.lm.engine import ChatFormat, ScoringEngine
from editscope.lm.loading import Bundle
from editscope.run.blocks import Block, assign_groups, load_blocks
from editscope.run.chain import ChainHost, GroupChain, load_pre_probes, pre_path, save_pre_probes
from editscope.run.config import RunConfig
from editscope.run.lengths import check_lengths
from editscope.run.plan import Unit, base_label
from editscope.run.planned import check_reach
from editscope.run.suites import SuiteFactory, SuiteFacts
from editscope.run.trial import Edits, Method, PreProbeCache, Probes, Trial


@dataclass
class Work:
    """What :meth:`GroupWorker.prepare` loaded: the blocks (cut into this shard's groups), each method by label, the
    engine."""

    blocks: list[Block]
    methods: dict[str, Method]
    engine: ScoringEngine



class GroupWorker:
    """Loads a run's blocks, model, methods and engine (:meth:`prepare`) and computes the rows of one group with
    every method (:meth:`group_rows`). ``out_dir`` is where the run's patches (``save_patches``) and chain checkpoint
    files go; ``bundle`` reuses a loaded model; ``pre_probes`` shares the unedited model's probes with other runs of
    the same cases (a tune's candidates)."""

    def __init__(self, config: RunConfig, *, out_dir: str | Path, limit: int | None = None,
                 shard: tuple[int, int] = (0, 1), suite_factories: Mapping[str, SuiteFactory] | None = None,
                 bundle: Bundle | None = None, log: Callable[[str], None] | None = None, progress: bool = True,
                 pre_probes: PreProbeCache | None = None) -> None:
        self.config = config
        self.mode = config.mode
        self.out_dir = Path(out_dir)
        self.limit = limit
        self.shard = shard
        self.suite_factories = dict(suite_factories or {})
        self.bundle = bundle
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.progress = progress
        self.pre_probes = pre_probes
        #: the state of the run's edits under the config's settings (prepare makes it anew, with diagnostics as
        #: the suites ask)
        self.runtime = EditRuntime(config.settings)
        self.declared: dict[tuple[str, str], tuple] = {}  # (dataset, suite) -> MetricSpecs (set by prepare)
        self.facts: dict[str, SuiteFacts] = {}  # suite name -> what the summary needs of it (set by prepare)
        self.prompt_format: dict[str, str] | None = None  # the engine's chat template, when prompts are wrapped
        self.lm_eval_hook = None  # the driver's LmEvalHook of the config's lm_eval key, if any
        self._state_templates: dict[str, Any] = {}

    def prepare(self) -> Work:
        """Load what the run needs, checked before any work: the blocks' cases and suites (cut into this shard's
        groups), the model, each method's editor and hparams, the scoring engine."""
        blocks = load_blocks(self.config, limit=self.limit, suite_factories=self.suite_factories)
        if self.limit is None:  # a --limit trial run stops short of the config's checkpoints by design
            check_reach(self.config, blocks)
        self.declared = {(b.label, name): s.declarations.specs for b in blocks for name, s in b.suites.items()}
        self.facts = {name: SuiteFacts.of(s) for b in blocks for name, s in b.suites.items()}
        # editors report what a suite's curves show of their rounds (a solve's condition number) only when asked
        self.runtime = EditRuntime(self.config.settings,
                                   diagnostics=any(s.edit_info_curves for b in blocks for s in b.suites.values()))
        assign_groups(blocks, self.mode.group_size, self.shard)
        if self.bundle is None:
            from editscope.lm import load

            self.log(f"loading model {self.config.model}")
            self.bundle = load(self.config.model, progress=self.log, device=self.config.device,
                               dtype=self.config.dtype)
        bundle = self.bundle
        if self.config.chat_template:  # a tokenizer without one fails here, before any work
            ChatFormat.of(bundle.tokenizer, bundle.name)
        specs = {b.label: b for b in self.config.blocks}
        for block in blocks:  # before any edit: every text fits
            spec = specs[base_label(block.label)[0]]
            check_lengths(bundle, str(dataset_path(spec.dataset)) if spec.dataset in DATASETS else spec.dataset,
                          block.cases)
        methods = {}
        for spec in self.config.methods:
            if not self.mode.edits:  # method "none": nothing to load
                continue
            editor = get_editor(spec.name)
            editor.check_model(bundle)  # an unsupported family fails here, before any work
            hp = editor.load_hparams(bundle, spec.hparams, spec.overrides or None, f"method {spec.label!r}: override")
            methods[spec.label] = Method(spec.label, editor, hp, tuple(spec.attached_plugins()))
            _check_context_suites(spec.label, editor, blocks)
        engine = ScoringEngine(bundle, chat_template=self.config.chat_template)
        self.prompt_format = engine.prompt_format
        return Work(blocks, methods, engine)

    def group_rows(self, work: Work, b: int, g: int, members: list[int], todo: dict[str, set[Unit]]
                   ) -> Iterator[dict[str, Any]]:
        """One task (block ``b``'s group ``g``): pre probes from the unedited model, then each method's rows (edit,
        probe, restore) of the units in ``todo[method]``; all of it under the block's torch thread count, where it
        has one (mode ``threads``)."""
        with torch_threads(work.blocks[b].threads):
            yield from self._group_rows(work, b, g, members, todo)

    def _group_rows(self, work: Work, b: int, g: int, members: list[int], todo: dict[str, set[Unit]]
                    ) -> Iterator[dict[str, Any]]:
        block, engine = work.blocks[b], work.engine
        trial = self._trial(block)
        positions = self.mode.pre_positions(len(members), trial.reprobe_seed(g))
        cases = [block.cases[members[k]] for k in positions]

        def probe() -> Probes:
            return trial.probe(engine, cases, "pre").at(positions, len(members))

        key = self.pre_key(engine, block, g, cases, positions, len(members))
        stored = pre_path(self.out_dir, block.label, g) if self.mode.resumable else None  # a chain's: kept on disk
        pre = self._stored_pre(stored, block, g, key, len(cases)) if stored is not None else None
        if pre is None:
            pre = probe() if self.pre_probes is None else self.pre_probes.get(key, probe)
            if stored is not None:
                save_pre_probes(stored, list(key), pre)
        for label in [m.label for m in self.config.methods]:
            if not todo[label]:
                continue
            if not self.mode.edits:  # probe_only: the unedited model's rows
                probe = (0, 0, list(range(len(members))), pre)
                yield from self._rows(self._trial(block), block, g, members, pre, None, probe, todo[label])
            else:
                yield from self._edit_group(self._trial(block, work.methods[label]), block, g, members, pre, engine,
                                            todo[label])

    def _stored_pre(self, path: Path, block: Block, g: int, key: tuple, n_cases: int) -> Probes | None:
        """A chained group's pre probes as its first run stored them in ``path``
        (:func:`~editscope.run.chain.save_pre_probes`), or None (no usable file: a damaged or foreign one is named in
        a warning)."""
        pre, problem = load_pre_probes(path, list(key))
        if problem is not None:
            self.log(f"warning: {path}: {problem}; probing the unedited model again")
        elif pre is not None:
            self.log(f"{block.label} group {g}: the unedited model's probes of {n_cases} case(s) read from {path}")
        return pre

    def pre_key(self, engine: ScoringEngine, block: Block, g: int, cases: Sequence[Case], positions: Sequence[int],
                size: int) -> tuple:
        """Everything a group's pre probe depends on: the config but its methods (model, seed, datasets, suites,
        mode), the runtime settings, the weights, the group and the cases probed at their positions."""
        return (self.config.digest(without=("methods",)), engine.fingerprint, block.label, g,
                tuple(c.case_id for c in cases), tuple(positions), size)

    def _trial(self, block: Block, method: Method | None = None) -> Trial:
        """The trial of ``method`` (None: the unedited model) on ``block``."""
        return Trial(block.label, block.suites, method, self.runtime, self.config.seed, self.prompt_format)

    def units(self, block: Block, g: int, members: list[int]) -> list[Unit]:
        """The rows one method writes for a group (:meth:`editscope.run.plan.Single.units`)."""
        return self.mode.units(members, lambda i: len(block.requests[i]), self._trial(block).reprobe_seed(g))

    def _edit_group(self, trial: Trial, block: Block, g: int, members: list[int], pre: Probes,
                    engine: ScoringEngine, todo: set[Unit]) -> Iterator[dict[str, Any]]:
        """Edit the group with one method, probe, restore; the rows of the units in ``todo``, each yielded as soon
        as its probe is done (a lifelong chain's checkpoint rows while the chain goes on)."""
        assert trial.method is not None
        label, editor, mode = trial.label, trial.method.editor, self.mode
        save_to = self.out_dir / "patches" / label if self.config.save_patches else None
        with trial.edits(self.bundle, chained=mode.chained, save_to=save_to, stem=f"{block.label}-g{g:05d}") as log:
            chain = GroupChain(trial, mode, block, g, members, engine, log, todo, self._chain_host())
            for probe in chain.rounds(lambda: self._new_state(label, editor)):  # one loop for every mode
                yield from self._rows(trial, block, g, members, pre, log, probe, todo, checkpoint=True)
            state = chain.state
            if label not in self._state_templates:
                self._state_templates[label] = state.without_edits()
            positions = mode.final_positions(len(members), trial.reprobe_seed(g))
            final = (len(log.records), sum(len(block.requests[i]) for i in members), positions,
                     trial.probe(engine, [block.cases[members[k]] for k in positions]))
        yield from self._rows(trial, block, g, members, pre, log, final, todo)
        chain.finished()

    def _rows(self, trial: Trial, block: Block, g: int, members: list[int], pre: Probes, log: Edits | None,
              probe: tuple[int, int, list[int], Probes], todo: set[Unit], *, checkpoint: bool = False
              ) -> list[dict[str, Any]]:
        """The rows in ``todo`` of one probe ``(round, edits applied, positions in members of the cases probed,
        probes)`` (the probes' j-th case is the one at the j-th position); ``log`` None: the unedited model's."""
        rnd, edits, positions, post = probe
        rows = []
        for j, k in enumerate(positions):
            i = members[k]
            if (i, edits if checkpoint else None) not in todo:
                continue
            lifelong = self.mode.row_fields(k, rnd, edits, checkpoint, len(members))
            row = trial.row(block.cases[i], i, model=self.bundle.name, mode=self.mode.label, group=g,
                            group_size=len(members), requests=block.requests[i], pre=pre.of(k),
                            post=post.of(j) if log is not None else None, eval_seconds=post.seconds,
                            edit_seconds=log.seconds(k) if log is not None else 0.0,
                            edit_info=log.info(k) if log is not None else None, lifelong=lifelong)
            rows.append(row.to_dict())
        return rows

    def _chain_host(self) -> ChainHost:
        return ChainHost(self.out_dir, self.config.digest(), self.lm_eval_hook, self.log)

    def _new_state(self, label: str, editor) -> Any:
        """A fresh sequential state: the first group's state without its edits (``EditState.without_edits``;
        AlphaEdit keeps its projectors, so the expensive part is computed once per method)."""
        template = self._state_templates.get(label)
        return template.without_edits() if template is not None else editor.new_state()

    def warm_stats(self, methods: Iterable[Method]) -> None:
        """Compute the layer statistics every method will need in one pass per token budget and precision (instead
        of one pass per method and layer set); they are cached on disk, so a later run reads them."""
        from editscope.stats import second_moments

        by_setting: dict[tuple[int, str], set[int]] = {}
        for method in methods:
            layers = method.editor.stats_layers(method.hp)
            if layers:
                key = (method.editor.stats_tokens(method.hp), method.editor.stats_dtype(method.hp))
                by_setting.setdefault(key, set()).update(layers)
        for (budget, dtype), layers in sorted(by_setting.items()):
            self.log(f"layer statistics for layers {sorted(layers)} ({budget} tokens, {dtype}; cached after the "
                     "first run)")
            second_moments(self.bundle, sorted(layers), token_budget=budget, progress=self.progress,
                           stats_dtype=dtype)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """The body under ``count`` torch threads, the process's own count restored after (None: unchanged)."""
    if count is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _check_context_suites(label: str, editor, blocks: Sequence[Block]) -> None:
    """A context editor cannot be measured by a suite that perturbs prompt embeddings: one line before any work."""
    if editor.kind != "context":
        return
    for block in blocks:
        bad = [name for name, suite in block.suites.items() if suite.reads_prompt_embeddings]
        if bad:
            raise EditscopeError(f"method {label!r} is a context editor, and suite {bad[0]} of block {block.label} "
                                 "scores prompts from perturbed embeddings, which cannot hold its context; drop the "
                                 "suite for this method (a separate block or run)")
