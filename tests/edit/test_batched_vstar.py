"""Several requests' v*/z optimised in one batched forward per step (edit.objectives.optimise_deltas) against the
same requests optimised one at a time: δ and the editors' ΔW equal to 1e-5 relative, on
tiny-llama and tiny-gpt2, with one request stopping early while the others go on."""

from __future__ import annotations

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.context import context_templates
from editscope.edit.objectives import (
    VSpec,
    batch_groups,
    build_context,
    default_terms,
    independent_edits,
    optimise_delta,
    optimise_deltas,
)
from editscope.edit.plugins import attach
from editscope.lm.engine import ScoringEngine

REQUESTS = [
    EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
    EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch"),
    EditRequest("{} plays the", "Toko Yasuda", "piano", "guitar"),
]
STEPS = 10


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _engine(bundle, vstar_batch: int | None) -> tuple[ScoringEngine, list[str]]:
    engine = ScoringEngine(bundle)
    engine.vstar_batch = vstar_batch
    return engine, context_templates(engine, [[5, 3]], 0)


def _one_at_a_time(engine, templates, stop_loss: float, extra=()) -> list[tuple[torch.Tensor, list]]:
    out = []
    for request in REQUESTS:
        ctx = build_context(engine, request, templates, "blocks.1.mlp_out")
        delta = optimise_delta(ctx, default_terms(0.0625, 0.5) + list(extra), lr=0.5, steps=STEPS,
                               clamp_norm_factor=4.0, stop_loss=stop_loss)
        out.append((delta, [sum(h.values()) for h in ctx.store["losses"]]))
    return out


def _early_stop_threshold(histories: list[list[float]]) -> tuple[int, float]:
    """(request, stop_loss) such that this request's loss first falls below stop_loss in the middle of the run
    while every other request's loss stays above it (read off a run that never stops)."""
    c = min(range(len(histories)), key=lambda i: min(histories[i]))
    others = min(min(h) for i, h in enumerate(histories) if i != c)
    h = histories[c]
    for k in range(2, STEPS - 2):
        t = (min(h[:k]) + h[k]) / 2
        if h[k] < min(h[:k]) - 1e-3 and t < others - 1e-3:
            return c, t
    raise AssertionError(f"no early-stop threshold in these loss histories: {histories}")


@pytest.mark.parametrize(("family", "path"), [("llama", "fast"), ("gpt2", "fast"), ("llama", "full")])
def test_batched_deltas_equal_one_at_a_time_with_early_stop(tiny_bundles, family, path):
    engine, templates = _engine(tiny_bundles[family], None)
    engine.objective_path = path
    free = _one_at_a_time(engine, templates, stop_loss=-1.0)
    stopper, stop_loss = _early_stop_threshold([h for _, h in free])
    want = _one_at_a_time(engine, templates, stop_loss)
    assert len(want[stopper][1]) < STEPS - 1 and all(len(h) == STEPS for i, (_, h) in enumerate(want) if i != stopper)

    ctxs = [build_context(engine, r, templates, "blocks.1.mlp_out") for r in REQUESTS]
    assert batch_groups(ctxs, engine) == [[0, 1, 2]]  # one joint forward per step for all three
    got = optimise_deltas(ctxs, [default_terms(0.0625, 0.5) for _ in ctxs], lr=0.5, steps=STEPS,
                          clamp_norm_factor=4.0, stop_loss=stop_loss)
    for (delta, history), d, ctx in zip(want, got, ctxs, strict=True):
        assert _rel(d, delta) < 1e-5
        assert [sum(h.values()) for h in ctx.store["losses"]] == pytest.approx(history, rel=1e-5)
    # a batch of one is today's loop itself: bit-equal
    one = build_context(engine, REQUESTS[1], templates, "blocks.1.mlp_out")
    assert torch.equal(optimise_deltas([one], [default_terms(0.0625, 0.5)], lr=0.5, steps=STEPS,
                                       clamp_norm_factor=4.0, stop_loss=stop_loss)[0], want[1][0])


def test_batch_groups_follow_token_budget_and_cap(tiny_bundles):
    engine, templates = _engine(tiny_bundles["llama"], None)
    ctxs = [build_context(engine, r, templates, "blocks.1.mlp_out") for r in REQUESTS]
    tokens = [c.batch.input_ids.numel() for c in ctxs]
    engine.token_budget = max(tokens)  # no two fit together
    assert batch_groups(ctxs, engine) == [[0], [1], [2]]
    engine.token_budget = 10_000
    engine.vstar_batch = 2
    assert batch_groups(ctxs, engine) == [[0, 1], [2]]
    engine.vstar_batch = 1
    assert batch_groups(ctxs, engine) == [[0], [1], [2]]


def test_plugin_terms_force_one_at_a_time(tiny_bundles):
    """A plug-in term is outside BATCHED_TERMS: each request runs today's loop, so results are bit-equal."""
    import tests.edit.l2_plugin  # noqa: F401  (registers "l2")

    engine, templates = _engine(tiny_bundles["llama"], None)
    plugin = attach([("l2", {"weight": 0.01, "center": 0.1})])[0]
    want = _one_at_a_time(engine, templates, 0.05, [plugin.term()])
    ctxs = [build_context(engine, r, templates, "blocks.1.mlp_out") for r in REQUESTS]
    got = optimise_deltas(ctxs, [default_terms(0.0625, 0.5) + [plugin.term()] for _ in ctxs], lr=0.5, steps=STEPS,
                          clamp_norm_factor=4.0, stop_loss=0.05)
    assert all(torch.equal(d, w) for d, (w, _) in zip(got, want, strict=True))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rome_patches_of_a_single_mode_window_equal_one_at_a_time(tiny_bundles, family):
    bundle = tiny_bundles[family]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, context_templates=[[5, 3]])
    engine, _ = _engine(bundle, 1)
    want = [editor.compute_patch(bundle, r, hp, engine=engine).deltas for r in REQUESTS]
    engine, _ = _engine(bundle, 3)
    with independent_edits(engine, [[r] for r in REQUESTS]):
        window = engine.vstar_window
        got = [editor.compute_patch(bundle, r, hp, engine=engine).deltas for r in REQUESTS]
        assert len(window.solved) == 3  # all three v* came from the first edit's batched optimisation
        assert all(key[0].hook_point == f"blocks.{hp.layers[0]}.mlp_out" for key in window.solved)
    assert engine.vstar_window is None
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert all(_rel(g[k], w[k]) < 1e-5 for k in w)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_memit_batch_edit_z_batched_equal_one_at_a_time(tiny_bundles, family):
    bundle = tiny_bundles[family]
    editor = get_editor("memit")
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, context_templates=[[5, 3]])
    want = editor.compute_patch(bundle, REQUESTS, hp, engine=_engine(bundle, 1)[0])
    got = editor.compute_patch(bundle, REQUESTS, hp, engine=_engine(bundle, None)[0])
    assert want.deltas.keys() == got.deltas.keys()
    assert all(_rel(got.deltas[k], want.deltas[k]) < 1e-5 for k in want.deltas)
    assert _rel(got.info["vectors"]["z"], want.info["vectors"]["z"]) < 1e-5


def test_window_is_not_used_once_the_model_changed(tiny_bundles):
    """A window's δ belong to the model it opened on: with a patch applied, the edit optimises on its own."""
    bundle = tiny_bundles["llama"]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=3, context_templates=[[5, 3]])
    engine, templates = _engine(bundle, 3)
    with independent_edits(engine, [[r] for r in REQUESTS]):
        patch = editor.apply(bundle, REQUESTS[2], hp, engine=engine)  # fills the window for all three
        try:
            spec = VSpec.of(hp, f"blocks.{hp.layers[0]}.mlp_out", templates)
            before = engine.vstar_window.solved[(spec, REQUESTS[0])].delta
            on_edited = editor.compute_patch(bundle, REQUESTS[0], hp, engine=engine)
        finally:
            patch.revert(bundle)
    fresh = editor.compute_patch(bundle, REQUESTS[0], hp, engine=_engine(bundle, 1)[0])
    v_star = on_edited.info["vectors"]["v_star"][0]
    assert _rel(v_star, fresh.info["vectors"]["v_star"][0]) > 1e-3  # computed on the edited model, not taken
    assert before.norm() > 0


def test_runner_single_mode_window_rows_equal_one_at_a_time(tiny_bundles, tmp_path, monkeypatch):
    """``editscope run`` in mode single with EDITSCOPE_VSTAR_BATCH=3: the same rows (probes to 1e-5) as with 1."""
    from editscope.edit import objectives
    from editscope.run import Runner, parse_config, read_results
    from tests.run.helpers import SUITES, base_config

    joint = objectives._optimise_joint
    calls = []
    monkeypatch.setattr(objectives, "_optimise_joint", lambda ctxs, *a, **k: calls.append(len(ctxs)) or joint(
        ctxs, *a, **k))
    methods = [{"name": m, "overrides": {"v_steps": 4}} for m in ("rome", "memit")]
    rows = {}
    for n in ("1", "3"):
        monkeypatch.setenv("EDITSCOPE_VSTAR_BATCH", n)
        cfg = parse_config(base_config(methods=methods), suites=SUITES)
        Runner(cfg, out_dir=tmp_path / n, bundle=tiny_bundles["llama"], suite_factories=SUITES, progress=False,
               log=lambda _m: None).run()
        rows[n] = read_results(tmp_path / n / "results.jsonl")
    assert calls == [3, 3]  # with 3: one batched optimisation of the 3 cases per method; with 1: none
    assert len(rows["3"]) == len(rows["1"]) == 6
    for got, want in zip(rows["3"], rows["1"], strict=True):
        assert (got["case_id"], got["method"], got["pre"]) == (want["case_id"], want["method"], want["pre"])
        new = [c["logprob_sum"] for p in got["post"]["rewrite_es"]["prompts"] for c in p["candidates"]]
        old = [c["logprob_sum"] for p in want["post"]["rewrite_es"]["prompts"] for c in p["candidates"]]
        assert new == pytest.approx(old, rel=1e-5)
        assert new != [c["logprob_sum"] for p in got["pre"]["rewrite_es"]["prompts"] for c in p["candidates"]]
