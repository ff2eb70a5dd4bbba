"""Progress bars of the long locating loops: each writes a tqdm bar to stderr when on, nothing when off, and the
numbers are the same either way."""

from __future__ import annotations

import json

import numpy as np
import pytest

from editscope.lm.engine import ScoringEngine
from editscope.locate.attribution import knowledge_neurons
from editscope.locate.causal_trace import trace
from editscope.locate.layers import layer_curve
from editscope.locate.prompt import encode_prompt

FACT = ("{} is located in", "Eiffel Tower", " Paris")


@pytest.fixture(scope="module")
def engine(tiny_bundles):
    return ScoringEngine(tiny_bundles["llama"])


def _both(capsys, fn):
    """(result, stderr) with progress on, then with it off."""
    capsys.readouterr()
    on = fn(True), capsys.readouterr().err
    off = fn(False), capsys.readouterr().err
    return on, off


def test_causal_trace_bar(engine, capsys):
    prompt = encode_prompt(engine, *FACT)
    (on, err_on), (off, err_off) = _both(capsys, lambda p: trace(engine, prompt, kinds=("mlp",), samples=2,
                                                               progress=p))
    n_restores = engine.bundle.n_layers * len(prompt.ids)
    assert "causal trace" in err_on and f"/{n_restores} " in err_on and "restore" in err_on
    assert err_off == ""
    np.testing.assert_array_equal(on.states["mlp"], off.states["mlp"])
    np.testing.assert_array_equal(on.neurons, off.neurons)
    assert on.meta == off.meta


def test_knowledge_neurons_bar(engine, capsys):
    prompt = encode_prompt(engine, *FACT)
    # token_budget=4 with 4 steps: one layer per forward/backward, so the bar moves once per layer
    (on, err_on), (off, err_off) = _both(capsys, lambda p: knowledge_neurons(engine, prompt, steps=4, token_budget=4,
                                                                           progress=p))
    assert "integrated gradients (4 steps)" in err_on and f"/{engine.bundle.n_layers} " in err_on
    assert err_off == ""
    np.testing.assert_array_equal(on.neurons, off.neurons)
    assert on.meta == off.meta


def test_layer_curve_bar(engine, capsys):
    facts = [("{} is located in", s, " Paris") for s in ("Eiffel Tower", "Big Ben", "Colosseum")]
    (on, err_on), (off, err_off) = _both(capsys, lambda p: layer_curve(engine, facts, samples=2, window=1,
                                                                     known_only=False, progress=p))
    assert "layer curve (mlp)" in err_on and "3/3" in err_on
    assert err_off == ""
    np.testing.assert_array_equal(on.effect, off.effect)
    np.testing.assert_array_equal(on.normalised, off.normalised)
    assert on.facts == off.facts and on.n_facts == 3


def test_locate_command_bar_and_no_progress(capsys):
    from editscope.cli import main

    argv = ["locate", "--model", "tiny-llama", "--prompt", FACT[0], "--subject", FACT[1], "--answer", FACT[2],
            "--samples", "2", "--json"]
    capsys.readouterr()
    assert main(argv) == 0
    out_on, err_on = capsys.readouterr()
    assert main([*argv, "--no-progress"]) == 0
    out_off, err_off = capsys.readouterr()
    assert "causal trace" in err_on and "restore" in err_on
    assert "causal trace" not in err_off
    assert json.loads(out_on) == json.loads(out_off)


def _examples(folder):
    """A bench folder with its examples already chosen (one per subset): the run skips building KLoB."""
    from dataclasses import asdict

    from editscope.data.klob_build import KlobExample, KlobPrompt

    rows = [KlobExample("c", "c0", "P17", (KlobPrompt(*FACT), KlobPrompt("{} stands in", FACT[1], FACT[2])), "t"),
            KlobExample("r", "r0", "P17", (KlobPrompt("{} is in", "Big Ben", " London"),
                                           KlobPrompt("{} is the capital of", "London", " England")), "t"),
            KlobExample("u", "u0", "-", (KlobPrompt("{} likes", "Colosseum", None),), "t")]
    folder.mkdir()
    (folder / "examples.jsonl").write_text("".join(json.dumps(asdict(e)) + "\n" for e in rows))
    return folder


def test_klob_bench_bar(tmp_path, capsys):
    from editscope.cli import main

    argv = ["bench", "klob", "--model", "tiny-llama", "--methods", "causal_trace", "kn", "activation",
            "--samples", "2", "--steps", "2", "--k", "10"]
    capsys.readouterr()
    assert main([*argv, "-o", str(_examples(tmp_path / "on"))]) == 0
    err_on = capsys.readouterr().err
    assert main([*argv, "-o", str(_examples(tmp_path / "off")), "--no-progress"]) == 0
    err_off = capsys.readouterr().err
    assert "KLoB bench" in err_on and "/9 " in err_on  # one bar over 3 examples x 3 methods
    assert "KLoB bench" not in err_off
    for name in ("causal trace", "integrated gradients"):  # the methods' own bars stay off under the bench's
        assert name not in err_on
    assert (tmp_path / "on" / "metrics.json").read_text() == (tmp_path / "off" / "metrics.json").read_text()
    files = {d: sorted((tmp_path / d / "scores").rglob("*.npy")) for d in ("on", "off")}
    assert len(files["on"]) == 9
    for on, off in zip(files["on"], files["off"], strict=True):
        assert on.relative_to(tmp_path / "on") == off.relative_to(tmp_path / "off")
        assert on.read_bytes() == off.read_bytes()
    # a resumed run counts the finished units as done
    assert main([*argv, "-o", str(tmp_path / "on")]) == 0
    assert "9/9" in capsys.readouterr().err
