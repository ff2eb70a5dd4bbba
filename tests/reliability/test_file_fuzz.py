"""Every file editscope reads back, mutated: the reader (resume, apply, import, tune rerun, report) ends in the
correct result or one clean line.

Per file type a genuine file is written by editscope itself (tiny-llama), then a seeded sample of mutations is applied
to a fresh copy — byte flips in tensor data and in metadata/header bytes, truncation, deleted keys, torn last lines,
wrong JSON types — and the code that reads the file back is run on it:

* ``clean``: an :class:`EditscopeError` whose message is one line naming the file (never "bug: please report");
* ``correct``: no error, and what the reader produced equals what it produces on the unaltered file (the loaded chain,
  patch, statistics, tune state or archived rows are the originals bit for bit; a resumed run's rows equal the
  reference rows; every lm_eval row taken as done is an original row, the others are evaluated again);
* ``traceback``: any other exception (a raw traceback on the command line), or an error message that is not one
  clean line;
* ``silently wrong``: no error, and a result that differs.

The counts per file type are printed (``pytest -s`` shows them); the test asserts 0 tracebacks and 0 silently wrong.
Rows (``results.jsonl``, ``lm_eval.jsonl``) carry a digest each (:mod:`editscope.rowdigest`), so their mutations also
change a digit or letter inside a value, delete any key and alter a nested value: a resume recomputes the row.

Beside the files, three readers of odd input: an UltraEdit chain checkpoint (its lifelong normaliser's running mean
and squared deviations, and their metadata, flipped: the loaded state must be the saved one bit for bit, or refused),
the ``wild`` suite's options and a registered answer judge that raises (one line naming the option, or the judge and
the case, with the rows written before it kept), ``editscope plan`` on a mutated ``config.json`` (one line naming
the file, or the plan of the config as transformers completes it), and a finished run's ``run.json`` read by the
card's replay and by the report (a sealed record: an edited field is refused, never replayed).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from editscope.errors import EditscopeError

SEED = int(os.environ.get("EDITSCOPE_FUZZ_SEED", "20261127"))
PER_TYPE = int(os.environ.get("EDITSCOPE_FUZZ_N", "24"))  # mutations sampled per file type
BUDGET, SEQ, LAYER = 256, 32, 1


# -- mutations ------------------------------------------------------------------------------------------------------
def _st_split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _st_join(header: dict, body: bytes) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _flip(data: bytes, lo: int, hi: int, rng: random.Random) -> bytes:
    if hi <= lo:
        return data
    i = rng.randrange(lo, hi)
    out = bytearray(data)
    out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _wrong_type(value: Any, rng: random.Random) -> Any:
    """A value of another JSON type (never null: null is a legitimate value of some fields, so turning one into null
    is a change of value, not of type)."""
    if isinstance(value, bool):
        return rng.choice(["yes", 1])
    if isinstance(value, (int, float)):
        return rng.choice([str(value), [value], {"v": value}])
    if isinstance(value, str):
        return rng.choice([1, [value], {"v": value}])
    if isinstance(value, list):
        return rng.choice([{"0": value}, "[]", 0])
    if isinstance(value, dict):
        return rng.choice([list(value), "{}", 0])
    return rng.choice(["null", [None]])  # null


def _altered(value: Any, rng: random.Random) -> Any:
    """A value of the same type, changed (what a byte flip inside a value does)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1])
    if isinstance(value, float):
        return value * 1.5 + 1.0
    if isinstance(value, str):
        return value[:-1] + ("x" if not value.endswith("x") else "y")
    if isinstance(value, list):
        return value[:-1] if value else [0]
    if isinstance(value, dict):
        return dict(list(value.items())[:-1]) if value else {"x": 0}
    return 1


def _nested_edit(obj: Any, rng: random.Random, delete: bool, alter: bool = False) -> Any:
    """``obj`` with one randomly chosen key (at any depth) deleted, given a wrong-typed value, or (``alter``) a value
    of the same type changed."""
    paths: list[tuple] = []

    def walk(node: Any, path: tuple) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + (k,))
                walk(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node[:3]):
                walk(v, path + (i,))

    walk(obj, ())
    if not paths:
        return _altered(obj, rng) if alter else _wrong_type(obj, rng)
    target = rng.choice(paths)
    obj = json.loads(json.dumps(obj))
    node = obj
    for k in target[:-1]:
        node = node[k]
    if delete:
        del node[target[-1]]
    else:
        node[target[-1]] = (_altered if alter else _wrong_type)(node[target[-1]], rng)
    return obj


def safetensors_mutations(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    header, body = _st_split(data)
    n = 8 + struct.unpack("<Q", data[:8])[0]
    meta = header.get("__metadata__", {})
    out = []
    for _ in range(PER_TYPE):
        kind = rng.choice(["flip tensor byte", "flip header byte", "truncate", "delete metadata key",
                           "wrong type in metadata", "altered value in metadata", "delete tensor"])
        if kind == "flip tensor byte":
            out.append((kind, _flip(data, n, len(data), rng)))
        elif kind == "flip header byte":
            out.append((kind, _flip(data, 0, n, rng)))
        elif kind == "truncate":
            out.append((kind, data[:rng.randrange(0, len(data))]))
        elif kind == "delete metadata key" and meta:
            h = json.loads(json.dumps(header))
            del h["__metadata__"][rng.choice(sorted(meta))]
            out.append((kind, _st_join(h, body)))
        elif kind in ("wrong type in metadata", "altered value in metadata") and meta:
            h = json.loads(json.dumps(header))
            key = rng.choice(sorted(meta))
            try:
                value = json.loads(meta[key])
                h["__metadata__"][key] = json.dumps(_nested_edit(value, rng, delete=rng.random() < 0.3,
                                                                 alter=kind.startswith("altered")))
            except ValueError:
                h["__metadata__"][key] = meta[key][:-1]
            out.append((kind, _st_join(h, body)))
        else:
            h = json.loads(json.dumps(header))
            names = [k for k in h if k != "__metadata__"]
            del h[rng.choice(names)]
            out.append(("delete tensor", _st_join(h, body)))
    return out


def json_mutations(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    obj = json.loads(data)
    out = []
    for _ in range(PER_TYPE):
        kind = rng.choice(["flip byte", "truncate", "delete key", "wrong type", "altered value"])
        if kind == "flip byte":
            out.append((kind, _flip(data, 0, len(data), rng)))
        elif kind == "truncate":
            out.append((kind, data[:rng.randrange(0, len(data))]))
        else:
            edited = _nested_edit(obj, rng, delete=kind == "delete key", alter=kind == "altered value")
            out.append((kind, json.dumps(edited, indent=1).encode()))
    return out


_STRUCTURE = set(b'{}[]":,')
_DIGITS, _LOWER, _UPPER = b"0123456789", b"abcdefghijklmnopqrstuvwxyz", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _change_char(data: bytes, rng: random.Random) -> bytes:
    """One digit or letter replaced by another of its kind: what a flipped bit inside a stored value looks like when it
    leaves valid JSON of the same type (a number stays a number, a word a word)."""
    spots = [j for j, b in enumerate(data) if b in _DIGITS or b in _LOWER or b in _UPPER]
    j = rng.choice(spots)
    alphabet = next(a for a in (_DIGITS, _LOWER, _UPPER) if data[j] in a)
    new = rng.choice([b for b in alphabet if b != data[j]])
    return data[:j] + bytes([new]) + data[j + 1:]


def jsonl_mutations(data: bytes, rng: random.Random, required: list[str] | None = None) -> list[tuple[str, bytes]]:
    """``required``: the fields every row has (default: a results row's)."""
    lines = data.decode().splitlines(keepends=True)
    out = []
    for _ in range(PER_TYPE):
        kind = rng.choice(["flip structure byte", "truncate", "torn last line", "delete key", "wrong type",
                           "delete line", "change digit or letter", "change digit or letter", "altered value"])
        i = rng.randrange(len(lines))
        if kind == "change digit or letter":
            out.append((kind, _change_char(data, rng)))
        elif kind == "altered value":  # a nested value of the same type changed, the row's digest kept
            row = _nested_edit(json.loads(lines[i]), rng, delete=False, alter=True)
            out.append((kind, "".join(lines[:i] + [json.dumps(row) + "\n"] + lines[i + 1:]).encode()))
        elif kind == "flip structure byte":
            spots = [j for j, b in enumerate(data) if b in _STRUCTURE]
            j = rng.choice(spots)
            out.append((kind, data[:j] + bytes([data[j] ^ 1 << rng.randrange(8)]) + data[j + 1:]))
        elif kind == "truncate":
            out.append((kind, data[:rng.randrange(0, len(data))]))
        elif kind == "torn last line":
            last = lines[-1].encode()
            out.append((kind, "".join(lines[:-1]).encode() + last[:rng.randrange(1, len(last) - 1)]))
        elif kind == "delete line":
            out.append((kind, "".join(lines[:i] + lines[i + 1:]).encode()))
        else:
            row = json.loads(lines[i])
            # any field: the row's digest covers them all (deleting the digest itself is damage in a run whose
            # run.json says its rows carry one); ``required`` narrows deletions for a file without run.json
            top = rng.choice(sorted(required) if kind == "delete key" and required else sorted(row))
            if kind == "delete key":
                row.pop(top)
            else:
                row[top] = _wrong_type(row[top], rng)
            kind += f" {top!r}"
            out.append((kind, "".join(lines[:i] + [json.dumps(row) + "\n"] + lines[i + 1:]).encode()))
    return out


# -- the tally ------------------------------------------------------------------------------------------------------
@dataclass
class Tally:
    tried: int = 0
    clean: int = 0
    correct: int = 0
    traceback: int = 0
    wrong: int = 0
    bad: list[str] = field(default_factory=list)

    def run(self, what: str, read: Callable[[], Any], is_correct: Callable[[Any], bool],
            names: tuple[str, ...] = ()) -> None:
        """One mutated file read back; ``names``: what a clean message names (the file, or its folder)."""
        self.tried += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the statistics cache says "recomputing" as a warning
                result = read()
        except EditscopeError as exc:
            msg = str(exc)
            if "\n" in msg or "bug: please report" in msg or not msg or (names and not any(n in msg for n in names)):
                self.traceback += 1
                self.bad.append(f"{what}: unclean message {msg!r}")
            else:
                self.clean += 1
            return
        except Exception as exc:  # noqa: BLE001 (what the fuzz is looking for)
            self.traceback += 1
            import traceback

            frame = traceback.extract_tb(exc.__traceback__)[-1]
            self.bad.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]} (at {frame.filename}:{frame.lineno})")
            return
        if is_correct(result):
            self.correct += 1
        else:
            self.wrong += 1
            self.bad.append(f"{what}: silently wrong")


def _equal_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(x.dtype == b[k].dtype and x.shape == b[k].shape and
                                        torch.equal(x.view(torch.uint8) if x.numel() else x,
                                                    b[k].view(torch.uint8) if x.numel() else b[k])
                                        for k, x in a.items())


def _mutate_file(path: Path, mutations: list[tuple[str, bytes]], pristine: bytes, tally: Tally,
                 read: Callable[[], Any], is_correct: Callable[[Any], bool], restore: Callable[[], None] | None = None,
                 ) -> None:
    for kind, data in mutations:
        if data == pristine:
            continue
        path.write_bytes(data)
        tally.run(f"{path.name} ({kind})", read, is_correct, (str(path), str(path.parent)))
        if restore is not None:
            restore()
    path.write_bytes(pristine)


# -- the file types -------------------------------------------------------------------------------------------------
def fuzz_chain(bundle, tmp: Path, rng: random.Random) -> Tally:
    from editscope.edit.patch import Patch, tensor_checksum
    from editscope.run.chain import ChainCheckpoint

    class State:  # a state with tensors and JSON, as AlphaEdit's / UltraEdit's carry
        def __init__(self) -> None:
            self.k = torch.arange(12.0).reshape(3, 4)

        def state_dict(self):
            return {"kpk.1": self.k}, {"layers": [1], "edits": 3}

    params = dict(bundle.model.named_parameters())
    name = bundle.arch.weight_name(1)
    gen = torch.Generator().manual_seed(0)
    with bundle.folding():
        patch = Patch({name: 1e-3 * torch.randn(params[name].shape, generator=gen)}, "rome", {}, bundle.fingerprint,
                      {name: tensor_checksum(params[name])}, bundle.name)
        patch.apply(bundle)
        bundle.fold(patch)
        meta = {"round": 2, "edits_applied": 8, "rounds": [{"digest": "d1"}, {"digest": "d2"}],
                "templates": [["tiny", [[5, 3]], 0, 0, ["The {}.", "A {}."]]], "config_digest": "c"}
        ckpt = ChainCheckpoint.capture(bundle, State(), meta)
    path = ckpt.save(tmp / "chain.safetensors")
    pristine = path.read_bytes()
    tally = Tally()

    def same(got: ChainCheckpoint) -> bool:
        return (got.meta == ckpt.meta and got.state_meta == ckpt.state_meta and _equal_tensors(got.deltas, ckpt.deltas)
                and _equal_tensors(got.state_tensors, ckpt.state_tensors)
                and all(_equal_tensors(dict(zip("iv", got.exact[n], strict=True)),
                                       dict(zip("iv", ckpt.exact[n], strict=True))) for n in ckpt.exact)
                and got.exact.keys() == ckpt.exact.keys())

    _mutate_file(path, safetensors_mutations(pristine, rng), pristine, tally, lambda: ChainCheckpoint.load(path), same)
    return tally


def fuzz_patch(bundle, tmp: Path, rng: random.Random) -> Tally:
    from editscope.edit.patch import Patch, tensor_checksum

    params = dict(bundle.model.named_parameters())
    names = [bundle.arch.weight_name(1), bundle.arch.weight_name(2)]
    gen = torch.Generator().manual_seed(1)
    patch = Patch({n: 1e-3 * torch.randn(params[n].shape, generator=gen) for n in names}, "rome", {"layers": [1, 2]},
                  bundle.fingerprint, {n: tensor_checksum(params[n]) for n in names}, bundle.name,
                  requests=[{"prompt": "{} is in", "subject": "Paris", "target_new": "Rome"}], info={"loss": 0.5},
                  bases={n: params[n].detach().clone() for n in names})
    path = patch.save(tmp / "patch.safetensors")
    pristine = path.read_bytes()
    tally = Tally()

    def same(got: Patch) -> bool:
        return (got.metadata() == patch.metadata() and _equal_tensors(got.deltas, patch.deltas)
                and _equal_tensors(got.bases or {}, patch.bases or {}))

    _mutate_file(path, safetensors_mutations(pristine, rng), pristine, tally, lambda: Patch.load(path), same)
    return tally


def fuzz_stats(bundle, tmp: Path, rng: random.Random) -> tuple[Tally, Tally]:
    """The statistics cache (read by every edit: recomputed when damaged) and an export file (``stats import``)."""
    from safetensors import safe_open

    from editscope.stats.artefact import export_stats, import_stats
    from editscope.stats.second_moment import second_moment

    fresh = second_moment(bundle, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False)
    path = next((tmp / "home" / "stats").rglob(f"layer{LAYER}.safetensors"))
    pristine = path.read_bytes()
    cache = Tally()

    def read_cache() -> torch.Tensor:
        return second_moment(bundle, LAYER, token_budget=BUDGET, seq_len=SEQ, progress=False)

    _mutate_file(path, safetensors_mutations(pristine, rng), pristine, cache, read_cache,
                 lambda got: torch.equal(got, fresh), restore=lambda: path.write_bytes(pristine))

    export = tmp / "export.safetensors"
    export_stats(bundle.fingerprint, export)
    exported = export.read_bytes()
    imported = Tally()

    def layer_file(p: Path) -> tuple:
        with safe_open(str(p), framework="pt") as fh:
            return fh.get_tensor("mom2"), int(fh.get_tensor("count")[0])

    want = layer_file(path)

    def same(written: list[Path]) -> bool:
        got = [layer_file(p) for p in written]
        return len(got) == 1 and torch.equal(got[0][0], want[0]) and got[0][1] == want[1]

    _mutate_file(export, safetensors_mutations(exported, rng), exported, imported, lambda: import_stats(bundle, export),
                 same, restore=lambda: path.write_bytes(pristine))
    return cache, imported


def fuzz_tune(bundle, tmp: Path, rng: random.Random) -> Tally:
    """``tune.json`` (the settings a rerun must match) and ``state.json`` (budget spent, rungs) on a rerun."""
    from editscope.tune import Tuner, TuneSettings
    from editscope.tune.space import candidates

    out = tmp / "tune"
    out.mkdir()
    tuner = Tuner(TuneSettings(model="tiny-llama", method="rome", out=str(out)), bundle=bundle, progress=False,
                  log=lambda _m: None)
    grids = {"v_lr": (0.1, 0.5)}
    cands = candidates(grids)
    slice_ = {"dataset": "counterfact", "offset": 0, "limit": 4}
    tuner._check_settings(grids, cands, slice_)
    tuner.reference = {}
    tuner._save_state(out / "state.json", 12.5, None)
    tally = Tally()
    settings = (out / "tune.json").read_bytes()
    state = (out / "state.json").read_bytes()
    want_state = tuner._state(out / "state.json")

    def rerun_settings() -> bytes:
        tuner._check_settings(grids, cands, slice_)
        return (out / "tune.json").read_bytes()

    _mutate_file(out / "tune.json", json_mutations(settings, rng), settings, tally, rerun_settings,
                 lambda got: got == settings)
    _mutate_file(out / "state.json", json_mutations(state, rng), state, tally, lambda: tuner._state(out / "state.json"),
                 lambda got: got == want_state)
    return tally


def fuzz_archive(run_dir: Path, tmp: Path, rng: random.Random) -> Tally:
    """A reproduction archive (run.json + slim rows + digest.json), read as ``report --reproduction`` reads it."""
    from editscope.integrity import FOLDER_MANIFEST
    from editscope.run.archive import archive_run
    from editscope.run.store import ARCHIVE, RUN_JSON, read_json, run_rows

    dest = tmp / "archive" / "run"
    archive_run(run_dir, dest)
    want = (run_rows(dest), read_json(dest / RUN_JSON))
    tally = Tally()

    def read() -> tuple:
        return run_rows(dest), read_json(dest / RUN_JSON)

    for name, mutate in ((ARCHIVE, None), (RUN_JSON, json_mutations), (FOLDER_MANIFEST, json_mutations)):
        path = dest / name
        pristine = path.read_bytes()
        if mutate is None:  # the gzip file: byte flips anywhere, truncation, and a re-compressed torn last line
            import gzip

            text = gzip.decompress(pristine)
            mutations = [("flip byte", _flip(pristine, 0, len(pristine), rng)) for _ in range(4)]
            mutations += [("truncate", pristine[:rng.randrange(len(pristine))]) for _ in range(3)]
            mutations += [(k, gzip.compress(m, mtime=0)) for k, m in jsonl_mutations(text, rng)[:5]]
        else:
            mutations = mutate(pristine, rng)[:7]
        _mutate_file(path, mutations, pristine, tally, read, lambda got: got == want)
    path = dest / FOLDER_MANIFEST  # deletion of the whole manifest: an unsealed (earlier) archive
    pristine = path.read_bytes()
    path.unlink()
    tally.run("digest.json (deleted)", read, lambda got: got == want, (str(dest),))
    path.write_bytes(pristine)
    return tally


def fuzz_run(bundle, tmp: Path, rng: random.Random) -> tuple[Tally, Tally]:
    """``run.json`` and ``results.jsonl`` of a finished run, read by a resume (which recomputes what is missing)."""
    from editscope.paths import data_file
    from editscope.run import Runner, parse_config, read_results
    from editscope.run.runner import timing_free
    from editscope.run.store import RESULTS, RUN_JSON, row_key

    records = json.loads(data_file("counterfact/counterfact-edit-1k.json").read_text())[:3]
    (tmp / "data.json").write_text(json.dumps(records))
    reference = tmp / "reference"
    config = parse_config({"model": "tiny-llama", "output": str(reference), "methods": ["none"],
                           "dataset": str(tmp / "data.json"), "suites": ["counterfact"]})

    def run(out: Path) -> None:
        Runner(config, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None).run()

    run(reference)
    want = sorted((timing_free(r) for r in read_results(reference / RESULTS)), key=row_key)
    work = tmp / "work"

    def resume() -> list[dict]:
        run(work)
        meta = json.loads((work / RUN_JSON).read_text())
        assert meta["status"] == "complete" and meta["rows"] == len(want)
        return sorted((timing_free(r) for r in read_results(work / RESULTS)), key=row_key)

    def fresh() -> None:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(reference, work)

    tallies = []
    for name, mutate in ((RUN_JSON, json_mutations), (RESULTS, jsonl_mutations)):
        tally = Tally()
        pristine = (reference / name).read_bytes()
        for kind, data in mutate(pristine, rng):
            if data == pristine:
                continue
            fresh()
            (work / name).write_bytes(data)
            tally.run(f"{name} ({kind})", resume, lambda got: got == want, (str(work / name), str(work)))
        tallies.append(tally)
    return tallies[0], tallies[1]


def fuzz_lm_eval(tmp: Path, rng: random.Random) -> Tally:
    """``lm_eval.jsonl``, read by a resume's lm_eval hook: which task rows are done (the others are evaluated again).
    Correct: every row taken as done is the original row of its key (a damaged one is evaluated again or refused)."""
    from editscope.jsonl import append_record
    from editscope.rowdigest import KEY
    from editscope.run.lmeval import LM_EVAL_FILE, LmEvalHook, LmEvalSpec

    folder = tmp / "lm"
    spec = LmEvalSpec(tasks=("arc_tiny", "copa_tiny"), limit=8)
    rows = []
    for dataset, group, method, rnd, applied in ((None, None, "none", 0, 0), ("counterfact", 0, "rome", 1, 2),
                                                 ("counterfact", 0, "rome", 2, 4)):
        for task in spec.tasks:
            rows.append({"dataset": dataset, "group": group, "method": method, "round": rnd, "edits_applied": applied,
                         "task": task, "metrics": {"acc": 0.25 + applied / 16, "acc_stderr": None}, "n_samples": 8,
                         "limit": 8, "num_fewshot": None, "chat_template": False, "seconds": 0.5,
                         "lm_eval_version": "0.4.9"})
    writer = LmEvalHook(spec, folder, every=1, batch=2, log=lambda _m: None)
    for row in rows:
        append_record(folder / LM_EVAL_FILE, row, writer._dumps)  # sealed with its digest, as the hook writes rows
    by_key = {LmEvalHook._key(r): r for r in rows}
    pristine = (folder / LM_EVAL_FILE).read_bytes()
    tally = Tally()

    def read() -> list[dict]:
        from editscope.jsonl import read_records

        hook = LmEvalHook(spec, folder, every=1, batch=2, log=lambda _m: None)
        present = {}
        for r in read_records(folder / LM_EVAL_FILE):
            with contextlib.suppress(TypeError):  # a mutated key field of a list or object type is no key
                present[LmEvalHook._key(r)] = {k: v for k, v in r.items() if k != KEY}
        return [present.get(k) for k in hook._done]

    def same(done: list[dict | None]) -> bool:  # of the keys a resume asks for, those taken as done are the originals
        return all(r is not None and by_key[LmEvalHook._key(r)] == r for r in done
                   if r is not None and LmEvalHook._key(r) in by_key)

    _mutate_file(folder / LM_EVAL_FILE, jsonl_mutations(pristine, rng), pristine, tally, read, same)
    return tally


def state_mutations(data: bytes, rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    """Mutations aimed at a chain checkpoint's editor state: byte flips inside its tensors, and its ``state``
    metadata (JSON) with a value altered, given a wrong type or a key deleted."""
    from editscope.run.chain import _STATE

    header, body = _st_split(data)
    start = 8 + struct.unpack("<Q", data[:8])[0]
    names = sorted(k for k in header if k.startswith(_STATE))
    state = json.loads(header["__metadata__"]["state"])
    out = []
    for _ in range(n):
        kind = rng.choice(["flip state tensor byte", "flip state tensor byte", "altered state metadata",
                           "wrong type in state metadata", "delete state metadata key"])
        if kind == "flip state tensor byte":
            name = rng.choice(names)
            lo, hi = header[name]["data_offsets"]
            out.append((f"{kind} ({name})", _flip(data, start + lo, start + hi, rng)))
            continue
        h = json.loads(json.dumps(header))
        edited = _nested_edit(state, rng, delete=kind.startswith("delete"), alter=kind.startswith("altered"))
        h["__metadata__"]["state"] = json.dumps(edited, sort_keys=True)
        out.append((kind, _st_join(h, body)))
    return out


def fuzz_ultraedit_chain(bundle, tmp: Path, rng: random.Random) -> Tally:
    """The chain file of an UltraEdit chain after one real turn: its state is the lifelong normaliser (per module
    shape the running mean, the sum of squared deviations, the row count) that every later turn normalises with."""
    from editscope.data.records import EditRequest
    from editscope.edit import get_editor
    from editscope.edit.ultraedit import UltraEditState
    from editscope.lm.engine import ScoringEngine
    from editscope.run.chain import ChainCheckpoint

    editor = get_editor("ultraedit")
    requests = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
                EditRequest("The capital of {} is", "France", "Madrid", "Paris")]
    state = editor.new_state()
    with bundle.folding():
        patch = editor.apply(bundle, requests, state=state, engine=ScoringEngine(bundle))
        bundle.fold(patch)
        ckpt = ChainCheckpoint.capture(bundle, state, {"round": 1, "edits_applied": 2, "rounds": [{"digest": "d1"}],
                                                       "templates": [], "config_digest": "c"})
    assert state.counts and state.n_turns == 1  # a real normaliser: statistics of this turn's features
    path = ckpt.save(tmp / "ultraedit-chain.safetensors")
    pristine = path.read_bytes()
    tally = Tally()

    def read() -> tuple[ChainCheckpoint, UltraEditState]:  # what a resume does before the next turn
        got = ChainCheckpoint.load(path)
        return got, UltraEditState.from_state_dict(got.state_tensors, got.state_meta, str(path))

    def same(got: tuple[ChainCheckpoint, UltraEditState]) -> bool:
        loaded, s = got
        return (s.counts == state.counts and (s.n_edits, s.n_turns) == (state.n_edits, state.n_turns)
                and _equal_tensors(s.means, state.means) and _equal_tensors(s.sq_devs, state.sq_devs)
                and _equal_tensors(loaded.deltas, ckpt.deltas) and loaded.meta == ckpt.meta)

    mutations = state_mutations(pristine, rng, PER_TYPE // 2) + safetensors_mutations(pristine, rng)[:PER_TYPE // 2]
    _mutate_file(path, mutations, pristine, tally, read, same)
    return tally


#: wild suite options no run may start with: (option, value)
_BAD_WILD = [("max_new_tokens", 0), ("max_new_tokens", -5), ("max_new_tokens", 10 ** 9), ("max_new_tokens", "50"),
             ("max_new_tokens", 2.5), ("max_new_tokens", True), ("max_new_tokens", None), ("context", "chat"),
             ("context", 3), ("target", "answers1"), ("target", None), ("judge", "gpt4"), ("judge", 7),
             ("stop", "."), ("stop", [""])]


class _RaisingJudge:
    """A registered judge that fails on the answers to one subject's prompts (as a user's judge model might)."""

    name, binary = "fuzz_raises", False

    def __init__(self, subject: str) -> None:
        self.subject = subject

    def __call__(self, question: str, prediction: str, golds) -> float:
        if self.subject in question:
            raise RuntimeError("judge backend unreachable\n(a second line that must not reach the message)")
        return 0.0


def fuzz_wild(bundle, tmp: Path, rng: random.Random) -> Tally:
    """The wild suite's generation settings: bad options refused in one line naming the option; a judge that raises
    stops the run with one line naming the judge and the case, the rows written before it kept."""
    from editscope.metrics.answers import JUDGES
    from editscope.paths import data_file
    from editscope.run import Runner, parse_config, read_results
    from editscope.run.plan import PROBE_GROUP
    from editscope.run.store import RESULTS
    from editscope.run.suites import make_suite

    tally = Tally()
    for key, value in rng.sample(_BAD_WILD, min(len(_BAD_WILD), PER_TYPE)):
        tally.run(f"wild option {key}={value!r}", lambda k=key, v=value: make_suite("wild", {k: v}),
                  lambda _suite: False, (key,))
    # probe_only measures 16 cases per unit of work (PROBE_GROUP): the judge fails on the 17th, in the second unit
    records = json.loads(data_file("counterfact/counterfact-edit-1k.json").read_text())[:PROBE_GROUP + 1]
    (tmp / "wild.json").write_text(json.dumps(records))
    failing = records[PROBE_GROUP]
    assert not any(failing["subject"] in json.dumps(r) for r in records[:PROBE_GROUP])
    JUDGES.register(_RaisingJudge(failing["subject"]))
    out = tmp / "wild-run"
    config = parse_config({"model": "tiny-llama", "output": str(out), "methods": ["none"],
                           "dataset": str(tmp / "wild.json"),
                           "suites": [{"name": "wild", "options": {"judge": "fuzz_raises", "max_new_tokens": 3}}]})

    def run() -> None:
        try:
            Runner(config, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None).run()
        except EditscopeError as exc:
            kept = sorted(r["case_id"] for r in read_results(out / RESULTS))
            if (f"case {failing['case_id']}" not in str(exc)
                    or kept != sorted(str(r["case_id"]) for r in records[:PROBE_GROUP])):
                raise AssertionError(f"the message does not name the case, or rows were lost: {exc}; "
                                     f"kept {kept}") from None
            raise

    try:
        tally.run("wild judge that raises", run, lambda _r: False, ("fuzz_raises",))
    finally:
        del JUDGES["fuzz_raises"]
    return tally


def config_mutations(data: bytes, rng: random.Random) -> list[tuple[str, bytes]]:
    """A model's config.json made odd: a size key deleted, zero, negative, a string or a float; an unknown
    model_type; an empty file; text that is not JSON; JSON that is not an object; plus :func:`json_mutations`."""
    obj = json.loads(data)
    sizes = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "vocab_size"]
    out: list[tuple[str, bytes]] = [("empty file", b""), ("not JSON", b"{hidden_size: 64"), ("a JSON list", b"[]"),
                                    ("unknown model_type", json.dumps({**obj, "model_type": "nosuch"}).encode())]
    for _ in range(PER_TYPE // 2):
        key = rng.choice(sizes + ["model_type"])
        kind = rng.choice(["delete", "zero", "negative", "string", "float"])
        edited = dict(obj)
        if kind == "delete":
            edited.pop(key)
        else:
            edited[key] = {"zero": 0, "negative": -rng.randrange(1, 64), "string": str(obj[key]),
                           "float": obj[key] + 0.5 if isinstance(obj[key], int) else 0.5}[kind]
        out.append((f"{kind} {key}", json.dumps(edited).encode()))
    return out + json_mutations(data, rng)[:PER_TYPE // 4]


def fuzz_plan(tmp: Path, rng: random.Random) -> Tally:
    """``editscope plan --model DIR`` on a mutated ``DIR/config.json``: rc 2 and one line naming the file, or rc 0
    with the plan of the config as transformers completes it (a missing optional key takes the config class's
    default: the plan must equal the plan of a file that states that default)."""
    import contextlib
    import io

    from transformers import AutoConfig

    from editscope.cli import main

    folder = tmp / "plan-model"
    folder.mkdir()
    path = folder / "config.json"
    pristine = (Path(__file__).parents[1] / "fixtures/configs/Llama-2-7b-hf/config.json").read_bytes()
    args = ["plan", "--model", str(folder), "--no-time", "--available-gib", "100", "--json"]
    tally = Tally()

    def plan() -> Any:
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning from transformers is a config it half accepted
            rc = main(args)
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        if rc == 2 and len(lines) == 1 and lines[0].startswith("editscope: error: "):
            raise EditscopeError(lines[0][len("editscope: error: "):])  # the clean line, for the tally
        if rc != 0 or lines:
            raise AssertionError(f"rc {rc}, stderr {err.getvalue()[:300]!r}")
        return json.loads(out.getvalue())

    def expected(data: bytes) -> Any:
        """The plan of the file with every key transformers would default stated explicitly."""
        obj = json.loads(data)
        defaults = AutoConfig.for_model(obj["model_type"]).to_dict()
        whole = {k: v for k, v in defaults.items() if k in json.loads(pristine)} | obj
        path.write_text(json.dumps(whole))
        try:
            return plan()
        finally:
            path.write_bytes(data)

    for kind, data in config_mutations(pristine, rng):
        path.write_bytes(data)

        def correct(got: Any, data: bytes = data) -> bool:
            try:
                return got == expected(data)
            except (EditscopeError, AssertionError):  # the explicit file refused where the implicit one planned
                return False

        tally.run(f"config.json ({kind})", plan, correct, (str(path), str(folder)))
    path.write_bytes(pristine)
    return tally


def fuzz_run_json_readers(run_dir: Path, tmp: Path, rng: random.Random) -> Tally:
    """A finished run's ``run.json`` mutated, read by the card's replay (``inspect``: what it would edit) and by the
    report: each is the pristine file's result or one clean line; an edited field is never a replay of another
    edit."""
    from editscope.report import build_report
    from editscope.run.inspect import job_from_run
    from editscope.run.store import RESULTS, RUN_JSON

    work = tmp / "readers" / "run"
    shutil.copytree(run_dir, work)
    case = json.loads((work / RESULTS).read_text().splitlines()[0])["case_id"]

    def replay() -> tuple:
        job = job_from_run(work, case, bundle=_BUNDLE[0])
        return job.method.label, repr(job.method.hp), [(r.prompt, r.subject, r.target_new) for r in job.requests]

    def report() -> str:
        out = tmp / "readers" / "report"
        shutil.rmtree(out, ignore_errors=True)
        _, md = build_report([work], out)
        return md.read_text().split("\n", 3)[-1]  # past the title and the date line

    want_replay, want_report = replay(), report()
    tally = Tally()
    path = work / RUN_JSON
    pristine = path.read_bytes()
    mutations = json_mutations(pristine, rng)
    mutations += [(f"delete {k}", json.dumps({x: v for x, v in json.loads(pristine).items() if x != k}).encode())
                  for k in ("model", "config", "config_digest", "format")]
    _mutate_file(path, mutations, pristine, tally, replay, lambda got: got == want_replay)
    _mutate_file(path, mutations[:8], pristine, tally, report, lambda got: got == want_report)
    return tally


_BUNDLE: list = []


def test_every_file_read_back_survives_mutation(tiny_llama, run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    rng = random.Random(SEED)
    tallies: dict[str, Tally] = {}
    tallies["chain checkpoint"] = fuzz_chain(tiny_llama, tmp_path, rng)
    tallies["patch"] = fuzz_patch(tiny_llama, tmp_path, rng)
    tallies["statistics cache"], tallies["statistics export"] = fuzz_stats(tiny_llama, tmp_path, rng)
    tallies["tune state"] = fuzz_tune(tiny_llama, tmp_path, rng)
    tallies["reproduction archive"] = fuzz_archive(run_dir, tmp_path, rng)
    tallies["run.json"], tallies["results.jsonl"] = fuzz_run(tiny_llama, tmp_path, rng)
    _BUNDLE[:] = [tiny_llama]
    tallies["run.json (inspect, report)"] = fuzz_run_json_readers(run_dir, tmp_path, rng)
    tallies["lm_eval.jsonl"] = fuzz_lm_eval(tmp_path, rng)
    tallies["ultraedit chain"] = fuzz_ultraedit_chain(tiny_llama, tmp_path, rng)
    tallies["wild options, judge"] = fuzz_wild(tiny_llama, tmp_path, rng)
    tallies["plan config.json"] = fuzz_plan(tmp_path, rng)
    lines = [f"{'file type':<27} {'tried':>5} {'clean':>5} {'correct':>7} {'traceback':>9} {'silently wrong':>14}"]
    for what, t in tallies.items():
        lines.append(f"{what:<27} {t.tried:>5} {t.clean:>5} {t.correct:>7} {t.traceback:>9} {t.wrong:>14}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    bad = [b for t in tallies.values() for b in t.bad]
    assert not bad, "\n".join(bad)
    for what, t in tallies.items():
        assert t.tried >= 5 and t.clean + t.correct == t.tried, what
