"""Training MEND's editor networks (Mitchell et al. 2022, §3.2 and Alg. 1) on CPU, resumably.

Each step takes one training case (zsRE: the question ``src`` and its edit target ``alt``), computes the gradient
factors of the target NLL on the unedited model, the editor's update ΔW (differentiable w.r.t. the networks),
and the MEND loss on the edited weights W + ΔW (eq. 4):

    L = c_edit · L_e + c_loc · L_loc,
    L_e   = −log p_{W+ΔW}(alt | rephrase)            (mean over tokens; generalisation: the paraphrased question)
    L_loc = KL(p_W(· | loc) ‖ p_{W+ΔW}(· | loc))     (summed over the vocabulary, mean over loc_ans positions)

Adam on the networks (``lr``) and on the step sizes α (``lr_lr``). The checkpoint (networks, normaliser
statistics, Adam moments, step and loss history) is written atomically every ``checkpoint_every`` steps and at the
end; training resumes from it. Cases are visited in a seeded order, so a resumed run sees the same sequence. At each
of those steps an immutable snapshot of what an edit needs (networks and normaliser statistics) is written too
(``snapshots/step-<N>.safetensors``): an edit with ``steps: N`` uses it. Asked for a step count the checkpoint has
passed without a snapshot of it (a cache from before snapshots), training runs again from step 0 to it, writing
snapshots only (the same seeded sequence gives the same editor; the checkpoint stays where it was).

Checkpoint and snapshots carry a content digest (:mod:`editscope.integrity`), checked before they are used. They are
a cache that training rebuilds, so a damaged one, or one without a digest (an earlier editscope's), is trained again
with one warning, never used: no ``--trust-unverified`` for them, since the same seeded training gives the same
editor again (at the cost of the training time).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from editscope.atomic import atomic_write, atomic_write_text, file_lock
from editscope.data import load_cases
from editscope.data.records import Case
from editscope.edit.mend.core import (
    CHECKPOINT,
    MendHParams,
    checkpoint_dir,
    checkpoint_step,
    continuation_logprobs,
    editor_path,
    gradient_factors,
    load_checkpoint,
    new_nets,
    pair_ids,
    save_checkpoint,
    saved_steps,
    snapshot_path,
    target_nll,
    weight_updates,
)
from editscope.errors import EditscopeError
from editscope.integrity import IntegrityError
from editscope.lm.engine import ScoringEngine


@dataclass
class TrainResult:
    checkpoint: Path
    snapshot: Path  # the editor after ``steps`` asked (what an edit with ``steps`` uses)
    steps: int
    seconds: float
    history: list[dict]
    curve: Path | None


def training_cases(hp: MendHParams) -> list[Case]:
    cases = load_cases(hp.train_dataset, limit=hp.train_records)
    usable = [c for c in cases if len(c.requests) == 1 and c.paraphrase_prompts and c.neighborhood]
    if not usable:
        raise EditscopeError(f"mend: {hp.train_dataset} has no cases with a paraphrase and a locality question")
    return usable


def case_order(n: int, steps: int, seed: int) -> list[int]:
    """Epoch-wise seeded permutations of the case indices, ``steps`` long (the same on resume)."""
    order: list[int] = []
    epoch = 0
    while len(order) < steps:
        order.extend(np.random.default_rng([seed, epoch]).permutation(n).tolist())
        epoch += 1
    return order[:steps]


@torch.enable_grad()  # differentiable also when the caller runs under no_grad
def mend_losses(bundle, engine: ScoringEngine, nets, hp: MendHParams, case: Case, *, update_stats: bool
                ) -> dict[str, torch.Tensor]:
    """The MEND loss of one training case (module docstring), differentiable w.r.t. ``nets``."""
    request = case.request
    us, ds, pre = gradient_factors(bundle, engine, request.text, request.target_new, hp.layers)
    if update_stats:
        for j in range(len(hp.layers)):
            nets.u_norm[j].update(us[j])
            nets.d_norm[j].update(ds[j])
    params = dict(bundle.model.named_parameters())
    override = {n: params[n] + d for n, d in weight_updates(bundle, nets, hp, us, ds).items()}
    ids, cont = pair_ids(engine, case.paraphrase_prompts[0], request.target_new)
    edit = target_nll(bundle.model, ids, cont, override)
    loc_prompt, loc_answer = case.neighborhood[0]
    loc_ids, loc_cont = pair_ids(engine, loc_prompt, loc_answer)
    with torch.no_grad():
        base = continuation_logprobs(bundle.model, loc_ids, len(loc_cont))
    post = continuation_logprobs(bundle.model, loc_ids, len(loc_cont), override)
    loc = (base.exp() * (base - post)).sum(-1).mean()
    return {"loss": hp.c_edit * edit + hp.c_loc * loc, "edit": edit, "loc": loc, "pre": torch.tensor(pre)}


def optimizer_for(nets, hp: MendHParams) -> torch.optim.Optimizer:
    others = [p for n, p in nets.named_parameters() if n != "lrs"]
    return torch.optim.Adam([{"params": others, "lr": hp.lr}, {"params": [nets.lrs], "lr": hp.lr_lr}])


def plot_curve(path: Path, history: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    window = max(1, len(history) // 20)
    for key, label in (("edit", "L_e (rephrase NLL)"), ("loc", "L_loc (KL)"), ("pre", "NLL before the edit")):
        values = np.convolve([h[key] for h in history], np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], values, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"loss (moving mean of {window})")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("MEND training (Mitchell et al. 2022, eq. 4)")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)
    return path


def train(bundle, hp: MendHParams, *, steps: int | None = None, progress: bool = True, resume: bool = True,
          log: Callable[[str], None] = lambda _m: None) -> TrainResult:
    """Train (or resume training) the editor for ``bundle`` up to ``steps`` (default ``hp.steps``) total steps,
    leaving a snapshot at every checkpointed step (module docstring)."""
    total = hp.steps if steps is None else steps
    if total < 1:
        raise EditscopeError(f"--steps must be >= 1, got {total}")
    folder = checkpoint_dir(bundle, hp)
    # One trainer per editor folder: a second process training the same editor waits here, then resumes from the
    # checkpoint the first one left (or finds the snapshot it asks for) instead of training beside it.
    with file_lock(folder.parent / f".{folder.name}.lock", what=f"MEND editor for {bundle.name}, {total} steps"):
        return _train(bundle, hp, folder, total, progress=progress, resume=resume, log=log)


@dataclass
class _Progress:
    """Where training stands: the step reached, the loss history and the seconds spent (a checkpoint's meta)."""

    start: int = 0
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    snapshots_only: bool = False  # training again to a step the checkpoint has passed: leave the checkpoint alone


def _resume_point(path: Path, folder: Path, total: int, nets, opt, *, resume: bool,
                  log: Callable[[str], None]) -> _Progress:
    """Where to start: the checkpoint's step (``nets`` and ``opt`` filled from it), or step 0 when there is none,
    when it is past ``total`` without a snapshot of it, or when it is damaged or unsealed (trained again: a cache)."""
    if not (resume and path.is_file()):
        return _Progress()
    if (checkpoint_step(path) or 0) > total and not snapshot_path(folder, total).is_file():
        log(f"the checkpoint ({path}) is past step {total} and holds no snapshot of it: training again from step "
            f"0 to {total} for the snapshots (the checkpoint stays as it is)")
        return _Progress(snapshots_only=True)
    try:
        meta = load_checkpoint(path, nets, opt)  # checked before anything is loaded: nets and opt stay fresh
    except IntegrityError as exc:
        warnings.warn(f"{exc}; training the MEND editor again from step 0", stacklevel=4)
        path.unlink(missing_ok=True)
        return _Progress()
    log(f"resuming from step {int(meta['step'])} ({path})")
    return _Progress(int(meta["step"]), list(meta["history"]), float(meta["seconds"]))


@dataclass
class _Saver:
    """Writes the checkpoint and the immutable snapshots of one training run."""

    bundle: Any
    hp: MendHParams
    folder: Path
    nets: Any
    opt: torch.optim.Optimizer

    def snapshot(self, step: int, seconds: float) -> None:
        target = snapshot_path(self.folder, step)
        if not target.is_file():  # immutable: the same training digest and step give the same editor
            save_checkpoint(target, self.nets, None, {"step": step, "seconds": seconds, "hparams": self.hp.replace(
                steps=step).to_dict(), "model": self.bundle.name, "fingerprint": self.bundle.base_fingerprint})

    def save(self, step: int, p: _Progress) -> None:
        self.snapshot(step, p.seconds)
        if p.snapshots_only:
            return
        meta = {"step": step, "history": p.history, "seconds": p.seconds, "hparams": self.hp.to_dict(),
                "model": self.bundle.name, "fingerprint": self.bundle.base_fingerprint}
        save_checkpoint(self.folder / CHECKPOINT, self.nets, self.opt, meta)
        atomic_write_text(self.folder / "hparams.json", json.dumps(self.hp.to_dict(), indent=1))


def _train(bundle, hp: MendHParams, folder: Path, total: int, *, progress: bool, resume: bool,
           log: Callable[[str], None]) -> TrainResult:
    """:func:`train` with its folder's lock held."""
    path = folder / CHECKPOINT
    torch.manual_seed(hp.seed)
    nets = new_nets(bundle, hp)
    opt = optimizer_for(nets, hp)
    p = _resume_point(path, folder, total, nets, opt, resume=resume, log=log)
    saver = _Saver(bundle, hp, folder, nets, opt)
    _steps(bundle, hp, nets, opt, p, total, saver, progress)
    if p.start == total:  # resumed exactly at the asked step: its snapshot (a cache from before snapshots lacks it)
        saver.snapshot(p.start, p.seconds)
    png = folder / "loss_curve.png"
    if p.history and not p.snapshots_only:  # a run again for snapshots leaves the longer run's curve as it is
        plot_curve(png, p.history)
    curve = png if png.is_file() else None
    return TrainResult(path, snapshot_path(folder, total), max(p.start, total), p.seconds, p.history, curve)


def _steps(bundle, hp: MendHParams, nets, opt, p: _Progress, total: int, saver: _Saver, progress: bool) -> None:
    """Training steps ``p.start`` .. ``total`` in the seeded case order, saving at every checkpointed step."""
    cases = training_cases(hp)
    order = case_order(len(cases), total, hp.seed)
    engine = ScoringEngine(bundle)
    nets.train()
    from tqdm import tqdm

    with tqdm(total=total, initial=p.start, desc="mend train", unit="step", disable=not progress) as bar:
        for step in range(p.start, total):
            t0 = time.perf_counter()
            losses = mend_losses(bundle, engine, nets, hp, cases[order[step]], update_stats=True)
            opt.zero_grad()
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(list(nets.parameters()), hp.grad_clip)
            opt.step()
            p.seconds += time.perf_counter() - t0
            p.history.append({"step": step + 1, **{k: float(v.detach()) for k, v in losses.items()}})
            bar.update(1)
            if progress:
                bar.set_postfix(edit=f"{p.history[-1]['edit']:.3f}", loc=f"{p.history[-1]['loc']:.4f}")
            if (step + 1) % hp.checkpoint_every == 0 or step + 1 == total:
                saver.save(step + 1, p)


def prepare(bundle, hparams: Sequence[MendHParams], log: Callable[[str], None] = lambda _m: None, *,
            progress: bool = True) -> None:
    """Train the editor each of ``hparams`` needs (the editor's declared preparation, run by ``editscope tune``
    before its search): per training digest, one resumable run to the largest ``steps`` asked, which leaves a
    snapshot at every checkpointed step; an asked ``steps`` that is no checkpointed step is the one-line error of
    :func:`editor_path`, before any edit."""
    groups: dict[str, list[MendHParams]] = {}
    for hp in hparams:
        groups.setdefault(hp.training_digest(), []).append(hp)
    for group in groups.values():
        longest = max(group, key=lambda hp: hp.steps)
        folder = checkpoint_dir(bundle, longest)
        asked = sorted({hp.steps for hp in group})
        if set(asked) - set(saved_steps(folder)):
            log(f"MEND: training the editor for {bundle.name} to {longest.steps} steps (edits need the editor after "
                f"steps {', '.join(map(str, asked))}; resumable, cached in {folder})")
            train(bundle, longest, steps=longest.steps, progress=progress, log=log)
        missing = sorted(set(asked) - set(saved_steps(folder)))
        if missing:  # the checkpoint had passed them before snapshots were kept: trained again, snapshots only
            train(bundle, longest, steps=missing[-1], progress=progress, log=log)
        for n in asked:  # the editor each one needs, or its one-line error (no checkpointed step), now
            editor_path(bundle, longest.replace(steps=n, allow_untrained=False))
