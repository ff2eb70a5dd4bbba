"""The edit and patch commands end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from editscope.cli import main
from editscope.edit import Patch
from editscope.lm import load


def test_edit_json_and_patch_round_trip(tiny_bundles, tmp_path, capsys):
    patch_file = tmp_path / "p.safetensors"
    code = main(["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is a citizen of",
                 "--subject", "Danielle Darrieux", "--target", " Japan", "--target-true", " France",
                 "--check", "{} was born in", "--save-patch", str(patch_file), "--json", "--set", "v_steps=3"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "rome" and set(out["pre"]) == {"target", "target_true"}
    assert out["post"]["target"] != out["pre"]["target"] and len(out["checks"]) == 1
    assert out["checks"][0]["prompt"] == "Danielle Darrieux was born in"
    assert "natural log, summed over the answer's tokens" in out["units"]["pre"]  # units on every quick number
    assert set(out["units"]) == {"pre", "post", "answers", "checks", "seconds"}
    patch = Patch.load(patch_file)
    assert patch.hparams["v_steps"] == 3

    edited_dir, reverted_dir = tmp_path / "edited", tmp_path / "reverted"
    assert main(["patch", "apply", str(patch_file), "--model", "tiny-llama", "--out", str(edited_dir)]) == 0
    edited = load(str(edited_dir))
    base = tiny_bundles["llama"]
    name = next(iter(patch.deltas))
    base_w = dict(base.model.named_parameters())[name]
    assert torch.equal(dict(edited.model.named_parameters())[name].cpu(), base_w.cpu() + patch.deltas[name].cpu())
    assert main(["patch", "revert", str(patch_file), "--model", str(edited_dir), "--out", str(reverted_dir)]) == 0
    reverted = load(str(reverted_dir))
    assert all(torch.equal(p, dict(base.model.named_parameters())[n]) for n, p in reverted.model.named_parameters())
    capsys.readouterr()
    assert main(["patch", "info", str(patch_file), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["method"] == "rome" and info["fingerprint"] == base.fingerprint and info["has_base_weights"]
    assert info["parameters"][name]["fro_norm"] == pytest.approx(float(patch.deltas[name].double().norm()))


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["edit", "--model", "tiny-llama", "--prompt", "no slot", "--subject", "X", "--target", "Y"]) == 2
    assert "exactly one" in capsys.readouterr().err
    assert main(["edit", "--model", "tiny-llama", "--prompt", "{} is", "--subject", "X", "--target", "Y",
                 "--set", "bogus=1"]) == 2
    assert "key 'bogus'" in capsys.readouterr().err
    assert main(["patch", "info", str(tmp_path / "missing.safetensors")]) == 2
    assert "not found" in capsys.readouterr().err


def test_edit_generate_prints_greedy_text_before_and_after(tiny_bundles, tmp_path, capsys):
    """``--generate N``: greedy continuations of the edit prompt before and after, equal to the engine's own
    generation on the unedited model and on the model with the saved patch applied; the runtime is recorded."""
    from editscope.lm.engine import ScoringEngine

    patch_file = tmp_path / "p.safetensors"
    assert main(["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is a citizen of",
                 "--subject", "Danielle Darrieux", "--target", " Japan", "--generate", "6", "--json",
                 "--set", "v_steps=3", "--save-patch", str(patch_file), "--forward", "full"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runtime"] == {"forward": "full", "vstar_batch": "auto"}
    (row,) = out["generation"]
    bundle = tiny_bundles["llama"]
    engine = ScoringEngine(bundle)
    assert row["prompt"] == "Danielle Darrieux is a citizen of"
    assert row["pre"] == engine.generate([row["prompt"]], max_new_tokens=6)[0]
    patch = Patch.load(patch_file)
    patch.apply(bundle)
    try:
        assert row["post"] == engine.generate([row["prompt"]], max_new_tokens=6)[0]
    finally:
        patch.revert(bundle)
    assert main(["edit", "--model", "tiny-llama", "--prompt", "{} x", "--subject", "A", "--target", "B",
                 "--generate", "-1"]) == 2
    assert "--generate must be >= 0" in capsys.readouterr().err


def test_score_json_holds_the_rank(capsys):
    assert main(["score", "--model", "tiny-llama", "--prompt", "The capital of France is",
                 "--candidates", "Paris", "London", "Rome", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_sum = sorted(rows, key=lambda r: -r["logprob_sum"])
    assert [r["rank"] for r in by_sum] == [1, 2, 3]


def test_memory_and_context_edits_through_edit_patch_info_and_plan(tiny_bundles, tmp_path, capsys):
    """`editscope edit --save-patch` writes a memory or context edit; `patch info` describes it (no ΔW), `patch apply`
    refuses it in one line (no weight to write), and `plan` plans a memory and a context editor."""
    small = {"wise": ["--set", "n_iter=3", "irrelevant_pool=counterfact-train-sample", "context_templates=[[5,1]]"]}
    for method, kind in (("prompt", "context"), ("grace", "memory"), ("wise", "memory")):
        path = tmp_path / f"{method}.safetensors"
        assert main(["edit", "--model", "tiny-llama", "--method", method, "--prompt", "{} is a citizen of",
                     "--subject", "Danielle Darrieux", "--target", "Japan", "--save-patch", str(path),
                     "--no-progress", *small.get(method, [])]) == 0
        capsys.readouterr()
        assert main(["patch", "info", str(path), "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["kind"] == kind and info["method"] == method
        assert info["requests"][0]["target_new"] == "Japan"
        if kind == "context":
            assert info["holds"]["facts"] == ["Danielle Darrieux is a citizen of Japan."]
        elif method == "grace":
            assert info["holds"]["keys"][0] == 1 and info["holds"]["replacement"] == "answer"
        else:  # one side memory: the shard in progress, a copy of the down projection [d_out, d_in]
            assert info["holds"]["labels"] == ["shard"] and info["holds"]["thresholds"] == [1]
            assert main(["patch", "info", str(path)]) == 0
            # WISE's own derived layer: floor(27 * 4 / 32) = 3 of the tiny model's 4
            assert "side memory  1 at model.layers.3.mlp.down_proj: shard (ε " in capsys.readouterr().out
        assert main(["patch", "apply", str(path), "--model", "tiny-llama", "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert f"a {kind} edit ({method}) writes no weight" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--model", "tiny-llama", "--method", "grace", "--method", "ike"]) == 0
    out = capsys.readouterr().out
    assert "grace on layers 3 " in out and "\ncodebook " in out and "ike on no layer " in out
