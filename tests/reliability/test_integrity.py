"""One rule for every file editscope reads back (editscope.integrity): a content digest over tensors *and* metadata,
checked before anything is used; damage is one line naming the file and what did not match; a file without a digest
(an earlier editscope's) is refused with how to proceed, unless ``--trust-unverified`` (recorded with the output)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from editscope.cli import main
from editscope.errors import EditscopeError
from editscope.integrity import (
    DIGEST_KEY,
    FOLDER_MANIFEST,
    IntegrityError,
    file_digest,
    read_json,
    seal,
    seal_folder,
    seal_json,
    trusting,
    unverified,
    verify,
    verify_folder,
    verify_json,
)


# -- the helper -----------------------------------------------------------------------------------------------------
def _content():
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1, 2], dtype=torch.int64)}
    return {"format": "x-1", "chain": json.dumps({"round": 2, "templates": ["The {} is"]})}, tensors


def test_a_sealed_file_verifies_and_every_change_is_named():
    meta, tensors = _content()
    sealed = seal(meta, tensors)
    assert verify("f", sealed, tensors, what="thing", hint="h") is True
    cases = [
        ({**sealed, "chain": json.dumps({"round": 1, "templates": ["The {} is"]})}, tensors, "metadata key 'chain' "
         "does not match"),
        ({**sealed, "chain": json.dumps({"round": 2, "templates": ["The {} iz"]})}, tensors, "metadata key 'chain'"),
        ({k: v for k, v in sealed.items() if k != "format"}, tensors, "metadata key 'format' is missing"),
        ({**sealed, "extra": "1"}, tensors, "metadata key 'extra' is not covered"),
        (sealed, {**tensors, "a": tensors["a"] + 1}, "tensor 'a' does not match"),
        (sealed, {**tensors, "b": tensors["b"].to(torch.int32)}, "tensor 'b' does not match"),  # same values, dtype
        (sealed, {"a": tensors["a"]}, "tensor 'b' is missing"),
        ({**sealed, DIGEST_KEY: sealed[DIGEST_KEY].replace('"digest":"', '"digest":"0')}, tensors,
         "digest is itself damaged"),
        ({**sealed, DIGEST_KEY: "{"}, tensors, "digest is itself damaged"),
    ]
    for meta2, tensors2, message in cases:
        with pytest.raises(IntegrityError, match=rf"^f: thing: .*{message}") as err:
            verify("f", meta2, tensors2, what="thing", hint="h")
        assert "\n" not in str(err.value)


def test_a_file_without_a_digest_is_refused_unless_trusted_and_then_recorded(capsys):
    meta, tensors = _content()
    with pytest.raises(IntegrityError, match=r"^f: thing has no content digest .*; delete it, or pass "
                       r"--trust-unverified to use it unverified$"):
        verify("f", meta, tensors, what="thing", hint="delete it")
    assert verify("f", meta, tensors, what="thing", hint="", trust=True) is False
    with trusting() as used:
        assert verify("f", meta, tensors, what="thing", hint="") is False
        assert verify("f", meta, tensors, what="thing", hint="") is False
        assert used == ["f"] == unverified()
        # each file used unverified is one line on stderr, once, not only a key in run.json
        assert capsys.readouterr().err.splitlines() == [
            "editscope: warning: f: thing has no content digest; used unverified (--trust-unverified)"] * 2
        meta2 = seal(meta, tensors) | {"format": "y"}  # a damaged digest is refused whatever the trust
        with pytest.raises(IntegrityError, match="metadata key 'format' does not match"):
            verify("g", meta2, tensors, what="thing", hint="")
    assert unverified() == []


def test_json_and_folders(tmp_path):
    data = {"digest": "abc", "wall_seconds": 12.5, "rungs": [{"cases": 4}]}
    sealed = seal_json(data)
    assert verify_json("s", json.loads(json.dumps(sealed)), what="state", hint="") == data
    for changed, message in (({**sealed, "wall_seconds": 1.5}, "key 'wall_seconds' does not match"),
                             ({k: v for k, v in sealed.items() if k != "rungs"}, "key 'rungs' is missing"),
                             ([sealed], "expected a JSON object")):
        with pytest.raises(IntegrityError, match=message):
            verify_json("s", changed, what="state", hint="")
    (tmp_path / "s.json").write_text('{"a": 1')
    with pytest.raises(IntegrityError, match=r"s.json: state: not readable JSON"):
        read_json(tmp_path / "s.json", what="state", hint="delete it")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text("{}")
    (folder / "rows.gz").write_bytes(b"\x1f\x8b rows")
    seal_folder(folder, ["run.json", "rows.gz"])
    assert verify_folder(folder, ["run.json", "rows.gz"], what="archive", hint="")
    (folder / "rows.gz").write_bytes(b"\x1f\x8b rowz")
    with pytest.raises(IntegrityError, match="archive: file 'rows.gz' does not match"):
        verify_folder(folder, ["run.json", "rows.gz"], what="archive", hint="")
    (folder / "rows.gz").unlink()
    with pytest.raises(IntegrityError, match="archive: file 'rows.gz' is missing"):
        verify_folder(folder, ["run.json", "rows.gz"], what="archive", hint="")
    (folder / FOLDER_MANIFEST).unlink()
    with pytest.raises(IntegrityError, match="archive has no content digest"):
        verify_folder(folder, ["run.json"], what="archive", hint="")


# -- chain checkpoints: the two 1-byte changes, and an earlier editscope's file --------------------------------
def _header(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write_header(path, header, body):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _edit_chain_meta(path, change):
    """Rewrite the chain JSON in a checkpoint's metadata in place (tensors and the recorded digest kept)."""
    header, body = _header(path)
    chain = json.loads(header["__metadata__"]["chain"])
    change(chain)
    header["__metadata__"]["chain"] = json.dumps(chain, sort_keys=True)
    _write_header(path, header, body)


def _strip_digest(path):
    """The file as the previous editscope wrote it: the same content without the whole-file digest."""
    with safe_open(str(path), framework="pt") as fh:
        meta = {k: v for k, v in fh.metadata().items() if k != DIGEST_KEY}
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    save_file(tensors, str(path), metadata=meta)


class Kill(Exception):
    pass


def test_an_altered_or_unverified_chain_checkpoint_is_refused_and_trust_is_recorded(tiny_bundles, tmp_path):
    """A memit chain of 3 rounds of 2, killed after its round-2 checkpoint. Flipping the checkpoint's round (2 -> 1) or
    one letter of a context template is refused on resume, naming the file and the metadata key; the same file
    without its digest (an earlier editscope's) is refused with how to proceed; with --trust-unverified the run
    resumes, its rows equal an uninterrupted run's, and run.json names the file it trusted."""
    from editscope.run import Runner, parse_config
    from editscope.run.chain import CHAINS_DIR, ChainCheckpoint, chain_path
    from editscope.run.runner import timing_free
    from editscope.run.store import read_results

    bundle = tiny_bundles["llama"]
    data = {"model": "tiny-llama", "seed": 0, "mode": {"sequential_batches": {"batch": 2, "rounds": 3,
                                                                             "checkpoints": 1}},
            "methods": [{"name": "memit", "overrides": {"v_steps": 2}}], "dataset": "counterfact",
            "slice": {"limit": 6}, "suites": ["counterfact"]}
    config = parse_config(data)

    def run(out, **kw):
        return Runner(config, out_dir=out, bundle=bundle, progress=False, log=lambda _m: None, **kw).run()

    want = [timing_free(r) for r in read_results(run(tmp_path / "whole").out_dir / "results.jsonl")]

    path = chain_path(tmp_path / "killed", "counterfact", 0, "memit")

    def kill(row):  # round 3 edited, the round-2 checkpoint on disk
        if not row["checkpoint"]:
            raise Kill

    with pytest.raises(Kill):
        run(tmp_path / "killed", on_row=kill)
    assert ChainCheckpoint.load(path).round == 2
    pristine = path.read_bytes()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = str(tmp_path / "killed")

    for change, key in ((lambda c: c.update(round=1), "chain"),
                        (lambda c: c["templates"][0][4].__setitem__(0, "X" + c["templates"][0][4][0][1:]), "chain")):
        _edit_chain_meta(path, change)
        with pytest.raises(EditscopeError, match=rf"^{path}: chain checkpoint: metadata key '{key}' does not match "
                           "the recorded content digest"):
            ChainCheckpoint.load(path)
        assert main(["run", str(cfg), "-o", out, "--no-progress"]) == 2
        path.write_bytes(pristine)

    _strip_digest(path)
    with pytest.raises(EditscopeError, match=rf"^{path}: chain checkpoint has no content digest .*delete it to restart "
                       "the chain, or pass --trust-unverified"):
        ChainCheckpoint.load(path)
    assert main(["run", str(cfg), "-o", out, "--no-progress"]) == 2
    assert ChainCheckpoint.load(path, trust_unverified=True).verified is False
    assert main(["run", str(cfg), "-o", out, "--no-progress", "--trust-unverified"]) == 0
    meta = json.loads((tmp_path / "killed" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["unverified_files"] == [str(path)]
    got = [timing_free(r) for r in read_results(tmp_path / "killed" / "results.jsonl")]
    assert len(got) == len(want) and not (tmp_path / "killed" / CHAINS_DIR).exists()
    key = ("case_id", "edits_applied")
    assert sorted(got, key=lambda r: [r[k] for k in key]) == sorted(want, key=lambda r: [r[k] for k in key])


# -- tune state and reproduction archives ---------------------------------------------------------------------------
def test_tune_state_is_sealed_and_checked(tiny_bundles, tmp_path):
    from editscope.integrity import dumps_sealed
    from editscope.tune import Tuner, TuneSettings

    out = tmp_path / "tune"
    out.mkdir()
    tuner = Tuner(TuneSettings(model="tiny-llama", method="rome", out=str(out)), bundle=tiny_bundles["llama"],
                  progress=False, log=lambda _m: None)
    tuner._save_state(out / "state.json", 30.0, None)
    assert tuner._state(out / "state.json")["wall_seconds"] == 30.0
    text = (out / "state.json").read_text()
    (out / "state.json").write_text(text.replace('"wall_seconds": 30.0', '"wall_seconds": 3.0'))
    with pytest.raises(EditscopeError, match=r"state.json: tune state: key 'wall_seconds' does not match"):
        tuner._state(out / "state.json")
    (out / "state.json").write_text(json.dumps({"wall_seconds": 30.0}))  # an earlier editscope's
    with pytest.raises(EditscopeError, match=r"state.json: tune state has no content digest.*delete it to count the "
                       "budget from zero.*--trust-unverified"):
        tuner._state(out / "state.json")
    with trusting():
        assert tuner._state(out / "state.json")["wall_seconds"] == 30.0
        (out / "state.json").write_text(json.dumps({"wall_seconds": "soon"}))
        with pytest.raises(EditscopeError, match="field 'wall_seconds': expected a number"):
            tuner._state(out / "state.json")
    (out / "state.json").write_text(dumps_sealed({"wall_seconds": -5}))
    with pytest.raises(EditscopeError, match="field 'wall_seconds': expected a number >= 0"):
        tuner._state(out / "state.json")


def test_an_archive_without_its_digest_is_refused_unless_trusted(run_dir, tmp_path):
    from editscope.run.archive import archive_run
    from editscope.run.store import ARCHIVE, run_rows

    dest = tmp_path / "archive" / "run"
    archive_run(run_dir, dest)
    rows = run_rows(dest)
    assert (dest / FOLDER_MANIFEST).is_file() and len(rows) == 1
    data = (dest / ARCHIVE).read_bytes()
    (dest / ARCHIVE).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(EditscopeError, match=rf"^{dest}: run archive: file '{ARCHIVE}' does not match"):
        run_rows(dest)
    (dest / ARCHIVE).write_bytes(data)
    (dest / FOLDER_MANIFEST).unlink()
    with pytest.raises(EditscopeError, match=rf"^{dest}: run archive has no content digest.*--trust-unverified"):
        run_rows(dest)
    with trusting() as used:
        assert run_rows(dest) == rows and used == [str(dest)]


def test_a_file_is_digested_in_chunks_as_its_whole_bytes_would_be(tmp_path):
    """Reference: blake2b (16 bytes) of the whole file read at once, as folders were sealed before the digest was
    read in chunks: every chunk size gives it, so folders sealed then still verify."""
    import hashlib

    data = bytes(range(256)) * 40 + b"tail"
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    want = hashlib.blake2b(data, digest_size=16).hexdigest()
    assert {file_digest(path, chunk) for chunk in (1, 7, 256, len(data), 1 << 24)} == {want}
    (tmp_path / "empty").write_bytes(b"")
    assert file_digest(tmp_path / "empty") == hashlib.blake2b(b"", digest_size=16).hexdigest()
    seal_folder(tmp_path, ["weights.bin"])
    manifest = json.loads((tmp_path / FOLDER_MANIFEST).read_text())
    assert want in json.dumps(manifest)
