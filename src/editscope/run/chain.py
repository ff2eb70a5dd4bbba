"""The edits of one group with one method, in every mode: one loop over the mode's steps (:class:`GroupChain`).

A single or batch group is one step; a ``sequential`` group one step per case, each on the model the previous ones
left; a lifelong chain (``mode: sequential_batches``) one round per batch, with a checkpoint file after every
checkpoint round so that a killed run resumes at its last checkpoint (the mode says which: ``resumable``).

Round t applies one edit of the requests of cases (t-1)·B..t·B-1, the editor's sequential state carried through
the rounds; after each checkpoint round (every k-th round, or the listed rounds; never the last round, whose probe
is the final rows: :meth:`editscope.run.plan.Lifelong.is_checkpoint`) :meth:`GroupChain.rounds`
yields a checkpoint probe: the runner turns it into rows and writes them (flush + fsync) before asking for the
next round, and only then is the chain's state saved to ``chains/<dataset>-g<group>-<method>-<hash>.safetensors``
(:class:`ChainCheckpoint`; temp file + rename, one file per chain, overwritten at each checkpoint, deleted when
the chain's final rows are written). A kill therefore loses at most the rounds since the last checkpoint.

A checkpoint probes the cases edited since the previous checkpoint and re-probes the earlier ones, up to
``reprobe`` of them (1,000 by default); beyond, a fixed random sample of ``reprobe``
(:func:`~editscope.run.plan.reprobe_positions`), the same for every method, so that 10,000 edits in batches of 100
with a checkpoint every round cost 100 probes of at most 1,100 cases rather than half a million. The final rows
(after the last round) cover every case.

The unedited model's probes of a chained group are stored once, when they are taken
(``chains/<dataset>-g<group>-pre-<hash>.json``, :func:`save_pre_probes`; sealed by a digest, keyed by everything they
depend on): a rerun reads them instead of probing again, so every row of a case carries the same pre probe and a
resume does not pay for probing the unedited model again.

On a rerun a chain whose file exists restarts from it: the runner has already read (or computed) the pre-edit probes
on the loaded weights, the folded ΔW of the file is applied (checked: the loaded weights must match the file's
pre-edit checksums, and the restored weights its post-edit checksums, bit for bit), the editor state and the
context templates generated so far are loaded, and the chain continues with the next round. Every round is
seeded by its identity (config seed, dataset, method, group, round), so the rows equal an uninterrupted run's.
A file written under another config digest (which covers the runtime settings) or model is refused; a file
older than the rows already written (rows of a checkpoint after it are missing, e.g. deleted by hand) is ignored
and the chain starts again from its first round. (Under the Ray executor an actor's rows reach the results file
only when its whole group ends, so there a killed chain finds its checkpoint rows missing and starts again.)

Memory stays flat in the number of edits: the bundle folds every round's patch (one pre-edit copy per edited
parameter, :meth:`~editscope.lm.bundle.Bundle.fold`), the state holds what the method needs (AlphaEdit's
K_p K_pᵀ per layer, PRUNE's accumulated ΔW), and per round only the scalars of its rows' ``edit_info`` are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from editscope.atomic import atomic_write, atomic_write_text
from editscope.edit.patch import Patch, exact_index, tensor_checksum, write_exact
from editscope.errors import EditscopeError
from editscope.integrity import seal, verify
from editscope.rowdigest import damage, dumps_sealed

if TYPE_CHECKING:
    from editscope.lm.bundle import Bundle
    from editscope.run.plan import Single
    from editscope.run.trial import Edits, Probes, Trial

FORMAT = "editscope-chain-1"
PRE_FORMAT = "editscope-pre-probes-1"
CHAINS_DIR = "chains"
_DELTA, _INDEX, _VALUES, _STATE = "delta::", "exact_index::", "exact_value::", "state::"


def chain_path(out_dir: str | Path, dataset: str, group: int, method: str) -> Path:
    """The checkpoint file of one chain (a readable stem plus a hash, so any label makes a safe file name)."""
    ident = f"{dataset}\x1f{group}\x1f{method}"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{dataset}-g{group:05d}-{method}")[:80]
    return Path(out_dir) / CHAINS_DIR / f"{stem}-{hashlib.blake2b(ident.encode(), digest_size=4).hexdigest()}" \
        ".safetensors"


def pre_path(out_dir: str | Path, dataset: str, group: int) -> Path:
    """The file of a chained group's pre-edit probes (:func:`save_pre_probes`), beside its chains' checkpoints."""
    return chain_path(out_dir, dataset, group, "pre").with_suffix(".json")


def save_pre_probes(path: Path, key: list[Any], probes: Probes) -> bool:
    """Store the unedited model's probes of a chained group once they are taken, so that a resume reads them instead
    of probing again and every row of a case carries the same pre probe, whatever batches or thread count the resume
    would probe with. ``key`` is everything the probes depend on (:meth:`editscope.run.worker.GroupWorker.pre_key`).
    A probe holding a non-finite value is not stored (False): strict JSON cannot hold it, and the resume probes again
    as before."""
    from editscope.run.store import json_default

    body = {"format": PRE_FORMAT, "key": key, "seconds": probes.seconds, "by_suite": probes.by_suite}
    try:
        text = json.dumps(body, default=json_default, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, dumps_sealed(text) + "\n")
    return True


def load_pre_probes(path: Path, key: list[Any]) -> tuple[Probes | None, str | None]:
    """(the probes :func:`save_pre_probes` stored under ``key``, None) -- (None, None) without a file, (None, why)
    for a file that cannot be used (damaged, or stored under another key): the caller probes again."""
    from editscope.run.trial import Probes

    if not path.is_file():
        return None, None
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"not readable ({exc})"
    if not isinstance(body, dict):
        return None, "not a JSON object"
    if damage(body, required=True) is not None:
        return None, "does not match its digest (altered or corrupted)"
    if body.get("format") != PRE_FORMAT or not isinstance(body.get("by_suite"), dict):
        return None, f"not an editscope pre-probe file (format {body.get('format')!r})"
    if body.get("key") != json.loads(json.dumps(key)):
        return None, "stored for another config, model, group or case set"
    return Probes(body["by_suite"], float(body["seconds"])), None


def cases_digest(case_ids: list[str]) -> str:
    return hashlib.blake2b("\x1f".join(case_ids).encode(), digest_size=8).hexdigest()


@dataclass
class ChainCheckpoint:
    """What continues a chain after round ``round``: the folded ΔW (one tensor per edited parameter, the
    parameter's dtype) with the few entries where ``W₀ + ΔW`` does not round back to the edited value
    (``exact``), checksums of the pre-edit and the edited parameters, the editor state (tensors + JSON), and
    the JSON progress (``meta``: identity, round, edits applied, per-round row fields, context templates)."""

    meta: dict[str, Any]
    deltas: dict[str, torch.Tensor]
    exact: dict[str, tuple[torch.Tensor, torch.Tensor]]
    state_tensors: dict[str, torch.Tensor]
    state_meta: dict[str, Any] = field(default_factory=dict)
    #: False: read from a file without a content digest, accepted with ``--trust-unverified``
    verified: bool = True

    @property
    def round(self) -> int:
        return int(self.meta["round"])

    @property
    def edits_applied(self) -> int:
        return int(self.meta["edits_applied"])

    @classmethod
    def capture(cls, bundle: Bundle, state: Any, meta: dict[str, Any]) -> ChainCheckpoint:
        """The chain as the (folding) bundle and ``state`` hold it now; ``meta`` is the caller's progress record."""
        params = dict(bundle.model.named_parameters())
        deltas, exact, base_sums, edited_sums = {}, {}, {}, {}
        for name, original in sorted(bundle.folded_originals().items()):
            now = params[name].detach()
            delta = (now - original).contiguous()
            index = exact_index(original + delta, now)
            deltas[name] = delta.cpu()
            exact[name] = (index.cpu(), now.reshape(-1)[index].cpu().clone())
            base_sums[name], edited_sums[name] = tensor_checksum(original), tensor_checksum(now)
        tensors, state_meta = state.state_dict()
        meta = dict(meta, base_checksums=base_sums, edited_checksums=edited_sums,
                    state_class=type(state).__name__)
        return cls(meta, deltas, exact, {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, state_meta)

    def save(self, path: str | Path) -> Path:
        """One safetensors file, written atomically (temp file + rename); every tensor's checksum in its metadata, and
        the content digest of the whole file (tensors and metadata: :mod:`editscope.integrity`)."""
        tensors = {_DELTA + n: d for n, d in self.deltas.items()}
        for name, (index, values) in self.exact.items():
            tensors[_INDEX + name], tensors[_VALUES + name] = index, values
        tensors |= {_STATE + k: v for k, v in self.state_tensors.items()}
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        metadata = {"format": FORMAT, "chain": json.dumps(self.meta, sort_keys=True),
                    "state": json.dumps(self.state_meta, sort_keys=True),
                    "checksums": json.dumps({k: tensor_checksum(v) for k, v in tensors.items()}, sort_keys=True)}
        metadata = seal(metadata, tensors)
        return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    @classmethod
    def load(cls, path: str | Path, *, trust_unverified: bool | None = None) -> ChainCheckpoint:
        """Read a file :meth:`save` wrote; a foreign or altered file is a one-line error naming it. The content digest
        (tensors and metadata) is checked before anything is used; a file without one (an earlier editscope's) is
        refused unless unverified files are trusted (``trust_unverified``; None: the command's
        ``--trust-unverified``, :func:`editscope.integrity.trusting`)."""
        path = Path(path)
        restart = "delete it to restart the chain"
        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 -- safe_open has no __iter__
        except Exception as exc:  # safetensors raises its own error types
            raise EditscopeError(f"{path}: not a readable chain checkpoint ({exc}); {restart}") from None
        if meta.get("format") != FORMAT and "chain" not in meta:
            raise EditscopeError(f"{path}: not an editscope chain checkpoint (metadata format={meta.get('format')!r})")
        verified = verify(path, meta, tensors, what="chain checkpoint", hint=restart, trust=trust_unverified)
        if meta.get("format") != FORMAT:
            raise EditscopeError(f"{path}: not an editscope chain checkpoint (metadata format={meta.get('format')!r})")
        try:
            chain, state, sums = (json.loads(meta[k]) for k in ("chain", "state", "checksums"))
        except (KeyError, ValueError) as exc:
            raise EditscopeError(f"{path}: chain checkpoint metadata: {exc}; {restart}") from None
        _check_fields(path, chain, state, sums)
        if set(sums) != set(tensors):
            raise EditscopeError(f"{path}: chain checkpoint: the recorded checksums name other tensors than the file "
                                 f"holds; {restart}")
        for key, tensor in sorted(tensors.items()):
            if tensor_checksum(tensor) != sums[key]:
                raise EditscopeError(f"{path}: tensor {key!r}: content does not match its recorded checksum (the file "
                                     f"was altered or corrupted); {restart}")
        deltas = {k[len(_DELTA):]: v for k, v in tensors.items() if k.startswith(_DELTA)}
        missing = [n for n in deltas if _INDEX + n not in tensors or _VALUES + n not in tensors]
        if missing:
            raise EditscopeError(f"{path}: chain checkpoint: tensor {_INDEX + missing[0]!r} or "
                                 f"{_VALUES + missing[0]!r} is missing; {restart}")
        exact = {n: (tensors[_INDEX + n], tensors[_VALUES + n]) for n in deltas}
        state_tensors = {k[len(_STATE):]: v for k, v in tensors.items() if k.startswith(_STATE)}
        return cls(chain, deltas, exact, state_tensors, state, verified)

    def patch(self, bundle: Bundle) -> Patch:
        """The folded ΔW as a patch on the loaded weights of ``bundle`` (its pre-edit checksums are the file's)."""
        return Patch(deltas=dict(self.deltas), method="chain", hparams={}, fingerprint=bundle.base_fingerprint,
                     checksums=dict(self.meta["base_checksums"]), model_name=bundle.name,
                     info={"round": self.round, "edits_applied": self.edits_applied})

    def restore(self, bundle: Bundle, where: str, digests: list[str] | None = None) -> Patch:
        """Put the chain's weights on a folding bundle holding the loaded weights: apply the folded ΔW (checked
        against the pre-edit checksums), fold it, write the ``exact`` entries, check the edited checksums.
        ``digests``: the chain's patches' digests, so the bundle's fingerprint is the uninterrupted chain's."""
        patch = self.patch(bundle)
        patch.apply(bundle)
        bundle.fold(patch, digests)
        params = dict(bundle.model.named_parameters())
        with torch.no_grad():
            for name, (index, values) in self.exact.items():
                write_exact(params[name], index, values)
        for name, checksum in self.meta["edited_checksums"].items():
            if tensor_checksum(params[name]) != checksum:
                why = "bug: please report" if self.verified else "the file was used unverified"
                raise EditscopeError(f"{where}: parameter {name!r} does not hold the checkpointed value after "
                                     f"restoring ({why}); delete the file to restart the chain")
        return patch


#: the progress fields a resume reads from a checkpoint's ``chain`` metadata, with their JSON types
_CHAIN_FIELDS: dict[str, type | tuple[type, ...]] = {"round": int, "edits_applied": int, "rounds": list,
                                                     "templates": list, "base_checksums": dict,
                                                     "edited_checksums": dict}


def _check_fields(path: Path, chain: Any, state: Any, sums: Any) -> None:
    """The metadata's JSON has the shapes a resume reads (reached only by a file accepted unverified, or one written
    by a bug: a sealed file holds what :meth:`ChainCheckpoint.save` wrote): one line naming the field otherwise."""
    where = f"{path}: chain checkpoint metadata"
    for name, value in (("chain", chain), ("state", state), ("checksums", sums)):
        if not isinstance(value, dict):
            raise EditscopeError(f"{where}: {name!r}: expected an object, got {type(value).__name__}; delete the file "
                                 "to restart the chain")
    for name, kind in _CHAIN_FIELDS.items():
        if name in chain and (not isinstance(chain[name], kind) or isinstance(chain[name], bool)):
            raise EditscopeError(f"{where}: field {name!r}: expected {getattr(kind, '__name__', kind)}, got "
                                 f"{type(chain[name]).__name__}; delete the file to restart the chain")


def templates_to_json(cache: dict) -> list[list[Any]]:
    """A runtime's context-template cache (keys: model name, spec, seed, start) as JSON."""
    return [[name, [list(s) for s in spec], seed, start, list(texts)]
            for (name, spec, seed, start), texts in cache.items()]


def templates_from_json(entries: list[list[Any]]) -> dict:
    return {(name, tuple(tuple(s) for s in spec), seed, start): tuple(texts)
            for name, spec, seed, start, texts in entries}


@dataclass(frozen=True)
class ChainHost:
    """What a chain needs of the run that holds it: where its file goes, the digest that names the run's config and
    runtime, the lm-evaluation-harness hook of the run's ``lm_eval`` key (None: none) and where messages go."""

    out_dir: Path
    config_digest: str
    lm_eval_hook: Any = None
    log: Callable[[str], None] = print


class GroupChain:
    """The steps of one group with one method, in any mode (see the module docstring).

    ``trial`` edits and probes (its seeds); ``mode`` (:mod:`editscope.run.plan`) cuts the group into steps, seeds
    each, says which end with a checkpoint probe and picks its cases, and whether the chain saves and resumes a
    checkpoint file; ``log`` is the group's :class:`~editscope.run.trial.Edits`; ``todo`` the (case index,
    edits_applied) units whose rows are still missing."""

    def __init__(self, trial: Trial, mode: Single, block: Any, g: int, members: list[int], engine: Any,
                 log: Edits, todo: set[tuple[int, int | None]], host: ChainHost) -> None:
        self.trial, self.mode, self.block, self.g, self.members = trial, mode, block, g, members
        self.engine, self.log, self.todo, self.host = engine, log, todo, host
        self.chunks = mode.steps(members)
        #: the chain's checkpoint file (None: the mode saves none)
        self.path = chain_path(host.out_dir, block.label, g, trial.label) if mode.resumable else None
        self.state: Any = None

    @property
    def editor(self) -> Any:
        assert self.trial.method is not None
        return self.trial.method.editor

    def _identity(self) -> dict[str, Any]:
        return {"config_digest": self.host.config_digest, "dataset": self.block.label, "group": self.g,
                "method": self.trial.label, "base_fingerprint": self.log.bundle.base_fingerprint,
                "cases": cases_digest([self.block.cases[i].case_id for i in self.members])}

    def _applied_after(self, r: int) -> int:
        return sum(len(self.block.requests[i]) for chunk in self.chunks[:r] for i in chunk)

    def _resume(self) -> int:
        """Restore the last checkpoint when there is a usable one; the number of rounds it holds (0: none)."""
        if self.path is None or not self.path.is_file():
            return 0
        ckpt = ChainCheckpoint.load(self.path)
        mine = self._identity()
        theirs = {k: ckpt.meta.get(k) for k in mine}
        if theirs != mine:
            what = ", ".join(f"{k} {theirs[k]!r} != {mine[k]!r}" for k in mine if theirs[k] != mine[k])
            raise EditscopeError(f"{self.path}: a chain checkpoint of another config, runtime or model ({what}); "
                                 "use another output directory or delete the file to restart the chain")
        if ckpt.meta.get("state_class") != self.editor.state_class.__name__:
            raise EditscopeError(f"{self.path}: editor state {ckpt.meta.get('state_class')!r}, method "
                                 f"{self.trial.label} carries {self.editor.state_class.__name__}")
        r = ckpt.round
        if any(e is not None and e <= ckpt.edits_applied for _i, e in self.todo):
            self.host.log(f"{self.path.name}: rows of checkpoints up to round {r} are missing; restarting the "
                          "chain from its first round")
            return 0
        bundle = self.log.bundle
        self.state = self.editor.state_class.from_state_dict(
            {k: v.to(bundle.device) for k, v in ckpt.state_tensors.items()}, ckpt.state_meta, str(self.path))
        records = ckpt.meta["rounds"]
        if self.editor.kind == "weights":
            self.log.restored(ckpt.restore(bundle, str(self.path), [rec["digest"] for rec in records]), records)
        else:  # a memory or context edit: the store is the state; put back what it holds
            edit = self.editor.reinstate(bundle, self.trial.method.hp, self.state)
            edit.apply(bundle, check=False)
            self.log.restored(edit, records)
        for key, texts in templates_from_json(ckpt.meta.get("templates", [])).items():
            self.trial.runtime.templates.setdefault(key, texts)  # generated on the loaded weights, as before
        self.host.log(f"resuming chain {self.block.label} group {self.g} method {self.trial.label} after round {r} "
                      f"({ckpt.edits_applied} edits) from {self.path}")
        return r

    def _save(self, r: int, applied: int) -> None:
        meta = self._identity() | {"round": r, "edits_applied": applied, "rounds": self.log.records,
                                   "templates": templates_to_json(self.trial.runtime.templates)}
        assert self.path is not None  # only a resumable mode saves
        ChainCheckpoint.capture(self.log.bundle, self.state, meta).save(self.path)

    def rounds(self, new_state: Callable[[], Any]) -> Iterator[tuple[int, int, list[int], Probes]]:
        """Edit step after step (from the last checkpoint, if any); yield each checkpoint's probe ``(round, edits
        applied, positions in members of the cases probed, probes)`` whose rows are wanted, and save the checkpoint
        file once the caller asks for the next (its rows are written by then)."""
        block, trial, hook = self.block, self.trial, self.host.lm_eval_hook
        done = self._resume() if self.mode.resumable else 0
        if done == 0:
            self.state = new_state()
        applied = self._applied_after(done)
        for r, chunk in enumerate(self.chunks[done:], start=done + 1):
            requests = [req for i in chunk for req in block.requests[i]]
            seeded, round_ = self.mode.edit_seeding(r)
            trial.edit(self.log, requests, self.state, engine=self.engine, group=self.g, n_cases=len(chunk),
                       where=self.mode.step_name(r, [block.cases[i].case_id for i in chunk]), round_=round_,
                       seeded=seeded)
            applied += len(requests)
            if hook is not None:  # lm-eval tasks when this many edits is a chosen checkpoint
                hook.checkpoint(self.log.bundle, dataset=block.label, group=self.g, method=trial.label, round_=r,
                                before=applied - len(requests), applied=applied, last=r == len(self.chunks))
            if not self.mode.is_checkpoint(r, len(self.chunks)):
                continue
            # the checkpoint-evaluation point: every suite probes the cases edited so far on the chained model
            positions = self.mode.probed(self.log.n_cases, len(self.members), trial.reprobe_seed(self.g))
            if any((self.members[k], applied) in self.todo for k in positions):
                cases = [block.cases[self.members[k]] for k in positions]
                yield r, applied, positions, trial.probe(self.engine, cases)
            if self.mode.resumable:
                self._save(r, applied)  # after its rows are written: a kill from here on resumes after round r

    def finished(self) -> None:
        """The chain's final rows are written: its checkpoint file is no longer needed."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def remove_chain_files(out_dir: str | Path) -> None:
    """Delete the checkpoint files of a run whose rows are all written (a kill between a chain's last row and the
    removal of its file leaves one behind, a kill while one was written its temporary file)."""
    folder = Path(out_dir) / CHAINS_DIR
    if folder.is_dir():
        for path in [*folder.glob("*.safetensors"), *folder.glob("*.json"), *folder.glob(".*.tmp")]:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
