"""UltraEdit — training-, subject- and memory-free lifelong editing (Gu et al., TMLR 2026, "UltraEdit: Training-,
Subject-, and Memory-Free Lifelong Editing in Language Models"; reference code XiaojieGu/UltraEdit).

One turn (one call, a batch of requests) is one forward and one backward pass, then one linear solve per edited
module; there is no covariance statistic, no v*/z optimisation and no subject position:

1. Features (§3, "editing features"): for every edited module W (out × in: an MLP matrix named in ``modules`` —
   the down projection by default, the gate and up projections as the reference's Qwen2.5/LLaMA-3 configs — at
   each of ``layers``) and every position t that predicts an answer token (the prompt's last token and the answer's
   tokens but the last), the module's input k_t (the key; ``blocks.L.mlp_key`` for the down projection) and the
   gradient g_t = ∂L/∂(W k_t) of the turn's loss L = Σ_requests −log P(o* | p) w.r.t. the module's output;
   z_t = [k_t ‖ g_t] ∈ R^{in+out}.
2. Lifelong normalisation (§3, "lifelong normalization"): running mean μ and standard deviation σ of z over every
   turn so far, one pair per module shape (modules of equal shape share it), updated with this turn's features
   *before* they are normalised: ẑ = (z − μ) / (σ + ε) = [k̂ ‖ ĝ]. The statistics live in
   :class:`UltraEditState`, owned by the caller, so a lifelong chain saves and resumes them.
3. Pseudo values and the shift (§3, "calculating parameter shifts"): v_t = −η ‖k̂_t‖² ĝ_t (η = ``lr``), then one
   ridge solve with the turn's raw keys K (rows k_t): ΔWᵀ = (KᵀK + λ I)⁻¹ Kᵀ V (λ = ``ridge``, 1 in the paper).

The paper's equations are not in editscope's shared texts: its numbering could not be checked here, so formulas
are cited by the paper's section and the reference function that computes them (``ULTRAEDIT.cache`` and
``predict_param_shifts`` in editor/ultraedit.py, ``RunningMeanStd`` in nets.py).

Two readings differ from the reference code (both named in docs/editors.md, both switches of
:data:`ULTRA_CONVENTIONS`: ``convention: paper`` by default, ``convention: reference`` for the reference's): (a) the
loss is the summed NLL of each answer (−log P(o* | p), the paper's NLL); the reference takes the mean over the
answer tokens of each sub-batch of 10 requests (``loss: subbatch_mean``); (b) the running variance adds each turn's
exact sum of squared deviations (Chan et al.'s parallel update), where the reference updates once per sub-batch and
adds n times its *unbiased* variance (``variance: subbatch_unbiased``: n/(n−1) times that sum over 10-14 rows,
refused where a sub-batch holds one answer token, which gives NaN there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from editscope.data.records import EditRequest
from editscope.edit.hparams import (
    TUNE_LAYERS,
    HParams,
    Modules,
    ModulesKey,
    check_convention,
    check_modules,
    default_modules,
)
from editscope.edit.objective import ObjectiveTerm
from editscope.edit.runtime import EditRuntime
from editscope.edit.state import EditState, expect_keys, meta_field
from editscope.errors import EditscopeError
from editscope.lm.archs import MATRIX_POINTS
from editscope.lm.engine import ScoringEngine, TokenBatch
from editscope.lm.hooks import capture
from editscope.progress import report

#: ε of the normalisation, ẑ = (z − μ) / (σ + ε): the reference's ``torch.finfo(float32).eps`` (its features are
#: float32); editscope keeps the statistics in float64 but the same ε, so a feature of zero spread maps to 0.
EPS = float(torch.finfo(torch.float32).eps)


#: UltraEdit's conventions (DESIGN rule 10): presets of two switches where the reference code computes otherwise than
#: the paper reads. ``loss``: ``sum`` (the paper's NLL, summed over the turn's answers) or ``subbatch_mean`` (the
#: reference: the mean NLL over the answer tokens of each sub-batch of ``sub_batch`` requests, its
#: ``dataset.batch_size``); ``variance``: ``exact`` (the turn's rows added to the running statistics at once, Chan et
#: al.'s exact update) or ``subbatch_unbiased`` (the reference: one update per sub-batch, adding n times the
#: sub-batch's *unbiased* variance).
ULTRA_CONVENTIONS: dict[str, dict[str, str]] = {
    "paper": {"loss": "sum", "variance": "exact"},
    "reference": {"loss": "subbatch_mean", "variance": "subbatch_unbiased"},
}
ULTRA_SWITCHES: dict[str, tuple[str, ...]] = {"loss": ("sum", "subbatch_mean"),
                                              "variance": ("exact", "subbatch_unbiased")}
_CONVENTION_FIELDS = {"convention": "paper", "loss": None, "variance": None, "sub_batch": 10}


@dataclass
class UltraEditHParams(ModulesKey, HParams):
    method = "ultraedit"
    lr: float = 1e-6
    ridge: float = 1.0
    convention: str = "paper"
    loss: str | None = None
    variance: str | None = None
    sub_batch: int = 10
    modules: Modules = field(default_factory=default_modules)

    #: modules: the MLP matrices written at each of ``layers`` (gate, up, down; the paper's and editscope's default
    #: is the down projection; the reference's Qwen2.5 config edits gate and up in layers 18-26), or a layer set per
    #: matrix (the reference's LLaMA-3 config: gate in 11-15, up in 18-24; :data:`~editscope.edit.hparams.Modules`).
    #: lr: η of the pseudo values v = −η ‖k̂‖² ĝ (the reference config's 1e-6 on 7-8B models; SmolLM2 ships 1e-3);
    #: ridge: λ of the solve (KᵀK + λI)⁻¹ (1 in the paper and the reference; > 0 keeps it invertible).
    RANGES = {"lr": "(0, 10]", "ridge": "(0, 1e12]"}
    #: η spans the scale between the reference's 7-8B value and SmolLM2's (a hand grid there: 1e-4 ES 62 %, 1e-3
    #: ES 98 % on 100 CounterFact edits in one turn)
    TUNABLE = {"layers": TUNE_LAYERS, "lr": (1e-5, 1e-4, 3e-4, 1e-3)}

    def check(self, where: str = "<hparams>", n_layers: int | None = None) -> None:
        super().check(where, n_layers)
        check_convention(self, where, ULTRA_CONVENTIONS, ULTRA_SWITCHES)
        if isinstance(self.sub_batch, bool) or not isinstance(self.sub_batch, int) or self.sub_batch < 1:
            raise EditscopeError(f"{where}: key 'sub_batch': must be a positive integer, got {self.sub_batch!r}")
        check_modules(self.modules, self.layers, where)

    def switches(self) -> dict[str, str]:
        """The switches in force: the preset of ``convention``, overridden by any switch given."""
        preset = ULTRA_CONVENTIONS[self.convention]
        return {key: getattr(self, key) or preset[key] for key in ULTRA_SWITCHES}

    def protocol(self) -> dict[str, str]:
        """The conventions in force; nothing under the paper's defaults (rows and patches of runs made before the
        switches existed stay as they were)."""
        if all(getattr(self, k) == v for k, v in _CONVENTION_FIELDS.items()):
            return {}
        return {"convention": self.convention, **self.switches(), "sub_batch": str(self.sub_batch)}

    def to_dict(self) -> dict:
        """The fields, without the convention fields and ``modules`` while they hold the defaults (what runs before
        the switches existed recorded: their rows and patches keep their bytes)."""
        data = super().to_dict()  # ModulesKey: without modules while default
        if all(data[k] == v for k, v in _CONVENTION_FIELDS.items()):
            for k in _CONVENTION_FIELDS:
                del data[k]
        return data


def shape_key(n_in: int, n_out: int) -> str:
    """The normaliser's key for a module of ``n_in`` inputs and ``n_out`` outputs (the reference keys its
    normalisers by ``get_shape``, (in, out))."""
    return f"{n_in}x{n_out}"


@dataclass
class UltraEditState(EditState):
    """The lifelong normaliser: per module shape (:func:`shape_key`) the number of feature rows seen, their mean
    μ and their sum of squared deviations s² (float64; σ² = s² / (n − 1)); plus the edits and turns so far."""

    counts: dict[str, int] = field(default_factory=dict)
    means: dict[str, torch.Tensor] = field(default_factory=dict)
    sq_devs: dict[str, torch.Tensor] = field(default_factory=dict)
    n_edits: int = 0
    n_turns: int = 0

    def without_edits(self) -> UltraEditState:
        """No statistics: they are made of the edits' own features (nothing is computed from the unedited model)."""
        return UltraEditState()

    def update(self, key: str, z: torch.Tensor, *, unbiased: bool = False) -> None:
        """Add the rows of ``z`` [n, in + out] to the running statistics of ``key`` (UltraEdit §3, lifelong
        normalization: μ ← μ + n/(N+n)·δ, s² ← s² + S_z + N·n/(N+n)·δ², N ← N + n, δ = z̄ − μ; S_z is the
        rows' sum of squared deviations from z̄ (Chan et al. 1979)). ``unbiased``: the reference code's rule, which
        adds n·Var(z) with the unbiased variance, S_z·n/(n − 1), in place of S_z (undefined for one row: refused)."""
        z = z.double()
        n = int(z.shape[0])
        if n == 0:
            return
        if unbiased and n == 1:
            raise EditscopeError("ultraedit (variance: subbatch_unbiased): a sub-batch holds one answer token, where "
                                 "the reference's unbiased variance is NaN; use variance: exact, or larger sub-batches")
        old = self.counts.get(key, 0)
        mean = self.means.get(key)
        if mean is None:
            mean = torch.zeros(z.shape[1], dtype=torch.float64, device=z.device)
            self.sq_devs[key] = torch.zeros_like(mean)
        total = old + n
        batch_mean = z.mean(0)
        delta = batch_mean - mean
        self.means[key] = mean + delta * (n / total)
        spread = ((z - batch_mean) ** 2).sum(0) * (n / (n - 1) if unbiased else 1.0)
        self.sq_devs[key] = self.sq_devs[key] + spread + delta ** 2 * (old * n / total)
        self.counts[key] = total

    def std(self, key: str) -> torch.Tensor:
        """σ = sqrt(s² / (N − 1 + ε)) (the reference's ``RunningMeanStd``; 0 after a single row)."""
        return (self.sq_devs[key] / (self.counts[key] - 1 + EPS)).sqrt()

    def normalise(self, key: str, z: torch.Tensor) -> torch.Tensor:
        """ẑ = (z − μ) / (σ + ε) with the statistics of ``key`` (UltraEdit §3, lifelong normalization)."""
        if key not in self.counts:
            raise EditscopeError(f"ultraedit: no normaliser statistics for module shape {key} (update first)")
        return (z.double() - self.means[key]) / (self.std(key) + EPS)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``mean.SHAPE`` and ``sq_dev.SHAPE`` per module shape; metadata: row counts per shape, edits, turns."""
        tensors = {f"mean.{k}": m for k, m in self.means.items()}
        tensors |= {f"sq_dev.{k}": s for k, s in self.sq_devs.items()}
        return tensors, {"counts": dict(self.counts), "n_edits": self.n_edits, "n_turns": self.n_turns}

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any],
                        where: str) -> UltraEditState:
        counts = meta_field(meta, "counts", dict, where)
        for key, n in counts.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise EditscopeError(f"{where}: editor state: metadata key 'counts': {key!r} must be a positive "
                                     f"integer, got {n!r}")
        expect_keys(tensors, {f"{kind}.{k}" for k in counts for kind in ("mean", "sq_dev")}, where)
        return cls(dict(counts), {k: tensors[f"mean.{k}"] for k in counts}, {k: tensors[f"sq_dev.{k}"] for k in counts},
                   meta_field(meta, "n_edits", int, where), meta_field(meta, "n_turns", int, where))


def pseudo_values(k_hat: torch.Tensor, g_hat: torch.Tensor, lr: float) -> torch.Tensor:
    """V = −η ‖k̂‖² ĝ per row (UltraEdit §3, calculating parameter shifts; reference ``predict_param_shifts``:
    ``coeffs = -lr * (hidden_states_hat ** 2).sum(-1)``, values ``coeffs * pesudo_values_hat``)."""
    return -lr * (k_hat * k_hat).sum(-1, keepdim=True) * g_hat


def ridge_update(keys: torch.Tensor, values: torch.Tensor, ridge: float = 1.0) -> torch.Tensor:
    """ΔW (out, in) = [(KᵀK + λI)⁻¹ Kᵀ V]ᵀ for keys K [n, in] and pseudo values V [n, out] (UltraEdit §3,
    calculating parameter shifts; reference ``torch.linalg.solve(KᵀK + I, Kᵀ V)``), float64.

    Solved in the n × n dual form Kᵀ(KKᵀ + λI)⁻¹V when there are fewer rows than inputs (the same matrix:
    (KᵀK + λI)Kᵀ = Kᵀ(KKᵀ + λI)), so a turn costs O(n²·in) instead of O(in³)."""
    keys, values = keys.double(), values.double()
    n, n_in = keys.shape
    if n < n_in:
        gram = keys @ keys.T + ridge * torch.eye(n, dtype=torch.float64, device=keys.device)
        return (keys.T @ torch.linalg.solve(gram, values)).T
    gram = keys.T @ keys + ridge * torch.eye(n_in, dtype=torch.float64, device=keys.device)
    return torch.linalg.solve(gram, keys.T @ values).T


def ridge_condition(keys: torch.Tensor, ridge: float = 1.0) -> float:
    """The 2-norm condition number of the solve's matrix KᵀK + λI (in × in) for keys K [n, in]: (σ₁² + λ) /
    (σ_in² + λ) from K's singular values, σ_in = 0 when n < in (KᵀK then has a null space and λ alone keeps the
    matrix invertible). How close a turn's solve is to singular: what NAS-style collapse analyses watch."""
    s = torch.linalg.svdvals(keys.double())
    smallest = float(s[-1]) ** 2 if keys.shape[0] >= keys.shape[1] else 0.0
    return (float(s[0]) ** 2 + ridge) / (smallest + ridge)


def answer_positions(batch: TokenBatch) -> list[tuple[int, int]]:
    """(row, position) of every position whose next-token prediction is an answer token: the context's last
    token through the answer's second-to-last (the reference's ``labels != -100`` positions, its labels being
    shifted by one)."""
    return [(r, p) for r, (c, n) in enumerate(zip(batch.context_lengths, batch.continuation_lengths, strict=True))
            for p in range(c - 1, c + n - 1)]


def _chunks(engine: ScoringEngine, pairs: list[tuple[str, str]]) -> list[list[int]]:
    """Requests per forward: rows stacked up to the engine's token budget (rows never attend to each other, so the
    features are those of one forward of all rows)."""
    lengths = [len(c) + len(t) for c, t in (engine.encode_pair(*p) for p in pairs)]
    chunks: list[list[int]] = []
    width = 0
    for i, n in enumerate(lengths):
        if chunks and (len(chunks[-1]) + 1) * max(width, n) <= engine.token_budget:
            chunks[-1].append(i)
            width = max(width, n)
        else:
            chunks.append([i])
            width = n
    return chunks


Target = tuple[int, str]
"""One edited matrix: (layer, MLP matrix name: gate, up or down)."""


def targets(hp: UltraEditHParams) -> list[Target]:
    """Every matrix a turn writes, layer by layer (each of ``modules`` at each of ``layers``, or at its own layer
    set)."""
    return hp.written()


def target_label(target: Target) -> int | str:
    """How diagnostics name a matrix: the layer alone for the down projection (as before ``modules`` existed),
    ``"L.gate"`` / ``"L.up"`` otherwise."""
    layer, matrix = target
    return layer if matrix == "down" else f"{layer}.{matrix}"


def turn_features(bundle, engine: ScoringEngine, requests: Sequence[EditRequest], where: Sequence[Target]
                  ) -> tuple[dict[Target, torch.Tensor], dict[Target, torch.Tensor], torch.Tensor, torch.Tensor,
                             float]:
    """Keys K [n, in] (the matrix's input) and output gradients G [n, out] per edited matrix at the answer positions
    of every request (rows in request order), from one forward and one backward of L = Σ_r −log P(o*_r | p_r)
    (UltraEdit §3, editing features); also each row's NLL, the index of the request each row belongs to, and L."""
    pairs = [(r.text, r.target_new) for r in requests]
    points = {t: tuple(p.replace("{i}", str(t[0])) for p in MATRIX_POINTS[t[1]]) for t in where}
    key_points = list(dict.fromkeys(k for k, _ in points.values()))
    out_points = list(dict.fromkeys(o for _, o in points.values()))
    keys: dict[Target, list[torch.Tensor]] = {t: [] for t in where}
    grads: dict[Target, list[torch.Tensor]] = {t: [] for t in where}
    row_nll: list[torch.Tensor] = []
    owner: list[int] = []
    chunk_sums: list[float] = []
    for chunk in _chunks(engine, pairs):
        batch = engine.prepare([pairs[i] for i in chunk])
        at = answer_positions(batch)
        rows = torch.tensor([r for r, _ in at], device=batch.input_ids.device)
        pos = torch.tensor([p for _, p in at], device=batch.input_ids.device)
        with torch.enable_grad(), capture(bundle.model, bundle.arch, key_points) as k_store, \
                capture(bundle.model, bundle.arch, out_points, grad=True) as g_store:
            hidden = engine.batch_hidden(batch)
            logits = engine.logits_from_hidden(hidden[rows, pos])
            logprobs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
            per_row = -logprobs.gather(-1, batch.input_ids[rows, pos + 1][:, None])[:, 0]
            per_row.sum().backward()
        row_nll.append(per_row.detach().double())
        chunk_sums.append(float(per_row.detach().sum()))
        owner += [chunk[r] for r, _ in at]
        for t, (kp, op) in points.items():
            keys[t].append(k_store[kp][rows, pos].detach().double())
            grads[t].append(g_store.grads[op][rows, pos].detach().double())
    return ({t: torch.cat(keys[t]) for t in where}, {t: torch.cat(grads[t]) for t in where},
            torch.cat(row_nll), torch.tensor(owner), sum(chunk_sums))


def compute(bundle, requests: Sequence[EditRequest], hp: UltraEditHParams, state: UltraEditState | None = None, *,
            engine: ScoringEngine, runtime: EditRuntime, extra_terms: Sequence[ObjectiveTerm] = ()
            ) -> tuple[dict[str, torch.Tensor], dict]:
    """One UltraEdit turn over ``requests``: features on the current weights, the normaliser updated with them
    (every edited matrix, layer by layer), then each matrix's ΔW from its normalised features; the model is
    unchanged on return (every ΔW comes from the same forward, as in the reference)."""
    state = state if state is not None else UltraEditState()
    switches = hp.switches()
    where = targets(hp)
    parts = {matrix: bundle.arch.matrix_part(matrix) for matrix in hp.modules}  # refuses a matrix the family lacks
    report(f"ultraedit: forward and backward of {len(requests)} request(s)")
    keys, grads, row_nll, owner, total = turn_features(bundle, engine, requests, where)
    n_rows = int(row_nll.numel())
    sub = owner // hp.sub_batch  # the sub-batch of each row (the reference's batches of sub_batch requests)
    if switches["loss"] == "subbatch_mean":
        # L_b = mean NLL over the sub-batch's answer tokens: each row's gradient is the summed loss's / T_b
        tokens = torch.bincount(sub).double()
        grads = {la: g / tokens[sub][:, None] for la, g in grads.items()}
        loss = float(sum(row_nll[sub == b].mean() for b in range(len(tokens))))
    else:
        loss = total
    # one normaliser per matrix shape: a gate and an up projection share theirs, as in the reference
    shapes = {t: shape_key(keys[t].shape[1], grads[t].shape[1]) for t in where}
    if switches["variance"] == "subbatch_unbiased":
        for b in range(int(sub.max()) + 1):
            for t in where:
                state.update(shapes[t], torch.cat([keys[t], grads[t]], -1)[sub == b], unbiased=True)
    else:
        for t in where:
            state.update(shapes[t], torch.cat([keys[t], grads[t]], -1))
    params = dict(bundle.model.named_parameters())
    deltas, norms, conds = {}, {}, {}
    for t in where:
        n_in = keys[t].shape[1]
        z_hat = state.normalise(shapes[t], torch.cat([keys[t], grads[t]], -1))
        values = pseudo_values(z_hat[:, :n_in], z_hat[:, n_in:], hp.lr)
        delta = ridge_update(keys[t], values, hp.ridge)
        name = bundle.arch.weight_name(t[0], parts[t[1]])
        deltas[name] = bundle.arch.from_out_in(delta.to(params[name].dtype)).contiguous()
        norms[target_label(t)] = float(delta.norm())
        conds[target_label(t)] = ridge_condition(keys[t], hp.ridge)
    state.n_edits += len(requests)
    state.n_turns += 1
    info = {"loss": loss, "answer_tokens": n_rows, "delta_norms": norms, "solve_cond": conds,
            "solve_cond_max": max(conds.values()),
            "normaliser_rows": {k: state.counts[k] for k in sorted(set(shapes.values()))},
            "turn": state.n_turns}
    return deltas, info
