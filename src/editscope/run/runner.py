"""The experiment runner: config -> (edit -> evaluate -> restore)* -> ``results.jsonl`` -> summaries.

Work is cut into *groups* of cases per dataset block (``single``: one case; ``batch: N`` / ``sequential: N``:
N consecutive cases). For every group the pre-edit probes of every suite are computed once and shared by all
methods; then per method the group is edited (one edit per case; one edit of all the group's requests; or N
edits accumulated, with one sequential-state object from ``editor.new_state()``), every case of the group is
probed again, its metrics computed, and one line per (case, method) appended to ``results.jsonl`` (flush +
fsync). The weights are restored bit-exactly (``Patch.revert`` in reverse order, checked against the patches'
pre-edit checksums) after every group, also when anything raises.

``sequential_batches`` (batch B, rounds T, checkpoints k): a group is T·B consecutive cases; round t applies one
edit of the requests of cases (t-1)·B..t·B-1 with the editor's sequential state carried through the rounds; after
every k-th round (k > 0) the cases edited so far are probed (checkpoint rows, ``checkpoint: true``, written as soon
as the probe ends), after the last round every case of the group (the rows summaries use); rows record
``edits_applied`` (requests on the model when it was probed) and ``round``. The rounds are
:class:`editscope.run.chain.LifelongChain`, which saves the chain's state after each checkpoint's rows and resumes
a killed chain there. ``probe_only`` (``methods: [none]``): no edit; one row per case with method ``none``
holding only the pre-edit (``NAME_pre``) metrics and ``post: {}``. Pre-edit probes always come from the unedited
model (before the group's first edit), so locality compares against the unedited model's answers in every mode.

Every row names the model that produced it (``model``: run.json's ``model.name``; rows written before the field
existed are the run's model). A config with a ``models`` list is one such run per model
(:mod:`editscope.run.models`); :class:`Runner` runs one model.

Resuming skips finished rows (key: dataset, case, method, plus the checkpoint's ``edits_applied``:
:func:`~editscope.run.store.row_key`); a group with some rows missing is edited again (a lifelong chain from its
last checkpoint file) and only the missing rows are written (edits are seeded per dataset/method/group and round, so
they are the same). Sharding assigns whole groups (group index mod n), so a sharded run and ``merge`` give the rows
of an unsharded run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from editscope.atomic import atomic_write_text
from editscope.data import DATASETS, dataset_path, load_cases
from editscope.data.records import Case, EditRequest
from editscope.edit.objective import independent_edits
from editscope.edit.patch import Patch, tensor_checksum
from editscope.edit.registry import get_editor
from editscope.edit.runtime import ENV, EditRuntime
from editscope.errors import EditscopeError
from editscope.finite import REASONS_KEY
from editscope.lm.engine import ChatFormat, ScoringEngine
from editscope.lm.loading import Bundle
from editscope.progress import listening, report
from editscope.run.chain import LifelongChain, naming, remove_chain_files, reprobe_positions
from editscope.run.config import NO_EDIT, RunConfig
from editscope.run.lengths import check_lengths
from editscope.run.lmeval import LmEvalFailed, lm_eval_units
from editscope.run.store import (
    MODELS_JSON,
    RESULTS,
    RUN_JSON,
    ResultsWriter,
    clean_metrics,
    drop_duplicates,
    read_json,
    read_results,
    row_key,
    run_lock,
    unit_key,
)
from editscope.run.suites import SuiteFactory, declarations_to_json, make_suite, probe_cases
from editscope.run.summary import SummaryRow, results_text, write_summary
from editscope.suites.base import Suite

FORMAT = "editscope-run-1"
VERSION_PACKAGES = ("editscope", "torch", "transformers", "numpy")


@dataclass
class Block:
    """One dataset block, loaded: its cases and suites."""

    label: str
    cases: list[Case]
    suites: dict[str, Suite]
    requests: list[tuple[EditRequest, ...]] = field(default_factory=list)  # what is edited, per case
    groups: list[tuple[int, list[int]]] = field(default_factory=list)  # (group index, case indices)


@dataclass
class RunResult:
    out_dir: Path
    written: int
    skipped: int
    total_rows: int
    summary: list[SummaryRow]
    #: the headline tables as plain text (:func:`~editscope.run.summary.results_text`)
    tables: str = ""


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/n"`` (0 <= i < n) -> (i, n); None -> (0, 1)."""
    if text is None:
        return (0, 1)
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise EditscopeError(f"--shard {text!r}: expected i/n, e.g. 0/4") from exc
    if not (n >= 1 and 0 <= i < n):
        raise EditscopeError(f"--shard {text!r}: need 0 <= i < n")
    return (i, n)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in VERSION_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = sys.version.split()[0]
    return out


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from the config seed and the identity of a unit of work (not from the order of work)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _scalars(info: Mapping[str, Any]) -> dict[str, Any]:
    """The finite scalars of an edit's ``info``, by key name: a chain's checkpoint stores them sorted, so a resumed
    run writes them in the order a fresh one does."""
    out = {}
    for key, value in sorted(info.items()):
        if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
            out[key] = value
    return out


def load_blocks(config: RunConfig, *, limit: int | None = None,
                suite_factories: Mapping[str, SuiteFactory] | None = None) -> list[Block]:
    """Cases (validated: a malformed record fails here, before any work) and suites of every block."""
    blocks = []
    for spec in config.blocks:
        n = spec.limit if limit is None else (limit if spec.limit is None else min(limit, spec.limit))
        cases = load_cases(spec.dataset, offset=spec.offset, limit=n)
        if not cases:
            raise EditscopeError(f"dataset {spec.label}: the slice (offset {spec.offset}, limit {n}) holds no cases")
        ids = [c.case_id for c in cases]
        if len(set(ids)) != len(ids):
            raise EditscopeError(f"dataset {spec.label}: case ids are not unique")
        suites = {s.name: make_suite(s.name, s.options, suite_factories) for s in spec.suites}
        blocks.append(Block(spec.label, cases, suites, [edit_requests(spec.label, suites, c) for c in cases]))
    return blocks


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
    """Cut each block into groups of ``group_size`` consecutive cases; keep this shard's groups."""
    i, n = shard
    for block in blocks:
        idx = list(range(len(block.cases)))
        groups = [(g, idx[s:s + group_size]) for g, s in enumerate(range(0, len(idx), group_size))]
        block.groups = [(g, members) for g, members in groups if g % n == i]


def _check_reverted(bundle: Bundle, checksums: Mapping[str, str]) -> None:
    """Every parameter an edit touched is back at the bytes it had before the first edit (``checksums``)."""
    params = dict(bundle.model.named_parameters())
    for name, checksum in checksums.items():
        if tensor_checksum(params[name]) != checksum:
            raise EditscopeError(f"parameter {name} was not restored after the edit (bug: please report)")


@dataclass
class _GroupEdits:
    """What one group's edits left: the patches still applied (``loose``; in a chain each is folded into the
    bundle as soon as it is taken), the pre-edit checksum of every edited parameter, per edit (patch) a record
    of its cases, seconds and ``info`` scalars, and per case the edit that edited it: what the rows need, nothing
    that grows with the size of the weights. :meth:`take` saves a patch (when asked) and, in a chain, folds it."""

    bundle: Bundle
    chained: bool
    save_to: Path | None
    stem: str
    loose: list[Patch] = field(default_factory=list)
    checksums: dict[str, str] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    patch_of: list[int] = field(default_factory=list)

    @property
    def n_cases(self) -> int:
        """Cases edited so far."""
        return len(self.patch_of)

    def seconds(self, k: int) -> float:
        return self.records[self.patch_of[k]]["seconds"]

    def info(self, k: int) -> dict[str, Any]:
        return self.records[self.patch_of[k]]["info"]

    def take(self, patch: Patch, n_cases: int) -> None:
        """Record ``patch`` (just applied) as the edit of the next ``n_cases`` cases."""
        self.loose.append(patch)  # first: whatever fails below, the caller reverts what it holds
        for name, checksum in patch.checksums.items():
            self.checksums.setdefault(name, checksum)
        self.patch_of += [len(self.records)] * n_cases
        self.records.append({"cases": n_cases, "seconds": patch.info["seconds"], "info": _scalars(patch.info),
                             "digest": patch.digest})
        if self.save_to is not None:
            patch.save(self.save_to / f"{self.stem}-{len(self.records) - 1}.safetensors")
        if self.chained:
            self.bundle.fold(patch)
            self.loose.pop()

    def restored(self, patch: Patch, records: Sequence[Mapping[str, Any]]) -> None:
        """A resumed chain: ``patch`` (the folded ΔW of the rounds before, already folded) and those rounds'
        :attr:`records` as its checkpoint saved them."""
        for name, checksum in patch.checksums.items():
            self.checksums.setdefault(name, checksum)
        for record in records:
            self.patch_of += [len(self.records)] * int(record["cases"])
            self.records.append({"cases": int(record["cases"]), "seconds": float(record["seconds"]),
                                 "info": dict(record["info"]), "digest": str(record["digest"])})


class Runner:
    """Runs one config into one output directory; see the module docstring.

    ``on_row(row)`` is called after each row is stored (progress hooks; tests raise from it to simulate a
    kill). ``suite_factories`` adds suites by name beside the registry. ``bundle`` reuses a loaded model.
    """

    def __init__(self, config: RunConfig, *, out_dir: str | Path | None = None, limit: int | None = None,
                 shard: tuple[int, int] = (0, 1), progress: bool = True, repair: bool = False,
                 on_row: Callable[[dict[str, Any]], None] | None = None,
                 suite_factories: Mapping[str, SuiteFactory] | None = None, bundle: Bundle | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        if config.models:  # a models list is one run per model (editscope.run.models.run_models)
            raise EditscopeError(f"{config.where}: a config with 'models' runs one model at a time: "
                                 "editscope.run.models.run_models, or Runner(config.for_model(entry))")
        self.config = config
        self.out_dir = Path(out_dir if out_dir is not None else config.output)
        self.limit = limit
        self.repair = repair
        self.shard = shard
        self.progress = progress
        self.on_row = on_row
        self.suite_factories = dict(suite_factories or {})
        self.bundle = bundle
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        #: how edits are computed: the config's runtime settings, the environment's defaults for the others
        self.runtime = EditRuntime.from_settings(dict(config.runtime), where=f"{config.where}: runtime")
        self._state_templates: dict[str, Any] = {}
        self._declared: dict[tuple[str, str], tuple] = {}  # (dataset, suite) -> MetricSpecs (set by _prepare)
        self._editors: dict[str, Any] = {}  # label -> Editor (set by _prepare)
        self._plugins: dict[str, list] = {}  # label -> attached plug-ins
        self.lm_eval_hook = None  # LmEvalHook of the config's lm_eval key (set by _run_locked)
        self._prompt_format: dict[str, str] | None = None  # the engine's chat template, when prompts are wrapped

    # -- what a lifelong chain (editscope.run.chain) asks of the runner ------------------------------------
    def seed_of(self, *identity: object) -> int:
        """The seed of a unit of work (from the config seed and its identity, not from the order of work)."""
        return derived_seed(self.config.seed, *identity)

    def plugins_of(self, label: str) -> list:
        return self._plugins[label]

    def probe(self, block: Block, label: str, g: int, cases: list[Case], engine: ScoringEngine,
              *tag: object) -> tuple[dict[str, list], float]:
        return self._probe(block, label, g, cases, engine, *tag)

    # -- set-up -------------------------------------------------------------------------------------------
    def _prepare(self):
        blocks = load_blocks(self.config, limit=self.limit, suite_factories=self.suite_factories)
        self._declared = {(b.label, name): s.declarations.specs for b in blocks for name, s in b.suites.items()}
        assign_groups(blocks, self.config.group_size, self.shard)
        if self.bundle is None:
            from editscope.lm import load

            self.log(f"loading model {self.config.model}")
            self.bundle = load(self.config.model, progress=self.log, device=self.config.device,
                               dtype=self.config.dtype)
        bundle = self.bundle
        if self.config.chat_template:  # a tokenizer without one fails here, before any work
            ChatFormat.of(bundle.tokenizer, bundle.name)
        for block, spec in zip(blocks, self.config.blocks, strict=True):  # before any edit: every text fits
            check_lengths(bundle, str(dataset_path(spec.dataset)) if spec.dataset in DATASETS else spec.dataset,
                          block.cases)
        editors, hparams = {}, {}
        for spec in self.config.methods:
            if self.config.probe_only:  # method "none": nothing to load
                continue
            editors[spec.label] = editor = get_editor(spec.name)
            editor.check_model(bundle)  # an unsupported family fails here, before any work
            self._plugins[spec.label] = spec.attached_plugins()
            hparams[spec.label] = editor.load_hparams(bundle, spec.hparams, spec.overrides or None,
                                                      f"method {spec.label!r}: override")
        self._editors = editors
        return blocks, editors, hparams

    def _run_json(self, started: str, status: str, rows: int, finished: str | None = None) -> dict[str, Any]:
        bundle = self.bundle
        assert bundle is not None
        return {
            "format": FORMAT,
            "config": self.config.to_dict(),
            "config_digest": self.config.digest(self.runtime.settings()),
            "runtime": self.runtime.settings(),
            "model": {"name": bundle.name, "fingerprint": bundle.fingerprint, "n_layers": bundle.n_layers,
                      "device": bundle.device.type},
            "shard": list(self.shard),
            "limit": self.limit,
            "versions": package_versions(),
            "started": started,
            "finished": finished,
            "status": status,
            "rows": rows,
            "argv": sys.argv,
            "metrics": declarations_to_json(self._declared),
        } | ({"prompt_format": self._prompt_format} if self._prompt_format else {}) | (
            {"lm_eval_version": _lm_eval_version()} if self.config.lm_eval else {})

    def _check_existing(self) -> str | None:
        """The start time of the run already in the output directory (resume), after checking it is ours."""
        path = self.out_dir / RUN_JSON
        if (self.out_dir / MODELS_JSON).is_file():
            raise EditscopeError(f"{self.out_dir} holds a run of a 'models' list; use another output directory")
        if not path.is_file():
            if (self.out_dir / RESULTS).is_file():
                raise EditscopeError(f"{self.out_dir}: holds {RESULTS} but no {RUN_JSON}; not resuming into it")
            return None
        meta = read_json(path)
        assert self.bundle is not None
        self._check_runtime(meta.get("runtime") or {})
        if meta.get("config_digest") != self.config.digest(self.runtime.settings()):
            raise EditscopeError(f"{self.out_dir} holds a run of a different config; use another output directory")
        if meta.get("model", {}).get("fingerprint") != self.bundle.fingerprint:
            raise EditscopeError(f"{self.out_dir} holds a run on a model with another fingerprint "
                                 f"({meta.get('model', {}).get('fingerprint')} != {self.bundle.fingerprint})")
        device, here = meta.get("model", {}).get("device"), self.bundle.device.type
        if device is not None and device != here:  # the fingerprint ignores the device; the last bits do not
            raise EditscopeError(f"{self.out_dir} holds rows computed on {device}, this run is on {here}: resume with "
                                 f"--device {device} or use another output directory")
        if list(meta.get("shard", [0, 1])) != list(self.shard):
            raise EditscopeError(f"{self.out_dir} holds shard {meta.get('shard')}, not {list(self.shard)}")
        return meta.get("started")

    def _check_runtime(self, stored: dict[str, Any]) -> None:
        """A resume under other runtime settings than the stored rows' is refused, naming the setting (rows
        written before run.json recorded them were computed under the defaults)."""
        from editscope.edit.runtime import DEFAULT_SETTINGS

        for key, value in self.runtime.settings().items():
            before = stored.get(key, DEFAULT_SETTINGS[key])
            if before != value:
                raise EditscopeError(f"{self.out_dir} holds rows computed with runtime {key}={before}, this run has "
                                     f"{key}={value} (config 'runtime', --{key.replace('_', '-')} or {ENV[key]}): "
                                     "resume with the same value or use another output directory")

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run (or resume) holding the output directory's lock: a second writer fails at once."""
        with run_lock(self.out_dir):
            if self.repair:
                dropped = drop_duplicates(self.out_dir / RESULTS)
                self.log(f"--repair: dropped {dropped} duplicate row(s) of {self.out_dir / RESULTS}")
            return self._run_locked()

    def _run_locked(self) -> RunResult:
        blocks, editors, hparams = self._prepare()
        bundle = self.bundle
        assert bundle is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        started = self._check_existing() or _now()
        existing = read_results(self.out_dir / RESULTS, repair=True)
        done = {row_key(r) for r in existing}
        methods = [m.label for m in self.config.methods]

        def missing(block: Block, g: int, members: list[int], label: str) -> set[tuple[int, int | None]]:
            return {(i, e) for i, e in self._units(block, g, members)
                    if unit_key(block.label, block.cases[i].case_id, label, e) not in done}

        pending = sum(len(missing(b, g, members, m)) for b in blocks for g, members in b.groups for m in methods)
        total = sum(len(self._units(b, g, members)) for b in blocks for g, members in b.groups) * len(methods)
        planned = {"planned_rows": total}  # what the report and a models rerun count the rows against
        atomic_write_text(self.out_dir / RUN_JSON, _json(self._run_json(started, "running", len(existing)) | planned))
        if done:
            self.log(f"resuming {self.out_dir}: {total - pending} of {total} rows done")
        if pending:
            self._warm_stats(hparams)
        engine = ScoringEngine(bundle, chat_template=self.config.chat_template)
        self._prompt_format = engine.prompt_format
        if self.config.lm_eval is not None:  # lm-evaluation-harness at chain checkpoints (editscope.run.lmeval)
            from editscope.run.lmeval import LmEvalHook

            self.lm_eval_hook = LmEvalHook(self.config.lm_eval, self.out_dir, every=self.config.checkpoints,
                                           batch=self.config.batch, chat_template=self.config.chat_template,
                                           log=self.log)
            self.lm_eval_hook.baseline(bundle)
        written, status, failure = 0, "interrupted", {}
        from tqdm import tqdm

        bar = tqdm(total=pending, desc="edit+evaluate", unit="row", disable=not self.progress, dynamic_ncols=True)
        try:
            with ResultsWriter(self.out_dir / RESULTS) as writer:
                tasks = [(b, g, members, todo) for b, block in enumerate(blocks) for g, members in block.groups
                         if any((todo := {m: missing(block, g, members, m) | lm_eval_units(
                             self.lm_eval_hook, block, g, members, m) for m in methods}).values())]
                # closing(): on an error here the edit generators restore the weights now, not when the
                # traceback holding their frames is collected
                with closing(self._execute(blocks, tasks, editors, hparams, engine)) as produced, \
                        listening(bar_status(bar) if self.progress else None):
                    for row in produced:
                        writer.append(row)  # flush + fsync before the chain that produced it goes on
                        written += 1
                        bar.update(1)
                        if self.on_row is not None:
                            self.on_row(row)
            status = "complete"
            remove_chain_files(self.out_dir)  # every chain's final rows are written
        except LmEvalFailed as exc:  # a task failed inside lm-eval at a checkpoint: run.json says which and why
            status, failure = "failed", {"error": str(exc)}
            raise
        finally:
            bar.close()
            rows = read_results(self.out_dir / RESULTS)
            summary = write_summary(self.out_dir, rows, specs=self._declared, method_order=methods,
                                    dataset_order=[b.label for b in self.config.blocks])
            atomic_write_text(self.out_dir / RUN_JSON, _json(self._run_json(started, status, len(rows), _now())
                                                             | planned | failure))
        return RunResult(self.out_dir, written, total - pending, len(rows), summary,
                         results_text(summary, self._declared))

    def _execute(self, blocks: list[Block], tasks: list[tuple[int, int, list[int], dict[str, set]]], editors,
                 hparams, engine: ScoringEngine) -> Iterator[dict[str, Any]]:
        """The rows of every (block index, group, members, rows to do per method) task, in order, in this process
        (editscope.run.ray_executor overrides it to spread whole groups over Ray actors). In ``mode: single`` with
        runtime ``vstar_batch`` = N > 1, N cases at a time form a window of independent edits: the first edit in it
        optimises the v*/z of all N in one batched loop (edit.objective.independent_edits)."""
        size = (self.runtime.vstar_batch or 1) if self.config.mode == "single" else 1
        for s in range(0, len(tasks), size):
            with independent_edits(self.runtime, engine.bundle.fingerprint,
                                   [blocks[b].requests[i] for b, _, members, _ in tasks[s:s + size] for i in members]):
                for b, g, members, todo in tasks[s:s + size]:
                    yield from self._group_rows(blocks[b], g, members, todo, editors, hparams, engine)

    def _group_rows(self, block: Block, g: int, members: list[int], todo: dict[str, set], editors, hparams,
                    engine: ScoringEngine) -> Iterator[dict[str, Any]]:
        """One group: pre probes from the unedited model, then each method's rows (edit, probe, restore)."""
        cases = [block.cases[i] for i in members]
        torch.manual_seed(derived_seed(self.config.seed, block.label, g, "pre"))
        t0 = time.perf_counter()
        report(f"{block.label}: probing {len(cases)} case(s) before editing")
        pre = {name: probe_cases(s, engine, cases) for name, s in block.suites.items()}
        pre_seconds = (time.perf_counter() - t0) / len(cases)
        for label in [m.label for m in self.config.methods]:
            if not todo[label]:
                continue
            if self.config.probe_only:
                yield from self._probe_rows(block, g, members, cases, pre, pre_seconds, todo[label])
            else:
                yield from self._edit_group(block, g, members, cases, pre, label, editors[label],
                                            hparams[label], engine, todo[label])

    def _units(self, block: Block, g: int, members: list[int]) -> list[tuple[int, int | None]]:
        """The rows one method writes for a group: (case index, None) for the rows after the group's last edit,
        plus (case index, edits_applied) for the checkpoint rows of ``sequential_batches``."""
        units: list[tuple[int, int | None]] = [(i, None) for i in members]
        if self.config.mode == "sequential_batches" and self.config.checkpoints:
            b, k = self.config.batch, self.config.checkpoints
            n_rounds = -(-len(members) // b)
            for r in range(k, n_rounds, k):  # checkpoints before the last round (that one is the final rows)
                applied = sum(len(block.requests[i]) for i in members[:r * b])
                units += [(members[p], applied) for p in self.reprobed(block, g, members, r * b)]
        return units

    def reprobed(self, block: Block, g: int, members: list[int], n_edited: int) -> list[int]:
        """Positions in ``members`` of the cases a checkpoint after ``n_edited`` cases re-probes
        (:func:`~editscope.run.chain.reprobe_positions`)."""
        new = min(self.config.checkpoints * self.config.batch, n_edited)  # edited since the previous checkpoint
        return reprobe_positions(n_edited, new, self.config.reprobe, len(members),
                                 self.seed_of(block.label, g, "reprobe"))

    def _probe_rows(self, block: Block, g: int, members: list[int], cases: list[Case], pre: dict[str, list],
                    pre_seconds: float, todo: set[tuple[int, int | None]]) -> list[dict[str, Any]]:
        """probe_only rows: the pre-edit (``NAME_pre``) metrics of each case, no edit, ``post: {}``."""
        rows = []
        for k, (i, case) in enumerate(zip(members, cases, strict=True)):
            if (i, None) not in todo:
                continue
            metrics = {name: clean_metrics(_pre_metrics(s, case, pre[name][k])) for name, s in block.suites.items()}
            rows.append({
                "dataset": block.label, "case_id": case.case_id, "index": i, "model": self.bundle.name,
                "method": NO_EDIT, "editor": NO_EDIT,
                "method_display": "unedited", "plugins": [], "mode": self.config.mode_label, "group": g,
                "group_size": len(cases), "edit_seconds": 0.0, "eval_seconds": pre_seconds, "edit_info": {},
                "requests": _requests(block.requests[i]), "hparams": {},
                "protocol": self._protocol(block),
                "metrics": metrics, "pre": {name: pre[name][k] for name in block.suites}, "post": {},
            })
        return rows

    def _protocol(self, block: Block) -> dict[str, dict[str, Any]]:
        """Each suite's protocol (DESIGN rule 10), with the chat template's when prompts are wrapped in it."""
        fmt = self._prompt_format
        if not fmt:
            return {name: s.protocol for name, s in block.suites.items()}
        return {name: {**s.protocol, "chat_template": fmt["chat_template"],
                       "note": f"{s.protocol.get('note', '')}; {fmt['note']}".lstrip("; ")}
                for name, s in block.suites.items()}

    def _new_state(self, label: str, editor) -> Any:
        """A fresh sequential state: the first group's state without its edits (``EditState.without_edits``;
        AlphaEdit keeps its projectors, so the expensive part is computed once per method)."""
        template = self._state_templates.get(label)
        return template.without_edits() if template is not None else editor.new_state()

    def _warm_stats(self, hparams: Mapping[str, Any]) -> None:
        """Compute the layer statistics every method will need in one pass per token budget (instead of one
        pass per method and layer set); they are cached on disk, so a later run reads them."""
        from editscope.stats import second_moments

        by_budget: dict[int, set[int]] = {}
        for label, hp in hparams.items():
            editor = self._editors[label]
            layers = editor.stats_layers(hp)
            if layers:
                by_budget.setdefault(editor.stats_tokens(hp), set()).update(layers)
        for budget, layers in sorted(by_budget.items()):
            self.log(f"layer statistics for layers {sorted(layers)} ({budget} tokens; cached after the first run)")
            second_moments(self.bundle, sorted(layers), token_budget=budget, progress=self.progress)

    def _edit_group(self, block: Block, g: int, members: list[int], cases: list[Case], pre: dict[str, list],
                    label: str, editor, hp, engine: ScoringEngine,
                    todo: set[tuple[int, int | None]]) -> Iterator[dict[str, Any]]:
        """Edit the group with one method, probe, restore; the rows of the units in ``todo``, each yielded as soon
        as its probe is done (a lifelong chain's checkpoint rows while the chain goes on)."""
        bundle = self.bundle
        assert bundle is not None
        mode = self.config.mode
        torch.manual_seed(derived_seed(self.config.seed, block.label, label, g, "edit"))
        # A chain of patches (sequential modes) is folded into the bundle: one pre-edit copy per edited parameter,
        # not one ΔW per edit, so memory stays flat over long chains; a patch is saved before it is folded.
        chained = mode in ("sequential", "sequential_batches")
        save_to = self.out_dir / "patches" / label if self.config.save_patches else None
        log = _GroupEdits(bundle, chained, save_to, f"{block.label}-g{g:05d}")
        chain = None
        with bundle.folding() if chained else nullcontext():
            try:
                if mode == "sequential_batches":
                    chain = LifelongChain(self, block, g, members, label, editor, hp, engine, todo, log)
                    for probe in chain.rounds(lambda: self._new_state(label, editor)):
                        yield from self._rows(block, g, members, cases, pre, label, editor, hp, todo, log, probe,
                                              checkpoint=True)
                    state = chain.state
                else:
                    state = self._edit_steps(block, members, cases, label, editor, hp, engine, log)
                if label not in self._state_templates:
                    self._state_templates[label] = state.without_edits()
                final_edits = sum(len(block.requests[i]) for i in members)
                final = (len(log.records), final_edits, list(range(len(cases))),
                         *self._probe(block, label, g, cases, engine))
            finally:
                for patch in reversed(log.loose):
                    if patch.applied:
                        patch.revert(bundle)
        _check_reverted(bundle, log.checksums)
        yield from self._rows(block, g, members, cases, pre, label, editor, hp, todo, log, final, checkpoint=False)
        if chain is not None:
            chain.finished()

    def _rows(self, block: Block, g: int, members: list[int], cases: list[Case], pre: dict[str, list], label: str,
              editor, hp, todo: set[tuple[int, int | None]], log: _GroupEdits,
              probe: tuple[int, int, list[int], dict[str, list], float], *, checkpoint: bool) -> list[dict[str, Any]]:
        """The rows in ``todo`` of one probe ``(round, edits applied, positions in members of the cases probed,
        post, s/case)``; ``post[name][j]`` is the probe of the j-th of those positions."""
        rnd, edits, positions, post, eval_seconds = probe
        rows = []
        for j, k in enumerate(positions):
            i, case = members[k], cases[k]
            if (i, edits if checkpoint else None) not in todo:
                continue
            metrics = {name: clean_metrics(s.checked_metrics(case, pre[name][k], post[name][j]))
                       for name, s in block.suites.items()}
            row = {
                "dataset": block.label,
                "case_id": case.case_id,
                "index": i,
                "model": self.bundle.name,  # as run.json's model.name (rows of older runs lack it: that model)
                "method": label,
                "editor": editor.name,
                "method_display": editor.display(self._plugins[label]),
                "plugins": [p.to_dict() for p in self._plugins[label]],
                "mode": self.config.mode_label,
                "group": g,
                "group_size": len(cases),
                "edit_seconds": log.seconds(k),
                "eval_seconds": eval_seconds,
                "edit_info": log.info(k),
                "requests": _requests(block.requests[i]),
                "hparams": hp.to_dict(),  # the editor's resolved hyperparameters (its convention, if it has one)
                "conventions": hp.protocol(),  # the convention switches in force (DESIGN rule 10)
                "runtime": self.runtime.settings(),
                "protocol": self._protocol(block),  # DESIGN rule 10
                "metrics": metrics,
                "pre": {name: pre[name][k] for name in block.suites},
                "post": {name: post[name][j] for name in block.suites},
            }
            if self.config.mode == "sequential_batches":  # what was on the model when this row was probed
                row |= {"checkpoint": checkpoint, "edits_applied": edits, "round": rnd}
            rows.append(row)
        return rows

    def _edit_steps(self, block: Block, members: list[int], cases: list[Case], label: str, editor, hp,
                    engine: ScoringEngine, log: _GroupEdits) -> Any:
        """The edits of one group in modes single, batch and sequential, into ``log``; returns the editor state.
        (``sequential_batches`` is :class:`editscope.run.chain.LifelongChain`.)"""
        bundle = self.bundle
        state = self._new_state(label, editor)
        apply = dict(hparams=hp, state=state, engine=engine, runtime=self.runtime, plugins=self._plugins[label])
        if self.config.mode == "batch":
            requests = [r for i in members for r in block.requests[i]]
            with naming(f"{block.label}: cases {cases[0].case_id}..{cases[-1].case_id}, method {label}"):
                log.take(editor.apply(bundle, requests, **apply), len(cases))
        else:  # single (one case per group) or sequential (state shared through the group)
            for i in members:
                with naming(f"{block.label}: case {block.cases[i].case_id}, method {label}"):
                    log.take(editor.apply(bundle, list(block.requests[i]), **apply), 1)
        return state

    def _probe(self, block: Block, label: str, g: int, cases: list[Case], engine: ScoringEngine,
               *tag: object) -> tuple[dict[str, list], float]:
        """Every suite's probes of ``cases`` on the model as it is now, and the seconds per case."""
        t0 = time.perf_counter()
        torch.manual_seed(derived_seed(self.config.seed, block.label, label, g, "post", *tag))
        report(f"{block.label}, {label}: probing {len(cases)} case(s) after the edits")
        post = {name: probe_cases(s, engine, cases) for name, s in block.suites.items()}
        return post, (time.perf_counter() - t0) / len(cases)


def bar_status(bar, every: float = 0.5) -> Callable[[str], None]:
    """A progress listener that shows the latest news after a tqdm bar, redrawn at most every ``every`` seconds:
    within a group (a batch edit, a lifelong round) the bar itself moves only when its rows are written."""
    last = [-float("inf")]

    def show(message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            bar.set_postfix_str(message, refresh=True)

    return show


def _lm_eval_version() -> str | None:
    from editscope.run.lmeval import lm_eval_version

    return lm_eval_version()


def _requests(requests: Sequence[EditRequest]) -> list[dict[str, str]]:
    return [{"prompt": r.prompt, "subject": r.subject, "target_new": r.target_new, "target_true": r.target_true}
            for r in requests]


def _pre_metrics(suite: Suite, case: Case, pre: dict[str, Any]) -> dict[str, float]:
    """The unedited model's metrics of a case: the ``NAME_pre`` columns of the suite's row with the pre-edit probe
    standing in for the post-edit one (they read only the pre probe; post-only metrics compare the two: left out)."""
    decl = suite.declarations
    return {col: v for col, v in suite.checked_metrics(case, pre, pre).items() if decl.by_column[col].pre == col}


def _json(data: dict[str, Any]) -> str:
    from editscope.finite import strict_dumps

    return strict_dumps(data, RUN_JSON, indent=2, default=str) + "\n"


def run(config: RunConfig, **kwargs: Any) -> RunResult:
    """Run ``config`` (keyword arguments as :class:`Runner`)."""
    return Runner(config, **kwargs).run()


def recompute_metrics(run_dir: str | Path, *, suite_factories: Mapping[str, SuiteFactory] | None = None,
                      ) -> list[tuple[tuple[str, str, str], str, dict[str, float | None], dict[str, float | None]]]:
    """Recompute every metric of a run from the raw probes stored in its results file alone (plus the
    cases named by its config). Returns the rows whose recomputed metrics differ: (key, suite, stored, new). A suite
    whose raw probes in a row were non-finite (stored as null, listed in the row's ``non_finite``) is skipped."""
    run_dir = Path(run_dir)
    meta = read_json(run_dir / RUN_JSON)
    config = RunConfig.from_dict(meta["config"])
    blocks = {b.label: b for b in load_blocks(config, suite_factories=suite_factories)}
    by_id = {label: {c.case_id: c for c in b.cases} for label, b in blocks.items()}
    bad = []
    for row in read_results(run_dir / RESULTS):
        block = blocks[row["dataset"]]
        case = by_id[row["dataset"]][row["case_id"]]
        nulled = row.get(REASONS_KEY) or {}
        for name, suite in block.suites.items():
            if any(path.startswith((f"pre.{name}.", f"post.{name}.")) for path in nulled):
                continue  # a raw probe was non-finite and stored as null (editscope.finite): nothing to recompute
            if row["method"] == NO_EDIT:  # probe_only: pre-edit metrics only
                new = clean_metrics(_pre_metrics(suite, case, row["pre"][name]))
            else:
                new = clean_metrics(suite.checked_metrics(case, row["pre"][name], row["post"][name]))
            if new != row["metrics"][name]:
                bad.append((row_key(row), name, row["metrics"][name], new))
    return bad


def timing_free(row: dict[str, Any]) -> dict[str, Any]:
    """A row without its timing fields (what must be equal between runs of one config)."""
    from editscope.run.store import TIMING_FIELDS

    return {k: v for k, v in row.items() if k not in TIMING_FIELDS and k != "edit_info"} | {
        "edit_info": {k: v for k, v in row.get("edit_info", {}).items() if k != "seconds"}}


__all__ = ["Runner", "RunResult", "load_blocks", "package_versions", "parse_shard", "recompute_metrics", "run",
           "timing_free"]
