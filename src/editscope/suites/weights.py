"""Weight drift of the edited matrices: why long chains of edits collapse, measured on the weights themselves.

For every parameter an applied patch edited (W now, W₀ the loaded, pre-edit weights, ΔW = W − W₀, the accumulated
update of a whole chain):

* ``DeltaNorm`` (mean over the edited matrices) and ``DeltaNormMax`` (max): ‖ΔW‖_F / ‖W₀‖_F, the relative size of
  the accumulated update;
* ``NormGrowth`` (mean): ‖W‖_F / ‖W₀‖_F. NAS (arXiv 2602.02543) ties the collapse of MEMIT-family editors over the
  whole CounterFact stream to the exponential growth of the edited weights' norm;
* ``DeltaSigma`` (max over matrices): σ₁(ΔW) / σ₁(W₀), the top singular value of the accumulated update against the
  pre-edit matrix's. PRUNE (Ma et al., ICLR 2025; a baseline of paper 004) restrains exactly the singular values of
  the accumulated ΔW that exceed σ₁(W₀): above 1, the update dominates the matrix's largest direction.

The curves of this suite also show ``SolveCond``, the condition number an editor reports of its own solve
(``edit_info["solve_cond_max"]``: UltraEdit's ridge solve KᵀK + λI, MEMIT's, PRUNE's and RECT's λC + KKᵀ,
AlphaEdit's and EVK-Edit's P(KKᵀ + K_pK_pᵀ) + L2·I; the MEMIT family computes it only when a run has this suite,
``EditRuntime.diagnostics``) for the rounds written since the previous checkpoint
(:attr:`~editscope.suites.base.Suite.edit_info_curves`), so conditioning and norm growth share one x-axis.

Every value is also kept per matrix in the probe (``probe["matrices"][name]``: ``delta``, ``norm``, ``sigma``), so a
report can plot one line per layer. Norms are computed in float64; σ₁ is ``torch.linalg.matrix_norm(ord=2)``.

The probe reads W₀ through :meth:`editscope.lm.bundle.Bundle.unpatched` (inside a lifelong chain these are the
pre-edit copies the folding bundle keeps, :meth:`~editscope.lm.bundle.Bundle.folded_originals`, swapped in; loose
patches are reverted and re-applied bit-exactly), so its cost is a few SVDs of the edited matrices (576 × 1536 on
SmolLM2): it does not grow with the number of edits. The unedited model (no patch applied) has every value 0 (and
``NormGrowth`` 1) over no matrix. Like ``general``, these are properties of the model, not of a case: one probe per
model, every case of it carries the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from editscope.data.records import Case
from editscope.lm.scorer import Scorer
from editscope.metrics.registry import MetricSpec
from editscope.suites.base import Suite

if TYPE_CHECKING:
    import torch

_NAS = "NAS (arXiv 2602.02543), norm growth of the edited weights"
_PRUNE = "PRUNE (Ma et al., ICLR 2025; paper 004's baseline), σ_max of the accumulated ΔW vs W₀'s"
_INF = (0.0, float("inf"))
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("DeltaNorm", _NAS, "mean over edited matrices of ‖W − W₀‖_F / ‖W₀‖_F", False, _INF, "ratio",
               pairing="post_only", headline=False,
               description="relative Frobenius size of the accumulated update, mean over the edited matrices"),
    MetricSpec("DeltaNormMax", _NAS, "max over edited matrices of ‖W − W₀‖_F / ‖W₀‖_F", False, _INF, "ratio",
               pairing="post_only", headline=False,
               description="relative Frobenius size of the accumulated update, largest edited matrix"),
    MetricSpec("NormGrowth", _NAS, "mean over edited matrices of ‖W‖_F / ‖W₀‖_F", None, _INF, "ratio",
               pairing="post_only", headline=False,
               description="Frobenius norm of the edited matrices relative to the unedited ones (1: unchanged)"),
    MetricSpec("DeltaSigma", _PRUNE, "max over edited matrices of σ₁(W − W₀) / σ₁(W₀)", False, _INF, "ratio",
               pairing="post_only", headline=False,
               description="top singular value of the accumulated update against the pre-edit matrix's"),
)

SOLVE_COND = MetricSpec(
    "SolveCond", "the editor's own solve (UltraEdit, Gu et al. TMLR 2026 §3: KᵀK + λI)",
    "max over the edited layers and the rounds since the previous checkpoint of κ₂ of the solve's matrix", False,
    (1.0, float("inf")), "ratio", pairing="post_only", headline=False,
    description="2-norm condition number of the editor's linear solve: how ill-posed its update is getting")


def matrix_drift(current: torch.Tensor, original: torch.Tensor) -> dict[str, float]:
    """``delta`` ‖W − W₀‖_F/‖W₀‖_F, ``norm`` ‖W‖_F/‖W₀‖_F and ``sigma`` σ₁(W − W₀)/σ₁(W₀) of one matrix (float64)."""
    import torch  # here, not at the top: the summary and the report import every suite and must not load torch

    w, w0 = current.detach().double(), original.detach().double()
    delta = w - w0
    if w0.dim() < 2:  # a vector (bias, norm weight): the spectral norm of a vector is its 2-norm
        w0, delta, w = w0.reshape(1, -1), delta.reshape(1, -1), w.reshape(1, -1)
    f0 = float(torch.linalg.matrix_norm(w0))
    s0 = float(torch.linalg.matrix_norm(w0, ord=2))
    return {"delta": float(torch.linalg.matrix_norm(delta)) / f0, "norm": float(torch.linalg.matrix_norm(w)) / f0,
            "sigma": float(torch.linalg.matrix_norm(delta, ord=2)) / s0}


class WeightDriftSuite(Suite):
    """Weight drift of the edited matrices: ‖ΔW‖/‖W₀‖, norm growth, σ₁(ΔW)/σ₁(W₀) (see the module docstring)."""

    name = "weights"
    chooses_edits = False  # the model as a whole: any block's edits
    edit_info_curves = {"solve_cond_max": SOLVE_COND}

    def __init__(self) -> None:
        self._measured: dict[str, dict[str, Any]] = {}  # weights fingerprint -> probe (the last few models)

    metrics_declared = METRICS

    @property
    def protocol(self) -> dict[str, str]:
        return {"name": "weights", "note": "every parameter an applied patch edits, against the loaded (pre-edit) "
                "weights, float64; σ₁ by torch.linalg.matrix_norm(ord=2); mean/max over the edited matrices"}

    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """One measurement of the weights as they are now, shared by every case."""
        bundle = engine.bundle  # type: ignore[attr-defined]
        fingerprint = bundle.fingerprint
        probe = self._measured.get(fingerprint)
        if probe is None:
            probe = {"matrices": measure(bundle)}
            self._measured = {k: v for k, v in list(self._measured.items())[-3:]} | {fingerprint: probe}
        return [probe for _ in cases]

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        return summarize(post["matrices"])


def measure(bundle: Any) -> dict[str, dict[str, float]]:
    """Per edited parameter name, :func:`matrix_drift` of its current value against the loaded weights (empty when no
    patch is applied)."""
    names = sorted({name for patch in bundle.applied for name in patch.names})
    if not names:
        return {}
    params = dict(bundle.model.named_parameters())
    current = {name: params[name].detach().clone() for name in names}
    with bundle.unpatched():
        return {name: matrix_drift(current[name], params[name]) for name in names}


def summarize(matrices: dict[str, dict[str, float]]) -> dict[str, float]:
    """The declared metrics from the per-matrix values (the unedited model: zeros, growth 1)."""
    if not matrices:
        return {"DeltaNorm": 0.0, "DeltaNormMax": 0.0, "NormGrowth": 1.0, "DeltaSigma": 0.0}
    values = list(matrices.values())
    return {"DeltaNorm": sum(v["delta"] for v in values) / len(values),
            "DeltaNormMax": max(v["delta"] for v in values),
            "NormGrowth": sum(v["norm"] for v in values) / len(values),
            "DeltaSigma": max(v["sigma"] for v in values)}


__all__ = ["METRICS", "SOLVE_COND", "WeightDriftSuite", "matrix_drift", "measure", "summarize"]
