"""MEND as an editor (Mitchell et al. 2022, §3; see :mod:`.nets` for the networks): hyperparameters, the gradient
factors of one edit, the cached trained editor (safetensors under ``EDITSCOPE_HOME``), and ``compute``.

An edit is one forward and backward of the target NLL on the edit prompt (the factors u_i, δ_i of the down
projections of ``hp.layers``, read with gradient-capturing hooks) plus one forward of the editor networks. The
trained editor is looked up by the model's base fingerprint and a digest of the hparams that shape training; a
missing one is a one-line error saying how to train it (``allow_untrained: true`` instead uses the identity-init
networks with no normalisation, i.e. one fine-tuning gradient step of size ``edit_lr``: for tests only).

**Loss-term plug-ins** (APP; paper 003 Table 8 and App. B.5: "MEND could only use L1"): MEND's editing loss is the
loss whose gradient factors go through the editor, so a plug-in's terms are added to it,
L = L_e + Σ terms, and the factors of every forward the loss reads (the edit prompt, APP's answer rows) are
concatenated, rows with a zero u or δ skipped (as MEND's reference code skips them). The gradient is taken at the
unedited weights, where APP's L2 and L3 (drops/rises against the same unedited model) are 0 with zero gradient:
only α·L1 moves the update, which is why the paper sets only α for MEND.

**Training length.** Training writes, besides its resumable checkpoint, an immutable snapshot of the editor (networks
and normaliser statistics, no Adam state) at every step it checkpoints: ``snapshots/step-<N>.safetensors``. An edit
uses the editor trained exactly ``hp.steps`` steps (that snapshot, or the checkpoint when it is at that step), so
``steps`` is a knob ``editscope tune`` can compare; ``prepare`` (:mod:`.train`) trains what a set of hparams needs
first.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from editscope.atomic import atomic_write
from editscope.data.records import EditRequest
from editscope.edit.hparams import HParams
from editscope.edit.mend.nets import MendNets
from editscope.edit.objective import ObjectiveTerm, TargetNLL, VStep, setup_terms, weights_context
from editscope.edit.runtime import EditRuntime
from editscope.errors import EditscopeError
from editscope.integrity import IntegrityError, seal, verify
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture, hooks
from editscope.paths import home

CHECKPOINT = "editor.safetensors"
SNAPSHOTS = "snapshots"
"""Folder (beside :data:`CHECKPOINT`) of the editor as it was after each checkpointed step: ``step-<N>.safetensors``."""
#: hparams that change what training produces (``steps`` only says how long: training resumes to a larger one, and
#: the editor after each checkpointed step stays available as a snapshot)
TRAINING_KEYS = ("layers", "rank", "shared", "edit_lr", "lr", "lr_lr", "c_edit", "c_loc", "train_dataset",
                 "train_records", "seed", "grad_clip")


@dataclass
class MendHParams(HParams):
    """``layers``: the down projections edited (MEND: the last 3 blocks); ``rank``: of U, V (MEND: 1920 for
    GPT-2 XL; smaller here for CPU); ``shared``: one network for all layers with per-layer s, o (MEND's default);
    ``edit_lr``: initial α_ℓ. Training (MEND eq. 4, L = c_edit·L_e + c_loc·L_loc; MEND's reference config: 0.1
    and 1): Adam with ``lr`` on the networks and ``lr_lr`` on α, gradient-norm clip ``grad_clip``, ``steps``
    edits, one per step, drawn from the first ``train_records`` cases of ``train_dataset`` (the rest is held out),
    checkpoint every ``checkpoint_every`` steps."""

    method = "mend"
    PLAN_LAYERS = "last3"  # a plan without a file: MEND's default edit layers
    rank: int = 64
    shared: bool = True
    edit_lr: float = 1e-4
    lr: float = 1e-4
    lr_lr: float = 1e-4
    c_edit: float = 0.1
    c_loc: float = 1.0
    grad_clip: float = 100.0
    steps: int = 500
    train_dataset: str = "zsre"
    train_records: int = 900
    checkpoint_every: int = 50
    seed: int = 0
    allow_untrained: bool = False

    #: steps here are training edits (one per step; MEND trains on the order of 1e5), not Adam steps on one edit.
    RANGES = {"rank": "[1, 100000]", "edit_lr": "(0, 10]", "lr": "(0, 10]", "lr_lr": "(0, 10]", "c_edit": "[0, 1e6]",
              "c_loc": "[0, 1e6]", "grad_clip": "(0, inf)", "steps": "[1, 1e7]", "train_records": "[1, inf)",
              "checkpoint_every": "[1, 1e7]", "seed": "[0, 1e18]"}
    #: Training length and the size of the edit: ``edit_lr`` (the initial step sizes α), ``lr_lr`` (Adam moves each
    #: α by about lr_lr per step whatever its scale, so α ends near lr_lr·steps when the edit loss pulls it up: on
    #: SmolLM2 1e-4 -> ~4e-3 in 100 steps, and every edit flipped its neighbours) and ``c_loc`` (eq. 4's locality
    #: weight). All but ``steps`` are training keys: ``prepare`` trains one editor per combination, to the largest
    #: ``steps``; the steps are multiples of the shipped SmolLM2 ``checkpoint_every`` (25), so an edit finds the
    #: snapshot at exactly its ``steps``.
    TUNABLE = {"steps": (50, 200), "edit_lr": (1e-6, 1e-5, 1e-4), "lr_lr": (1e-7, 1e-6, 1e-4), "c_loc": (1.0, 100.0)}

    def training_digest(self) -> str:
        data = {k: v for k, v in self.to_dict().items() if k in TRAINING_KEYS}
        return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=8).hexdigest()


# -- the model side: teacher-forced log-probs and the gradient factors -------------------------------------------

def pair_ids(engine: ScoringEngine, context: str, continuation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids [1, T] (context + continuation without its last token) and the continuation's ids; the
    continuation is predicted at the last len(continuation) positions (rule 2 boundary: ``engine.encode_pair``)."""
    ctx, cont = engine.encode_pair(context, continuation)
    if not ctx:
        raise EditscopeError(f"mend: empty context before {continuation!r}")
    device = engine.bundle.device  # fed to the model and gathered against its logits: on its device
    return (torch.tensor([list(ctx) + list(cont[:-1])], device=device), torch.tensor(list(cont), device=device))


def continuation_logprobs(model, ids: torch.Tensor, n_cont: int,
                          override: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Log-softmax [n_cont, vocab] at the positions predicting the continuation; ``override`` replaces
    parameters by name for this forward (differentiable w.r.t. them: ``torch.func.functional_call``)."""
    kwargs = dict(input_ids=ids, use_cache=False, logits_to_keep=n_cont)
    if override:
        out = torch.func.functional_call(model, override, args=(), kwargs=kwargs, strict=False)
    else:
        out = model(**kwargs)
    return out.logits[0, -n_cont:].float().log_softmax(-1)


def target_nll(model, ids: torch.Tensor, cont: torch.Tensor, override: dict | None = None) -> torch.Tensor:
    """Mean per-token NLL of the continuation (MEND's L_e)."""
    logprobs = continuation_logprobs(model, ids, len(cont), override)
    return -logprobs.gather(-1, cont[:, None]).mean()


def gradient_factors(bundle, engine: ScoringEngine, context: str, target: str, layers: Sequence[int]
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """u_i (down-projection inputs, [T, d_in]) and δ_i (gradients of the target NLL w.r.t. its outputs,
    [T, d_out]) per edited layer, and the loss: ∇W_ℓ = Σ_i δ_i u_iᵀ."""
    ids, cont = pair_ids(engine, context, target)
    keys = [f"blocks.{layer}.mlp_key" for layer in layers]
    outs = [f"blocks.{layer}.mlp_out" for layer in layers]
    with torch.enable_grad(), capture(bundle.model, bundle.arch, keys + outs, grad=True) as store:
        loss = target_nll(bundle.model, ids, cont)
        loss.backward()
    us = [store[k][0].detach().float() for k in keys]
    deltas = [store.grads[o][0].detach().float() for o in outs]
    return us, deltas, float(loss.detach())


def loss_factors(bundle, engine: ScoringEngine, request: EditRequest, layers: Sequence[int],
                 terms: Sequence[ObjectiveTerm]) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, float]]:
    """u_i, δ_i per edited layer of L = L_e + Σ terms at the unedited weights (module docstring), over every
    forward the loss runs; rows where u or δ is all zero (padding, positions no loss reads) are left out. Returns
    them and each term's value."""
    # every forward's rows as they are: the factors are per row, and MEND's networks are not linear in them
    ctx = weights_context(engine, request, terms, fast_side_batches=False)
    setup_terms(ctx, terms)
    seen: dict[str, list[torch.Tensor]] = {}

    def record(name: str):
        def fn(x: torch.Tensor) -> torch.Tensor:
            state = x if x.requires_grad else x.detach().requires_grad_(True)
            if not state.is_leaf:
                state.retain_grad()
            seen.setdefault(name, []).append(state)
            return state

        return fn

    keys = [f"blocks.{layer}.mlp_key" for layer in layers]
    outs = [f"blocks.{layer}.mlp_out" for layer in layers]
    with torch.enable_grad(), hooks(bundle.model, bundle.arch, {n: record(n) for n in keys + outs}):
        step = VStep(ctx, None, engine.batch_hidden(ctx.batch))
        values = {"nll": TargetNLL()(step), **{t.name: t(step) for t in terms}}
        sum(values.values()).backward()
    us, ds = [], []
    for key, out in zip(keys, outs, strict=True):
        u_rows, d_rows = [], []
        for u, o in zip(seen[key], seen[out], strict=True):
            if o.grad is None:  # a forward no term's loss reads
                continue
            u2, d2 = u.detach().flatten(0, -2).float(), o.grad.flatten(0, -2).float()
            keep = (u2 != 0).any(-1) & (d2 != 0).any(-1)
            u_rows.append(u2[keep])
            d_rows.append(d2[keep])
        us.append(torch.cat(u_rows))
        ds.append(torch.cat(d_rows))
    return us, ds, {k: float(v.detach()) for k, v in values.items()}


def new_nets(bundle, hp: MendHParams) -> MendNets:
    weight = bundle.arch.as_out_in(dict(bundle.model.named_parameters())[bundle.arch.weight_name(hp.layers[0])])
    d_out, d_in = weight.shape
    # seeded on the host (the same initial networks on every device), then beside the weights they edit
    return MendNets(len(hp.layers), d_in, d_out, hp.rank, hp.edit_lr, hp.shared, hp.seed).to(weight.device)


def weight_updates(bundle, nets: MendNets, hp: MendHParams, us, deltas) -> dict[str, torch.Tensor]:
    """ΔW per edited parameter name, in its stored orientation (differentiable w.r.t. the networks)."""
    return {bundle.arch.weight_name(layer): bundle.arch.from_out_in(nets.update(j, us[j], deltas[j]))
            for j, layer in enumerate(hp.layers)}


# -- the trained editor on disk ------------------------------------------------------------------------------

def checkpoint_dir(bundle, hp: MendHParams) -> Path:
    """``$EDITSCOPE_HOME/mend/<base fingerprint>/<training digest>/``."""
    return home() / "mend" / bundle.base_fingerprint / hp.training_digest()


def save_checkpoint(path: Path, nets: MendNets, optimizer: torch.optim.Optimizer | None, meta: dict) -> Path:
    """The networks (and Adam's moments, for resuming) as safetensors; ``meta`` as JSON in the header."""
    tensors = {f"net.{k}": v.detach().contiguous() for k, v in nets.state_dict().items()}
    if optimizer is not None:
        for i, state in optimizer.state_dict()["state"].items():
            for key, value in state.items():
                tensors[f"opt.{i}.{key}"] = torch.as_tensor(value).detach().contiguous()
    metadata = seal({"meta": json.dumps(meta)}, tensors)  # checked before use: load_checkpoint
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _read_sealed(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The meta and tensors of a checkpoint or snapshot, checked against its content digest first. It is a cache
    (training rebuilds it from the same seeded sequence), so an unreadable, damaged or unsealed file (an earlier
    editscope's) is an :class:`IntegrityError` its readers answer by training it again, never by using it."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            raw = dict(fh.metadata() or {})
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a mapping)
        verify(path, raw, tensors, what="MEND editor cache", hint="it is trained again when deleted", trust=False)
        meta = json.loads(raw.get("meta", "{}"))
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise IntegrityError(f"{path}: not a MEND checkpoint ({exc})") from None
    if not isinstance(meta, dict):
        raise IntegrityError(f"{path}: not a MEND checkpoint (its meta is not an object)")
    return meta, tensors


def load_checkpoint(path: Path, nets: MendNets, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Fill ``nets`` (and ``optimizer``) from a checkpoint, after checking its content digest (an
    :class:`IntegrityError` when it does not match or is missing: see :func:`_read_sealed`); returns its meta."""
    meta, tensors = _read_sealed(path)
    net = {k[4:]: v for k, v in tensors.items() if k.startswith("net.")}
    missing = set(nets.state_dict()) - set(net)
    if missing:
        raise EditscopeError(f"{path}: MEND checkpoint lacks {sorted(missing)[:3]} (different hparams?)")
    nets.load_state_dict(net)
    if optimizer is not None:
        state: dict[int, dict] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, i, key = k.split(".", 2)
                state.setdefault(int(i), {})[key] = v
        if state:
            groups = optimizer.state_dict()["param_groups"]
            optimizer.load_state_dict({"state": state, "param_groups": groups})
    return meta


def snapshot_path(folder: Path, step: int) -> Path:
    """The editor after ``step`` training steps (networks and normaliser statistics, no optimiser state)."""
    return folder / SNAPSHOTS / f"step-{step}.safetensors"


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint or snapshot holds, from its header alone (None: no such file, or one whose header
    cannot be read: a damaged cache, trained again by whoever loads it)."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            return int(json.loads((fh.metadata() or {}).get("meta", "{}"))["step"])
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError):
        return None


def saved_steps(folder: Path) -> list[int]:
    """Every step count an edit can use from ``folder``: its snapshots and the checkpoint's step."""
    steps = set()
    for path in (folder / SNAPSHOTS).glob("step-*.safetensors"):
        number = path.name[len("step-"):-len(".safetensors")]
        if number.isdigit():
            steps.add(int(number))
    latest = checkpoint_step(folder / CHECKPOINT)
    if latest is not None:
        steps.add(latest)
    return sorted(steps)


def editor_path(bundle, hp: MendHParams) -> Path | None:
    """The file holding the editor trained exactly ``hp.steps`` steps; None when nothing is trained for these
    hparams and ``allow_untrained`` (the identity networks); else the one-line error saying what was asked, what is
    available and how to train it."""
    folder = checkpoint_dir(bundle, hp)
    snapshot = snapshot_path(folder, hp.steps)
    if snapshot.is_file():
        return snapshot
    available = saved_steps(folder)
    if hp.steps in available:  # the checkpoint is at that step (a cache written before snapshots existed)
        return folder / CHECKPOINT
    train = f"editscope mend train --model {bundle.name} --steps {hp.steps}"
    if not available:
        if hp.allow_untrained:
            return None
        raise EditscopeError(f"no trained MEND editor for {bundle.name} with these hparams ({folder}); train one "
                             f"with: {train}")
    raise EditscopeError(f"MEND editor for {bundle.name}: steps={hp.steps} asked, but only the editor after steps "
                         f"{', '.join(map(str, available))} is saved ({folder}); train it with: {train}")


def load_editor(bundle, hp: MendHParams) -> tuple[MendNets, dict]:
    """The editor trained exactly ``hp.steps`` steps for this model and hparams (:func:`editor_path`)."""
    nets = new_nets(bundle, hp)
    path = editor_path(bundle, hp)
    if path is None:
        return nets, {"trained_steps": 0, "checkpoint": None}
    try:
        meta = load_checkpoint(path, nets)
    except IntegrityError as exc:  # a cache: trained again (same seeded sequence, same editor), never used damaged
        path, meta = _train_again(bundle, hp, path, nets, exc)
    if int(meta.get("step", -1)) != hp.steps:
        raise EditscopeError(f"{path}: holds the editor after step {meta.get('step')}, not {hp.steps} (a file "
                             "renamed or copied by hand?)")
    return nets, {"trained_steps": hp.steps, "checkpoint": str(path)}


def _train_again(bundle, hp: MendHParams, path: Path, nets: MendNets, why: IntegrityError) -> tuple[Path, dict]:
    """Replace the damaged (or unsealed) editor file ``path`` by training it again, saying so in one warning."""
    from editscope.edit.mend.train import train  # train imports this module

    warnings.warn(f"{why}; training the MEND editor again ({hp.steps} steps)", stacklevel=4)
    path.unlink(missing_ok=True)
    train(bundle, hp, steps=hp.steps, progress=False)
    path = editor_path(bundle, hp)
    assert path is not None  # training left the snapshot of hp.steps
    return path, load_checkpoint(path, nets)


def compute(bundle, requests: Sequence[EditRequest], hp: MendHParams, state=None, *, engine: ScoringEngine,
            runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()) -> tuple[dict[str, torch.Tensor], dict]:
    """MEND's edit: the gradient factors of each request's editing loss (target NLL, plus the plug-ins' terms)
    through the editor networks; the updates of several requests add up (the factors of a batch are summed in
    MEND)."""
    nets, info = load_editor(bundle, hp)
    nets.eval()
    deltas: dict[str, torch.Tensor] = {}
    info["edit_loss"] = []
    if extra_terms:
        info["terms"] = []
    for request in requests:
        if extra_terms:
            us, ds, values = loss_factors(bundle, engine, request, hp.layers, extra_terms)
            info["edit_loss"].append(values["nll"])
            info["terms"].append(values)
        else:
            us, ds, loss = gradient_factors(bundle, engine, request.text, request.target_new, hp.layers)
            info["edit_loss"].append(loss)
        with torch.no_grad():
            for name, d in weight_updates(bundle, nets, hp, us, ds).items():
                deltas[name] = deltas[name] + d if name in deltas else d
    params = dict(bundle.model.named_parameters())
    return {n: d.to(params[n].dtype).contiguous() for n, d in deltas.items()}, info
