"""Several requests' v*/z optimised in one batched forward per step (edit.objective.optimise) against the same
requests optimised one at a time by a plain loop written out here (full forward with a hook adding δ, Adam, clamp,
as the reference ``compute_v``): δ and the editors' ΔW equal to 1e-5 relative, on tiny-llama and tiny-gpt2, with
one request stopping early while the others go on."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.context import context_templates
from editscope.edit.objective import (
    FORWARDS,
    AdamSettings,
    Solved,
    VSpec,
    VStep,
    build_context,
    default_terms,
    independent_edits,
    optimisation_summary,
    optimise,
    request_groups,
    setup_terms,
)
from editscope.edit.plugins.evk_align import EvkAlign, EvkAlignHParams
from editscope.edit.runtime import EditRuntime, RuntimeSettings
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import hooks
from tests.edit.l2_plugin import L2Term

REQUESTS = [
    EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
    EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch"),
    EditRequest("{} plays the", "Toko Yasuda", "piano", "guitar"),
]
STEPS = 10
HOOK = "blocks.1.mlp_out"
#: the hparams a VSpec and the edit layers are made of: copied from one method's to another's, equal v* settings
VSTAR_FIELDS = ("layers", "v_lr", "v_steps", "clamp_norm_factor", "stop_loss", "kl_factor", "v_weight_decay",
                "context_templates")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def _engine(bundle) -> tuple[ScoringEngine, list[str]]:
    engine = ScoringEngine(bundle)
    return engine, context_templates(engine, [[5, 3]], 0)


def _plain_loop(engine, ctx, terms, stop_loss: float) -> tuple[torch.Tensor, list[float]]:
    """One request's δ by the loop of the reference ``compute_v``, written out: the whole model with a hook adding
    δ at the subject positions, Adam, ‖δ‖ clamped to 4‖v₀‖, stop when the loss < stop_loss."""
    with torch.no_grad():
        ctx.store["unedited_hidden"] = engine.batch_hidden(ctx.batch).detach()
    setup_terms(ctx, terms)
    device = engine.bundle.device
    delta = torch.zeros(ctx.v_init.shape[0], requires_grad=True, device=device)
    opt = torch.optim.Adam([delta], lr=0.5)
    rows = torch.arange(len(ctx.subject_positions), device=device)
    cols = torch.tensor(ctx.subject_positions, device=device)

    def add(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[rows, cols] += delta
        return x

    history = []
    for i in range(STEPS):
        opt.zero_grad()
        with torch.enable_grad(), hooks(engine.model, engine.arch, {HOOK: add}):
            hidden = engine.batch_hidden(ctx.batch)
            loss = sum(term(VStep(ctx, delta, hidden)) for term in terms)
        history.append(float(loss.detach()))
        if float(loss.detach()) < stop_loss or i == STEPS - 1:
            break
        loss.backward()
        opt.step()
        with torch.no_grad():
            if delta.norm() > 4.0 * ctx.v_init.norm():
                delta.mul_(4.0 * float(ctx.v_init.norm()) / delta.norm())
    return delta.detach().double(), history


def _one_at_a_time(engine, templates, stop_loss: float, extra=()) -> list[tuple[torch.Tensor, list]]:
    terms = default_terms(0.0625, 0.5) + list(extra)
    return [_plain_loop(engine, build_context(engine, r, templates, HOOK, terms=terms), terms, stop_loss)
            for r in REQUESTS]


def _settings(stop_loss: float) -> AdamSettings:
    return AdamSettings(lr=0.5, steps=STEPS, clamp_norm_factor=4.0, stop_loss=stop_loss)


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
    engine, templates = _engine(tiny_bundles[family])
    free = _one_at_a_time(engine, templates, stop_loss=-1.0)
    stopper, stop_loss = _early_stop_threshold([h for _, h in free])
    want = _one_at_a_time(engine, templates, stop_loss)
    assert len(want[stopper][1]) < STEPS - 1 and all(len(h) == STEPS for i, (_, h) in enumerate(want) if i != stopper)

    ctxs = [build_context(engine, r, templates, HOOK, forward=FORWARDS[path]) for r in REQUESTS]
    assert request_groups(ctxs, engine.token_budget) == [[0, 1, 2]]  # one joint forward per step for all three
    got = optimise(ctxs, [default_terms(0.0625, 0.5) for _ in ctxs], _settings(stop_loss),
                   token_budget=engine.token_budget)
    for (delta, history), d, ctx in zip(want, got, ctxs, strict=True):
        assert _rel(d, delta) < 1e-5
        assert [sum(h.values()) for h in ctx.store["losses"]] == pytest.approx(history, rel=1e-5)
    # a group of one is the same loop (n = 1)
    one = build_context(engine, REQUESTS[1], templates, HOOK, forward=FORWARDS[path])
    alone = optimise([one], [default_terms(0.0625, 0.5)], _settings(stop_loss), token_budget=engine.token_budget)
    assert _rel(alone[0], want[1][0]) < 1e-5


def test_optimisation_summary_counts_steps_and_capped_requests_of_the_plain_loop(tiny_bundles):
    """The rows' optimisation scalars, from the optimiser's histories, against the plain loop's own: steps
    evaluated per request, the share that used every step without reaching stop_loss, the final losses."""
    engine, templates = _engine(tiny_bundles["llama"])
    free = _one_at_a_time(engine, templates, stop_loss=-1.0)
    stopper, stop_loss = _early_stop_threshold([h for _, h in free])
    want = _one_at_a_time(engine, templates, stop_loss)
    ctxs = [build_context(engine, r, templates, HOOK) for r in REQUESTS]
    deltas = optimise(ctxs, [default_terms(0.0625, 0.5) for _ in ctxs], _settings(stop_loss),
                      token_budget=engine.token_budget)
    got = optimisation_summary([Solved(c.v_init, d, c.store["losses"]) for c, d in zip(ctxs, deltas, strict=True)],
                               _settings(stop_loss))
    lengths = [len(h) for _, h in want]
    assert got["v_steps_mean"] == pytest.approx(sum(lengths) / 3)
    assert got["v_step_capped"] == pytest.approx(2 / 3)  # every request but the one that stops early
    assert got["v_loss_final_mean"] == pytest.approx(sum(h[-1] for _, h in want) / 3, rel=1e-5)
    assert got["v_loss_final_max"] == pytest.approx(max(h[-1] for _, h in want), rel=1e-5)
    assert want[stopper][1][-1] < stop_loss <= min(h[-1] for i, (_, h) in enumerate(want) if i != stopper)


@pytest.mark.parametrize(("method", "stop_loss", "steps_mean", "capped"),
                         [("memit", 0.0, STEPS, 1.0), ("memit", 1e6, 1, 0.0), ("rome", 0.0, STEPS, 1.0)])
def test_editors_record_how_their_optimisation_went(tiny_bundles, method, stop_loss, steps_mean, capped):
    """A stop_loss of 0 (no loss is below it) runs every step (all capped); one every loss is under stops each
    request at its first evaluation: the patch's info (the rows' ``edit_info``) says so."""
    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, stop_loss=stop_loss, context_templates=[[5, 3]])
    info = editor.compute_patch(bundle, REQUESTS if method == "memit" else REQUESTS[0], hp).info
    assert info["v_steps_mean"] == steps_mean and info["v_step_capped"] == capped
    assert len(info["requests"]) == (3 if method == "memit" else 1)
    assert info["v_loss_final_max"] >= info["v_loss_final_mean"] > 0


def test_request_groups_follow_token_budget_and_cap(tiny_bundles):
    engine, templates = _engine(tiny_bundles["llama"])
    ctxs = [build_context(engine, r, templates, HOOK) for r in REQUESTS]
    tokens = [c.batch.input_ids.numel() for c in ctxs]
    assert request_groups(ctxs, max(tokens)) == [[0], [1], [2]]  # no two fit together
    assert request_groups(ctxs, 10_000, 2) == [[0, 1], [2]]
    assert request_groups(ctxs, 10_000, 1) == [[0], [1], [2]]


@dataclass
class _UnbatchedL2(L2Term):
    """The l2 term declared not batched (as a plug-in that runs forwards of its own would be)."""

    batched: bool = False


def _group_sizes(monkeypatch) -> list[int]:
    optimise_module = sys.modules["editscope.edit.objective.optimise"]  # the package's `optimise` is the function
    sizes: list[int] = []
    group = optimise_module._optimise_group
    monkeypatch.setattr(optimise_module, "_optimise_group", lambda c, *a: sizes.append(len(c)) or group(c, *a))
    return sizes


@pytest.mark.parametrize("batched", [True, False])
def test_plugin_terms_batch_as_declared(tiny_bundles, monkeypatch, batched):
    """A plug-in term declared ``batched`` shares the requests' one forward per step; one that is not runs one
    request at a time. Either way δ equals the plain loop's."""
    engine, templates = _engine(tiny_bundles["llama"])
    term = L2Term(0.01, 0.1) if batched else _UnbatchedL2(0.01, 0.1)
    want = _one_at_a_time(engine, templates, 0.05, [term])
    sizes = _group_sizes(monkeypatch)
    ctxs = [build_context(engine, r, templates, HOOK) for r in REQUESTS]
    got = optimise(ctxs, [default_terms(0.0625, 0.5) + [term] for _ in ctxs], _settings(0.05),
                   token_budget=engine.token_budget)
    assert sizes == ([3] if batched else [1, 1, 1])
    assert all(_rel(d, w) < 1e-5 for d, (w, _) in zip(got, want, strict=True))


@pytest.mark.parametrize(("family", "path"), [("llama", "fast"), ("gpt2", "fast"), ("llama", "full")])
def test_evk_align_batches_across_requests(tiny_bundles, monkeypatch, family, path):
    """EVK-Align's perturbed copies are rows of the main batch: three requests optimise together in one forward
    per step, each δ equal to its plain loop alone (the copies in the whole model's forward with δ hooked in)."""
    engine, templates = _engine(tiny_bundles[family])
    term = EvkAlign(EvkAlignHParams(sigma=0.5, lam=2.0, n=3, k1=5, k2=20, switch_step=3))
    want = _one_at_a_time(engine, templates, -1.0, [term])
    sizes = _group_sizes(monkeypatch)
    terms = default_terms(0.0625, 0.5) + [term]
    ctxs = [build_context(engine, r, templates, HOOK, forward=FORWARDS[path], terms=terms) for r in REQUESTS]
    got = optimise(ctxs, [terms for _ in ctxs], _settings(-1.0), token_budget=engine.token_budget)
    assert sizes == [3]
    for (delta, history), d, ctx in zip(want, got, ctxs, strict=True):
        assert _rel(d, delta) < 1e-5
        assert [sum(h.values()) for h in ctx.store["losses"]] == pytest.approx(history, rel=1e-5)
        assert max(h["evk_align"] for h in ctx.store["losses"]) > 1e-4  # the term acted


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rome_patches_of_a_single_mode_window_equal_one_at_a_time(tiny_bundles, family):
    bundle = tiny_bundles[family]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, context_templates=[[5, 3]])
    alone = EditRuntime(RuntimeSettings(vstar_batch=1))
    want = [editor.compute_patch(bundle, r, hp, runtime=alone).deltas for r in REQUESTS]
    runtime = EditRuntime(RuntimeSettings(vstar_batch=3))
    with independent_edits(runtime, bundle.fingerprint, [[r] for r in REQUESTS]):
        window = runtime.window
        got = [editor.compute_patch(bundle, r, hp, runtime=runtime).deltas for r in REQUESTS]
        assert len(window.solved) == 3  # all three v* came from the first edit's batched optimisation
        assert all(key[0].hook_point == f"blocks.{hp.layers[0]}.mlp_out" for key in window.solved)
    assert runtime.window is None
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert all(_rel(g[k], w[k]) < 1e-5 for k in w)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_evk_edit_patches_of_a_single_mode_window_equal_one_at_a_time(tiny_bundles, family):
    """EVK-Align is declared batched, so EVK-Edit's edits share a window: the first edit optimises the z of all
    three cases with the term on, and each patch equals the edit alone. AlphaEdit in the same window has the same
    v* settings but not the term, so it takes none of EVK-Edit's z."""
    bundle = tiny_bundles[family]
    evk, alpha = get_editor("evk_edit"), get_editor("alphaedit")
    hp = evk.load_hparams(bundle).replace(v_steps=STEPS, context_templates=[[5, 3]], evk_sigma=0.5, evk_lam=2.0)
    alpha_hp = alpha.load_hparams(bundle).replace(**{f: getattr(hp, f) for f in VSTAR_FIELDS})
    one = EditRuntime(RuntimeSettings(vstar_batch=1))
    want = [evk.compute_patch(bundle, r, hp, runtime=one).deltas for r in REQUESTS]
    runtime = EditRuntime(RuntimeSettings(vstar_batch=3))
    with independent_edits(runtime, bundle.fingerprint, [[r] for r in REQUESTS]):
        window = runtime.window
        got = [evk.compute_patch(bundle, r, hp, runtime=runtime).deltas for r in REQUESTS]
        assert len(window.solved) == 3 and {terms for _, terms, _ in window.solved} == {(EvkAlign(hp.align()),)}
        alpha.compute_patch(bundle, REQUESTS[0], alpha_hp, runtime=runtime)
        assert len(window.solved) == 6 and len({spec for spec, _, _ in window.solved}) == 1
        assert {terms for _, terms, _ in window.solved} == {(EvkAlign(hp.align()),), ()}
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert all(_rel(g[k], w[k]) < 1e-5 for k in w)
    assert EvkAlign(hp.align()) != EvkAlign(hp.replace(evk_lam=1.0).align())


def test_methods_with_equal_evk_align_plugins_share_a_window(tiny_bundles):
    """MEMIT and PRUNE with the same EVK-Align settings (each edit attaching its own plug-in instance) take one z per
    case from the window; other settings optimise their own."""
    bundle = tiny_bundles["llama"]
    memit, prune = get_editor("memit"), get_editor("prune")
    hp = memit.load_hparams(bundle).replace(v_steps=3, context_templates=[[5, 3]])
    prune_hp = prune.load_hparams(bundle).replace(**{f: getattr(hp, f) for f in VSTAR_FIELDS})
    align = {"sigma": 0.5, "lam": 2.0, "n": 2}
    runtime = EditRuntime(RuntimeSettings(vstar_batch=3))
    with independent_edits(runtime, bundle.fingerprint, [[r] for r in REQUESTS]):
        memit.compute_patch(bundle, REQUESTS[0], hp, runtime=runtime, plugins=[("evk_align", dict(align))])
        assert len(runtime.window.solved) == 3
        prune.compute_patch(bundle, REQUESTS[1], prune_hp, runtime=runtime, plugins=[("evk_align", dict(align))])
        assert len(runtime.window.solved) == 3  # PRUNE took its z from MEMIT's optimisation
        prune.compute_patch(bundle, REQUESTS[1], prune_hp, runtime=runtime,
                            plugins=[("evk_align", {**align, "lam": 1.0})])
        assert len(runtime.window.solved) == 6


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_memit_batch_edit_z_batched_equal_one_at_a_time(tiny_bundles, family):
    bundle = tiny_bundles[family]
    editor = get_editor("memit")
    hp = editor.load_hparams(bundle).replace(v_steps=STEPS, context_templates=[[5, 3]])
    want = editor.compute_patch(bundle, REQUESTS, hp, runtime=EditRuntime(RuntimeSettings(vstar_batch=1)))
    got = editor.compute_patch(bundle, REQUESTS, hp, runtime=EditRuntime())
    assert want.deltas.keys() == got.deltas.keys()
    assert all(_rel(got.deltas[k], want.deltas[k]) < 1e-5 for k in want.deltas)
    assert _rel(got.info["vectors"]["z"], want.info["vectors"]["z"]) < 1e-5


def test_window_is_not_used_once_the_model_changed(tiny_bundles):
    """A window's δ belong to the model it opened on: with a patch applied, the edit optimises on its own."""
    bundle = tiny_bundles["llama"]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle).replace(v_steps=3, context_templates=[[5, 3]])
    runtime = EditRuntime(RuntimeSettings(vstar_batch=3))
    with independent_edits(runtime, bundle.fingerprint, [[r] for r in REQUESTS]):
        patch = editor.apply(bundle, REQUESTS[2], hp, runtime=runtime)  # fills the window for all three
        try:
            templates = patch.info["templates"]
            spec = VSpec.of(hp, f"blocks.{hp.layers[0]}.mlp_out", templates)
            before = runtime.window.solved[(spec, (), REQUESTS[0])].delta
            on_edited = editor.compute_patch(bundle, REQUESTS[0], hp, runtime=runtime)
        finally:
            patch.revert(bundle)
    fresh = editor.compute_patch(bundle, REQUESTS[0], hp, runtime=EditRuntime(RuntimeSettings(vstar_batch=1)))
    v_star = on_edited.info["vectors"]["v_star"][0]
    assert _rel(v_star, fresh.info["vectors"]["v_star"][0]) > 1e-3  # computed on the edited model, not taken
    assert before.norm() > 0


def test_runner_single_mode_window_rows_equal_one_at_a_time(tiny_bundles, tmp_path, monkeypatch):
    """``editscope run`` in mode single with runtime vstar_batch 3: the same rows (probes to 1e-5) as with 1."""
    optimise_module = sys.modules["editscope.edit.objective.optimise"]  # the package's `optimise` is the function
    from editscope.run import Runner, parse_config, read_results
    from tests.run.helpers import SUITES, base_config

    group = optimise_module._optimise_group
    calls = []
    monkeypatch.setattr(optimise_module, "_optimise_group", lambda ctxs, *a: calls.append(len(ctxs)) or group(
        ctxs, *a))
    methods = [{"name": m, "overrides": {"v_steps": 4}} for m in ("rome", "memit", "evk_edit")]
    rows = {}
    for n in (1, 3):
        cfg = parse_config(base_config(methods=methods, runtime={"vstar_batch": n}), suites=SUITES)
        Runner(cfg, out_dir=tmp_path / str(n), bundle=tiny_bundles["llama"], suite_factories=SUITES, progress=False,
               log=lambda _m: None).run()
        rows[n] = read_results(tmp_path / str(n) / "results.jsonl")
    assert [c for c in calls if c > 1] == [3, 3, 3]  # with 3: one batched optimisation of the 3 cases per method
    assert len(rows[3]) == len(rows[1]) == 9
    for got, want in zip(rows[3], rows[1], strict=True):
        assert got["runtime"]["vstar_batch"] == 3 and want["runtime"]["vstar_batch"] == 1
        assert (got["case_id"], got["method"], got["pre"]) == (want["case_id"], want["method"], want["pre"])
        new = [c["logprob_sum"] for p in got["post"]["rewrite_es"]["prompts"] for c in p["candidates"]]
        old = [c["logprob_sum"] for p in want["post"]["rewrite_es"]["prompts"] for c in p["candidates"]]
        assert new == pytest.approx(old, rel=1e-5)
        assert new != [c["logprob_sum"] for p in got["pre"]["rewrite_es"]["prompts"] for c in p["candidates"]]
