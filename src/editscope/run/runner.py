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
every k-th round (k > 0; or the rounds a list names) the cases edited so far are probed (checkpoint rows,
``checkpoint: true``, written as soon as the probe ends), after the last round every case of the group (the rows
summaries use); rows record ``edits_applied`` (requests on the model when it was probed) and ``round``. The rounds
are :class:`editscope.run.chain.GroupChain`, which saves the chain's state after each checkpoint's rows and
resumes a killed chain there. ``probe_only`` (``methods: [none]``): no edit; one row per case with method ``none``
holding only the pre-edit (``NAME_pre``) metrics and ``post: {}``. Pre-edit probes always come from the unedited
model (before the group's first edit), so locality compares against the unedited model's answers in every mode.

Every row names the model that produced it (``model``: run.json's ``model.name``; rows written before the field
existed are the run's model). A config with a ``models`` list is one such run per model
(:mod:`editscope.run.models`); :class:`Runner` runs one model.

Resuming skips finished rows (key: dataset, case, method, plus the checkpoint's ``edits_applied``:
:func:`~editscope.run.store.row_key`); a group with some rows missing is edited again (a lifelong chain from its
last checkpoint file) and only the missing rows are written (edits are seeded per dataset/method/group and round, so
they are the same). Sharding assigns whole groups (group index plus chain index mod n: a block's edit orders and
thread counts spread over the shards), so a sharded run and ``merge`` give the rows of an unsharded run.
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from editscope.atomic import atomic_write_text
from editscope.edit.objective import independent_edits
from editscope.edit.runtime import ENV, EditRuntime
from editscope.errors import EditscopeError
from editscope.finite import REASONS_KEY
from editscope.integrity import unverified
from editscope.lm.loading import Bundle
from editscope.progress import listening
from editscope.rowdigest import FORMAT as ROW_FORMAT
from editscope.rowdigest import RUN_FLAG as ROW_RUN_FLAG
from editscope.run.blocks import Block, load_blocks
from editscope.run.chain import remove_chain_files
from editscope.run.config import NO_EDIT, RunConfig
from editscope.run.lmeval import LmEvalFailed, lm_eval_units
from editscope.run.plan import Unit
from editscope.run.store import (
    MODELS_JSON,
    RESULTS,
    ROW_CONFIG_KEY,
    RUN_JSON,
    ResultsWriter,
    drop_duplicates,
    read_json,
    read_results,
    read_sound_results,
    row_key,
    run_lock,
    unit_key,
    write_results,
)
from editscope.run.suites import SuiteFactory, declarations_to_json
from editscope.run.summary import SummaryRow
from editscope.run.summary_tables import results_text, write_summary
from editscope.run.trial import PreProbeCache, Trial
from editscope.run.worker import GroupWorker, Work

FORMAT = "editscope-run-1"
VERSION_PACKAGES = ("editscope", "torch", "transformers", "numpy")


@dataclass
class RunResult:
    out_dir: Path
    written: int
    skipped: int
    total_rows: int
    summary: list[SummaryRow]
    #: the headline tables as plain text (:func:`~editscope.run.summary_tables.results_text`)
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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


#: one unit the executor runs: (block index, group index, the group's case indices, the units to do per method)
Task = tuple[int, int, list[int], dict[str, set[Unit]]]


class Executor(Protocol):
    """Where a run's tasks are executed: :meth:`run` yields the rows of every task, in task order (the runner
    writes them as they come); :meth:`check` refuses a config it cannot run, before any work."""

    def check(self, config: RunConfig) -> None: ...

    def torch_threads(self) -> int:
        """The torch threads each task runs with (a CPU matmul's rounding depends on it)."""
        ...

    def run(self, runner: Runner, work: Work, tasks: list[Task]) -> Iterator[dict[str, Any]]: ...


class LocalExecutor:
    """Every task in this process, one after another. In ``mode: single`` with runtime ``vstar_batch`` = N > 1, N
    cases at a time form a window of independent edits: the first edit in it optimises the v*/z of all N in one
    batched loop (:func:`editscope.edit.objective.independent_edits`)."""

    def check(self, config: RunConfig) -> None:
        pass

    def torch_threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def run(self, runner: Runner, work: Work, tasks: list[Task]) -> Iterator[dict[str, Any]]:
        size = (runner.config.settings.vstar_batch or 1) if runner.mode.alone else 1
        for s in range(0, len(tasks), size):
            window = [work.blocks[b].requests[i] for b, _, members, _ in tasks[s:s + size] for i in members]
            with independent_edits(runner.runtime, work.engine.fingerprint, window):
                for task in tasks[s:s + size]:
                    yield from runner.group_rows(work, *task)


class Runner:
    """Runs one config into one output directory; see the module docstring.

    ``on_row(row)`` is called after each row is stored (progress hooks; tests raise from it to simulate a
    kill). ``suite_factories`` adds suites by name beside the registry. ``bundle`` reuses a loaded model.
    ``executor`` runs the tasks (default :class:`LocalExecutor`; :class:`editscope.run.ray_executor.RayExecutor`
    spreads whole groups over Ray actors).
    """

    def __init__(self, config: RunConfig, *, out_dir: str | Path | None = None, limit: int | None = None,
                 shard: tuple[int, int] = (0, 1), progress: bool = True, repair: bool = False,
                 on_row: Callable[[dict[str, Any]], None] | None = None,
                 suite_factories: Mapping[str, SuiteFactory] | None = None, bundle: Bundle | None = None,
                 log: Callable[[str], None] | None = None, executor: Executor | None = None,
                 pre_probes: PreProbeCache | None = None) -> None:
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
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        #: executes the groups in this process (an executor hands it the tasks; a Ray actor holds its own)
        self.worker = GroupWorker(config, out_dir=self.out_dir, limit=limit, shard=shard,
                                  suite_factories=self.suite_factories, bundle=bundle, log=self.log,
                                  progress=progress, pre_probes=pre_probes)
        self._row_digests = True  # whether run.json says every row carries a digest (set by _check_existing)
        self._threads: list[int] = []  # the torch thread counts rows were computed with (set by _check_existing)
        self.mode = config.mode
        #: where the tasks run: in this process (:class:`LocalExecutor`), or e.g. on Ray actors
        self.executor = executor or LocalExecutor()
        self.executor.check(config)

    @property
    def bundle(self) -> Bundle | None:
        """The model (loaded by :meth:`GroupWorker.prepare` unless given)."""
        return self.worker.bundle

    @property
    def runtime(self) -> EditRuntime:
        return self.worker.runtime

    def prepare(self) -> Work:
        """What the run needs, loaded and checked before any work (:meth:`GroupWorker.prepare`)."""
        return self.worker.prepare()

    def group_rows(self, work: Work, b: int, g: int, members: list[int], todo: dict[str, set[Unit]]
                   ) -> Iterator[dict[str, Any]]:
        """One task's rows (:meth:`GroupWorker.group_rows`)."""
        return self.worker.group_rows(work, b, g, members, todo)

    def _run_json(self, started: str, status: str, rows: int, finished: str | None = None) -> dict[str, Any]:
        bundle = self.bundle
        assert bundle is not None
        return {
            "format": FORMAT,
            "config": self.config.to_dict(),
            "config_digest": self.config.digest(),
            "runtime": self.config.settings.recorded(),
            "model": {"name": bundle.name, "fingerprint": bundle.fingerprint, "n_layers": bundle.n_layers,
                      "device": bundle.device.type},
            "torch_threads": list(dict.fromkeys([*self._threads, *getattr(self.mode, "threads", ())])),
            "shard": list(self.shard),
            "limit": self.limit,
            "versions": package_versions(),
            "started": started,
            "finished": finished,
            "status": status,
            "rows": rows,
            "argv": sys.argv,
            "metrics": declarations_to_json(self.worker.declared, self.worker.facts),
        } | ({"prompt_format": self.worker.prompt_format} if self.worker.prompt_format else {}) | (
            {"unverified_files": unverified()} if unverified() else {}) | (
            {"lm_eval_version": _lm_eval_version()} if self.config.lm_eval else {}) | (
            {ROW_RUN_FLAG: ROW_FORMAT} if self._row_digests else {})

    def _check_existing(self) -> str | None:
        """The start time of the run already in the output directory (resume), after checking it is ours."""
        path = self.out_dir / RUN_JSON
        if (self.out_dir / MODELS_JSON).is_file():
            raise EditscopeError(f"{self.out_dir} holds a run of a 'models' list; use another output directory")
        self._row_digests = True  # a new run's rows carry digests (editscope.rowdigest)
        self._threads = [self.executor.torch_threads()]
        if not path.is_file():
            if (self.out_dir / RESULTS).is_file():
                raise EditscopeError(f"{self.out_dir}: holds {RESULTS} but no {RUN_JSON}; not resuming into it")
            return None
        meta = read_json(path)
        # a run begun before rows carried digests keeps its run.json without the flag: its rows are read as before
        self._row_digests = ROW_RUN_FLAG in meta
        assert self.bundle is not None
        self._check_runtime(meta.get("runtime") or {})
        if meta.get("config_digest") != self.config.digest():
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
        self._threads = self._resumed_threads(meta)
        return meta.get("started")

    def _resumed_threads(self, meta: dict[str, Any]) -> list[int]:
        """The thread counts of the stored rows plus this session's. Resuming with another count is allowed (a
        machine's cores are not a setting of the experiment) but said: a matmul's last bits change with it, and
        in a long chain such bits can decide where an editor breaks."""
        before, here = list(meta.get("torch_threads") or []), self.executor.torch_threads()
        if here in before:
            return before
        if before and (self.out_dir / RESULTS).is_file():
            self.log(f"note: {self.out_dir} holds rows computed with {'/'.join(map(str, before))} torch thread(s), "
                     f"this session runs {here}: the rows after this point differ in the last bits from an "
                     "uninterrupted run's (run.json records both)")
        return [*before, here]

    def _check_judges(self, rows: list[dict[str, Any]], blocks: Sequence[Block]) -> None:
        """A resume whose wild suite would judge with other judges than the stored rows' is refused, naming the block
        and both judges: the wild suite's default judges changed once (from whole-answer exact match to the judges
        the hand-labelled agreement table ranks first), and a run begun before would otherwise mix two judges."""
        from editscope.suites.wild import recorded_judges

        current = {b.label: {name: recorded_judges(s.protocol) for name, s in b.suites.items()} for b in blocks}
        for row in rows:
            for name, proto in (row.get("protocol") or {}).items():
                stored, now = recorded_judges(proto), current.get(row["dataset"], {}).get(name)
                if stored is not None and now is not None and stored != now:
                    raise EditscopeError(
                        f"{self.out_dir}: block {row['dataset']!r}, suite {name!r}: the stored rows were judged by "
                        f"{stored[0]} / {stored[1]} (answers / neighbours), this run would judge by {now[0]} / "
                        f"{now[1]} (the defaults changed); finish it with the editscope version that began it, or "
                        "run the config into another output directory")

    def _existing_rows(self) -> list[dict[str, Any]]:
        """The rows a resume keeps: a row its digest does not vouch for, or one that records another run's config
        digest (a sound row copied from another run), is cut out of the file and computed again, with one warning
        line naming it (never trusted silently)."""
        rows, damaged = read_sound_results(self.out_dir / RESULTS, repair=True)
        for line in damaged:
            self.log(f"warning: {line}; computing it again")
        own = self.config.digest()
        foreign = [r for r in rows if r.get(ROW_CONFIG_KEY, own) != own]
        if foreign:
            for r in foreign:
                self.log(f"warning: {self.out_dir / RESULTS}: row {'/'.join(row_key(r))} belongs to a run of another "
                         f"config (digest {r[ROW_CONFIG_KEY]}, this run's {own}); computing it again")
            rows = [r for r in rows if r.get(ROW_CONFIG_KEY, own) == own]
            write_results(self.out_dir / RESULTS, rows)
        return rows

    def _check_runtime(self, stored: dict[str, Any]) -> None:
        """A resume under other runtime settings than the stored rows' is refused, naming the setting (rows
        written before run.json recorded them were computed under the defaults)."""
        from editscope.edit.runtime import DEFAULT_SETTINGS

        for key, value in self.config.settings.recorded().items():
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
                dropped, damaged = drop_duplicates(self.out_dir / RESULTS)
                self.log(f"--repair: dropped {dropped} duplicate row(s) of {self.out_dir / RESULTS}")
                for line in damaged:
                    self.log(f"warning: {line}; computing it again")
            return self._run_locked()

    def _run_locked(self) -> RunResult:
        work = self.prepare()
        blocks, bundle = work.blocks, self.bundle
        assert bundle is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        started = self._check_existing() or _now()
        existing = self._existing_rows()
        self._check_judges(existing, blocks)
        done = {row_key(r) for r in existing}
        methods = [m.label for m in self.config.methods]

        def missing(block: Block, g: int, members: list[int], label: str) -> set[Unit]:
            return {(i, e) for i, e in self.worker.units(block, g, members)
                    if unit_key(block.label, block.cases[i].case_id, label, e) not in done}

        pending = sum(len(missing(b, g, members, m)) for b in blocks for g, members in b.groups for m in methods)
        total = sum(len(self.worker.units(b, g, members)) for b in blocks for g, members in b.groups) * len(methods)
        planned = {"planned_rows": total}  # what the report and a models rerun count the rows against
        atomic_write_text(self.out_dir / RUN_JSON, _json(self._run_json(started, "running", len(existing)) | planned))
        if done:
            self.log(f"resuming {self.out_dir}: {total - pending} of {total} rows done")
        if pending:
            self.worker.warm_stats(work.methods.values())
        if self.config.lm_eval is not None:  # lm-evaluation-harness at chain checkpoints (editscope.run.lmeval)
            from editscope.run.lmeval import LmEvalHook

            every, batch = self.mode.chain_schedule or (0, 0)
            self.worker.lm_eval_hook = LmEvalHook(self.config.lm_eval, self.out_dir, every=every,
                                                  batch=batch, chat_template=self.config.chat_template,
                                                  log=self.log)
            self.worker.lm_eval_hook.baseline(bundle)
        written, status, failure = 0, "interrupted", {}
        own = self.config.digest()
        from tqdm import tqdm

        bar = tqdm(total=pending, desc="edit+evaluate", unit="row", disable=not self.progress, dynamic_ncols=True)
        try:
            with ResultsWriter(self.out_dir / RESULTS) as writer:
                tasks = [(b, g, members, todo) for b, block in enumerate(blocks) for g, members in block.groups
                         if any((todo := {m: missing(block, g, members, m) | lm_eval_units(
                             self.worker.lm_eval_hook, block, g, members, m) for m in methods}).values())]
                # closing(): on an error here the edit generators restore the weights now, not when the
                # traceback holding their frames is collected
                with closing(self.executor.run(self, work, tasks)) as produced, \
                        listening(bar_status(bar) if self.progress else None):
                    for row in produced:
                        row = {**row, ROW_CONFIG_KEY: own}  # what the row belongs to, checked on every read
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
            summary = write_summary(self.out_dir, rows, specs=self.worker.declared, facts=self.worker.facts,
                                    method_order=methods, dataset_order=self.config.block_labels())
            atomic_write_text(self.out_dir / RUN_JSON, _json(self._run_json(started, status, len(rows), _now())
                                                             | planned | failure))
        return RunResult(self.out_dir, written, total - pending, len(rows), summary,
                         results_text(summary, self.worker.declared))

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


def _json(data: dict[str, Any]) -> str:
    from editscope.run.store import dumps_run_json

    return dumps_run_json(data)


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
    config = RunConfig.from_run_json(meta.get("config"), run_dir / RUN_JSON)
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
            trial = Trial(block.label, {name: suite}, None, None)
            # probe_only: pre-edit metrics only
            new = trial.metrics(case, row["pre"], None if row["method"] == NO_EDIT else row["post"])[name]
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
