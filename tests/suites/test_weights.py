"""The weights suite: drift of the edited matrices against an independent computation.

Through the real Runner (a lifelong chain with a checkpoint every round, UltraEdit on tiny-llama), each checkpoint's
DeltaNorm/NormGrowth/DeltaSigma must equal numpy's norms and SVD of W₀ + the sum of the patches saved so far; the
unedited model's probe is zeros over no matrix; the probe leaves the weights bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from editscope.edit.patch import Patch, tensor_checksum
from editscope.run import Runner, parse_config, read_results
from editscope.run.suites import live_facts
from editscope.suites import get_suite
from editscope.suites.weights import matrix_drift, summarize


@pytest.fixture(scope="module")
def tiny_llama():
    from editscope.lm import load

    return load("tiny-llama")


def weights(bundle) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in bundle.model.named_parameters()}


def numpy_drift(w: np.ndarray, w0: np.ndarray) -> dict[str, float]:
    d = w - w0
    return {"delta": np.linalg.norm(d) / np.linalg.norm(w0), "norm": np.linalg.norm(w) / np.linalg.norm(w0),
            "sigma": np.linalg.svd(d, compute_uv=False)[0] / np.linalg.svd(w0, compute_uv=False)[0]}


def test_matrix_drift_equals_numpy_on_random_matrices():
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(24, 40, generator=g)
    w = w0 + 0.3 * torch.randn(24, 1, generator=g) @ torch.randn(1, 40, generator=g)  # a rank-one update
    got, want = matrix_drift(w, w0), numpy_drift(w.double().numpy(), w0.double().numpy())
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-10)
    assert matrix_drift(w0, w0) == {"delta": 0.0, "norm": 1.0, "sigma": 0.0}
    # doubling W: ΔW = W₀, so every ratio is exactly 1 (growth 2)
    assert matrix_drift(2 * w0, w0) == pytest.approx({"delta": 1.0, "norm": 2.0, "sigma": 1.0}, rel=1e-12)


def test_summary_means_and_maxima_and_the_unedited_model():
    m = {"a": {"delta": 0.1, "norm": 1.0, "sigma": 0.5}, "b": {"delta": 0.3, "norm": 1.2, "sigma": 0.2}}
    assert summarize(m) == pytest.approx({"DeltaNorm": 0.2, "DeltaNormMax": 0.3, "NormGrowth": 1.1,
                                          "DeltaSigma": 0.5})
    assert summarize({}) == {"DeltaNorm": 0.0, "DeltaNormMax": 0.0, "NormGrowth": 1.0, "DeltaSigma": 0.0}
    assert live_facts("weights").whole_model


def test_a_loose_patch_is_measured_and_the_weights_come_back_bit_exact(tiny_llama):
    from editscope.lm.engine import ScoringEngine

    engine = ScoringEngine(tiny_llama)
    suite = get_suite("weights")
    before = weights(tiny_llama)
    assert suite.probe_many(engine, [None, None]) == [{"matrices": {}}] * 2  # type: ignore[list-item]
    name = "model.layers.1.mlp.down_proj.weight"
    w0 = before[name]
    delta = 0.05 * torch.outer(torch.linspace(-1, 1, w0.shape[0]), torch.linspace(0, 2, w0.shape[1]))
    patch = Patch({name: delta}, "manual", {}, tiny_llama.fingerprint, {name: tensor_checksum(w0)})
    patch.apply(tiny_llama)
    try:
        edited = weights(tiny_llama)
        probe = suite.probe(engine, None)  # type: ignore[arg-type]
        assert weights(tiny_llama).keys() == edited.keys()
        assert all(torch.equal(edited[k], v) for k, v in weights(tiny_llama).items())  # unpatched() put them back
        want = numpy_drift(edited[name].double().numpy(), w0.double().numpy())
        assert list(probe["matrices"]) == [name]
        for key in want:
            assert probe["matrices"][name][key] == pytest.approx(want[key], rel=1e-9)
        row = suite.checked_metrics(None, {"matrices": {}}, probe)  # type: ignore[arg-type]
        assert row["DeltaSigma"] == pytest.approx(want["sigma"], rel=1e-9) and row["DeltaSigma"] > 0
    finally:
        patch.revert(tiny_llama)
    assert all(torch.equal(before[k], v) for k, v in weights(tiny_llama).items())


def test_checkpoint_values_equal_the_saved_patches_summed_onto_w0(tmp_path, tiny_llama):
    config = parse_config({
        "model": "tiny-llama", "seed": 0, "save_patches": True, "methods": ["ultraedit"],
        "mode": {"sequential_batches": {"batch": 3, "rounds": 3, "checkpoints": 1}},
        "dataset": "counterfact-sample", "slice": {"limit": 9}, "suites": ["counterfact", "weights"]}, where="test")
    w0 = weights(tiny_llama)
    Runner(config, out_dir=tmp_path, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    assert all(torch.equal(w0[k], v) for k, v in weights(tiny_llama).items())
    rows = read_results(tmp_path / "results.jsonl")
    patches = [Patch.load(tmp_path / "patches" / "ultraedit" / f"counterfact-sample-g00000-{k}.safetensors")
               for k in range(3)]
    by_edits = {r["edits_applied"]: r for r in rows if r.get("checkpoint")} | \
        {r["edits_applied"]: r for r in rows if not r.get("checkpoint")}
    assert sorted(by_edits) == [3, 6, 9]
    growth = []
    for k, applied in enumerate((3, 6, 9)):
        deltas: dict[str, torch.Tensor] = {}
        for p in patches[:k + 1]:
            for name, d in p.deltas.items():
                deltas[name] = deltas.get(name, 0) + d.double()
        want = {name: numpy_drift((w0[name].double() + d).numpy(), w0[name].double().numpy())
                for name, d in deltas.items()}
        row = by_edits[applied]
        assert sorted(row["post"]["weights"]["matrices"]) == sorted(want)
        metrics = row["metrics"]["weights"]
        assert metrics["DeltaNorm"] == pytest.approx(np.mean([v["delta"] for v in want.values()]), rel=1e-5)
        assert metrics["DeltaNormMax"] == pytest.approx(max(v["delta"] for v in want.values()), rel=1e-5)
        assert metrics["NormGrowth"] == pytest.approx(np.mean([v["norm"] for v in want.values()]), rel=1e-6)
        assert metrics["DeltaSigma"] == pytest.approx(max(v["sigma"] for v in want.values()), rel=1e-5)
        assert row["pre"]["weights"] == {"matrices": {}}  # the unedited model
        growth.append(metrics["DeltaNorm"])
        # every case of one probe carries the same numbers
        assert {r["metrics"]["weights"]["DeltaNorm"] for r in rows if r["edits_applied"] == applied} == {
            metrics["DeltaNorm"]}
    assert growth[0] > 0


def test_a_run_with_the_weights_suite_has_memit_report_its_solve_condition(tmp_path, tiny_llama):
    """The runner turns the editors' diagnostics on only for a run that shows them: MEMIT's rows then carry the
    condition number of their round's solve (its value: tests/edit/test_editors.py), a run without the suite not."""
    rows = {}
    for suites in (["counterfact", "weights"], ["counterfact"]):
        config = parse_config({
            "model": "tiny-llama", "seed": 0, "methods": ["memit"],
            "mode": {"sequential_batches": {"batch": 2, "rounds": 2, "checkpoints": 1}},
            "dataset": "counterfact-sample", "slice": {"limit": 4}, "suites": suites}, where="test")
        out = tmp_path / "-".join(suites)
        Runner(config, out_dir=out, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
        rows[len(suites)] = [r for r in read_results(out / "results.jsonl") if not r.get("checkpoint")]
    assert len(rows[2]) == 4 and all(r["edit_info"]["solve_cond_max"] > 1.0 for r in rows[2])
    # one value per round: a row carries the info of the round that edited its case
    assert len({r["edit_info"]["solve_cond_max"] for r in rows[2]}) == 2
    assert len(rows[1]) == 4 and not any("solve_cond_max" in r["edit_info"] for r in rows[1])
