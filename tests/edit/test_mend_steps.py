"""MEND's training length as an edit's ``steps``: training leaves a snapshot of the editor at every checkpointed step,
an edit uses exactly the one at ``hp.steps`` (equal to an editor trained only that long, in another home), a step
count that is not saved is a one-line error naming the saved ones, and ``editscope tune`` trains (the editor's
declared ``prepare``) before comparing training lengths."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors import safe_open

from editscope.data.records import EditRequest
from editscope.edit import EDITORS
from editscope.edit.mend import checkpoint_dir, load_checkpoint, new_nets, prepare, saved_steps, snapshot_path
from editscope.edit.mend.core import CHECKPOINT, SNAPSHOTS, checkpoint_step
from editscope.edit.mend.train import train
from editscope.errors import EditscopeError

REQUEST = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")


@pytest.fixture
def mend_home(tmp_path, monkeypatch):
    """A home of the test's own: trained editors must not land in the shared MEND cache."""
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _hp(bundle, **changes):
    return EDITORS["mend"].load_hparams(bundle).replace(**{"train_records": 6, "checkpoint_every": 2,
                                                           "allow_untrained": False, **changes})


def _deltas(bundle, hp) -> dict[str, torch.Tensor]:
    patch = EDITORS["mend"].compute_patch(bundle, REQUEST, hp)
    assert patch.info["trained_steps"] == hp.steps  # the edit records the training length it used
    return patch.deltas


def _state(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a mapping)


def test_an_edit_uses_the_editor_trained_exactly_steps(tiny_bundles, mend_home, tmp_path, monkeypatch):
    bundle = tiny_bundles["llama"]
    hp = _hp(bundle, steps=4)
    train(bundle, hp, progress=False)
    folder = checkpoint_dir(bundle, hp)
    assert sorted(p.name for p in (folder / SNAPSHOTS).iterdir()) == ["step-2.safetensors", "step-4.safetensors"]
    for n in (2, 4):  # what an edit needs, and no optimiser state
        keys = set(_state(snapshot_path(folder, n)))
        assert keys and all(k.startswith("net.") for k in keys) and any("u_norm.0.count" in k for k in keys)
        assert checkpoint_step(snapshot_path(folder, n)) == n
    assert any(k.startswith("opt.") for k in _state(folder / CHECKPOINT))  # the resumable checkpoint is unchanged
    at2, at4 = _deltas(bundle, hp.replace(steps=2)), _deltas(bundle, hp)
    snapshot2 = _state(snapshot_path(folder, 2))

    # independently: an editor trained only 2 steps, in a fresh home, used from its checkpoint (no snapshots)
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "other"))
    only2 = train(bundle, hp, steps=2, progress=False)
    assert only2.checkpoint != folder / CHECKPOINT and checkpoint_step(only2.checkpoint) == 2
    for path in (only2.checkpoint.parent / SNAPSHOTS).iterdir():
        path.unlink()
    expected = _deltas(bundle, hp.replace(steps=2))
    nets = new_nets(bundle, hp)
    load_checkpoint(only2.checkpoint, nets)
    assert all(torch.equal(snapshot2[f"net.{k}"], v.cpu()) for k, v in nets.state_dict().items())
    for name, delta in expected.items():
        assert float(delta.abs().max()) > 0
        torch.testing.assert_close(at2[name], delta, rtol=0, atol=1e-6 * float(delta.abs().max()))
        assert not torch.allclose(at4[name], delta, rtol=1e-3, atol=1e-3 * float(delta.abs().max()))

    # training on (resumed) adds snapshots and leaves the earlier ones as they were
    monkeypatch.setenv("EDITSCOPE_HOME", str(mend_home))
    before = {n: snapshot_path(folder, n).read_bytes() for n in (2, 4)}
    train(bundle, hp, steps=6, progress=False)
    assert saved_steps(folder) == [2, 4, 6] and checkpoint_step(folder / CHECKPOINT) == 6
    assert all(snapshot_path(folder, n).read_bytes() == before[n] for n in (2, 4))


@pytest.mark.parametrize("allow_untrained", [False, True])
def test_a_step_count_not_saved_is_one_line_naming_the_saved_ones(tiny_bundles, mend_home, allow_untrained):
    bundle = tiny_bundles["llama"]
    hp = _hp(bundle, steps=4, allow_untrained=allow_untrained)
    train(bundle, hp, progress=False)
    for steps in (3, 6):  # between two snapshots; past the training
        with pytest.raises(EditscopeError) as err:
            EDITORS["mend"].compute_patch(bundle, REQUEST, hp.replace(steps=steps))
        text = str(err.value)
        assert "\n" not in text
        assert f"steps={steps} asked" in text and "steps 2, 4 is saved" in text
        assert text.endswith(f"train it with: editscope mend train --model tiny-llama --steps {steps}")


def test_training_to_a_passed_step_trains_again_for_its_snapshot_only(tiny_bundles, mend_home, tmp_path,
                                                                     monkeypatch):
    """A step the checkpoint has passed without a snapshot (between two, or a cache from before snapshots) is
    trained again from step 0; the checkpoint stays where it was; the editor equals one trained only that long."""
    bundle = tiny_bundles["llama"]
    hp = _hp(bundle, steps=4)
    train(bundle, hp, progress=False)
    folder = checkpoint_dir(bundle, hp)
    checkpoint = (folder / CHECKPOINT).read_bytes()
    train(bundle, hp, steps=3, progress=False)
    assert saved_steps(folder) == [2, 3, 4] and (folder / CHECKPOINT).read_bytes() == checkpoint
    at3 = _state(snapshot_path(folder, 3))
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "other"))
    only3 = _state(train(bundle, hp, steps=3, progress=False).checkpoint)
    assert set(at3) == {k for k in only3 if k.startswith("net.")}
    assert all(torch.equal(at3[k], only3[k]) for k in at3)


def test_a_second_trainer_waits_for_the_first_and_trains_nothing(tiny_bundles, mend_home, monkeypatch, capfd):
    """Two trainers of one editor (processes sharing a home): the second waits on the editor folder's lock, saying
    who holds it, then finds the first one's checkpoint at the asked step and runs no training step itself."""
    import importlib
    import os
    import threading

    from editscope.atomic import file_lock

    module = importlib.import_module("editscope.edit.mend.train")  # the package re-exports a same-named function
    bundle = tiny_bundles["llama"]
    hp = _hp(bundle, steps=4)
    folder = checkpoint_dir(bundle, hp)
    stepped: list[str] = []
    losses = module.mend_losses

    def counted(*args, **kwargs):
        stepped.append(threading.current_thread().name)
        return losses(*args, **kwargs)

    monkeypatch.setattr(module, "mend_losses", counted)
    held = threading.Event()

    def first() -> None:  # another trainer: the lock taken as train() takes it (flock: one holder per open file)
        with file_lock(folder.parent / f".{folder.name}.lock", what="the first trainer"):
            held.set()
            module._train(bundle, hp, folder, 4, progress=False, resume=True, log=lambda _m: None)

    thread = threading.Thread(target=first, name="first")
    thread.start()
    assert held.wait(timeout=60)
    second = train(bundle, hp, progress=False)
    thread.join(timeout=600)
    assert stepped == ["first"] * 4  # every step ran in the first trainer
    assert second.steps == 4 and [h["step"] for h in second.history] == [1, 2, 3, 4]
    assert saved_steps(folder) == [2, 4]
    waits = [line for line in capfd.readouterr().err.splitlines() if "waiting for process" in line]
    assert len(waits) == 1 and f"waiting for process {os.getpid()} (building the first trainer)" in waits[0]


def test_prepare_trains_every_asked_length_once_per_training_digest(tiny_bundles, mend_home):
    bundle = tiny_bundles["llama"]
    asked = [_hp(bundle, steps=n) for n in (2, 4)] + [_hp(bundle, steps=2, rank=4)]
    lines: list[str] = []
    prepare(bundle, asked, lines.append, progress=False)
    assert saved_steps(checkpoint_dir(bundle, asked[0])) == [2, 4]
    assert saved_steps(checkpoint_dir(bundle, asked[2])) == [2]  # another training digest: its own run, to 2
    assert sum(line.startswith("MEND: training the editor") for line in lines) == 2
    lines.clear()
    prepare(bundle, asked, lines.append, progress=False)  # everything saved: nothing to train
    assert lines == []
    assert EDITORS["mend"].prepare is prepare and EDITORS["rome"].prepare is None


def test_tune_trains_first_and_compares_training_lengths(tiny_bundles, mend_home, tmp_path):
    from editscope.edit.hparams import load_yaml, read_provenance
    from editscope.edit.mend import MendHParams
    from editscope.run.store import read_results
    from editscope.tune import Tuner, TuneSettings

    bundle = tiny_bundles["llama"]
    out = tmp_path / "tune"
    # small step sizes: edits small enough to keep NS on these cases (a refused pair of candidates has no choice)
    overrides = {"checkpoint_every": 2, "train_records": 6, "edit_lr": 1e-5, "lr_lr": 1e-7}
    settings = TuneSettings(model="tiny-llama", method="mend", out=str(out), budget_minutes=30, overrides=overrides,
                            grid={"steps": (2, 4)}, knobs=["steps"], first=2, eta=2, max_cases=2)
    lines: list[str] = []
    result = Tuner(settings, bundle=bundle, progress=False, log=lines.append).run()
    assert any(line.startswith("MEND: training the editor for tiny-llama to 4 steps") for line in lines)
    hp = EDITORS["mend"].load_hparams(bundle).replace(**overrides)
    assert saved_steps(checkpoint_dir(bundle, hp)) == [2, 4]
    rows = {}
    for cid in result.halving.rungs[0][1]:
        found = read_results(out / "candidates" / cid / "results.jsonl")
        (steps,) = {r["hparams"]["steps"] for r in found}
        assert all(r["edit_info"]["trained_steps"] == steps for r in found)
        rows[steps] = [r["post"] for r in found]
    assert set(rows) == {2, 4} and rows[2] != rows[4]  # two trained editors, two sets of scores
    tuned = load_yaml(result.yaml_path, MendHParams, n_layers=bundle.n_layers)
    assert tuned.steps in (2, 4) and tuned.steps == result.chosen.to_dict()["hparams"]["steps"]
    assert tuned.checkpoint_every == 2
    assert read_provenance(result.yaml_path)["search"]["grids"] == {"steps": [2, 4]}
    assert re.search(r"prepared in \d+ s", "\n".join(lines))
