"""Extending editscope as a user would: ``tests/run/extension_example.py`` defines an editor (half_rome), a
plug-in (ridge), a metric (p_new), a suite (p_new) and an evaluation protocol (said), each registered with one
line, and a run config names that module in ``plugin_modules`` and nothing else. The run goes through the runner on
tiny-llama; every number is checked against an independent computation (ROME's own patch, the plug-in attached to
ROME directly, the engine's scores before and after applying the saved patch, a plain greedy loop). Every kind then
goes through the report, the edit card (the card's metrics must be the run's rows) and, for the editor with its
plug-in and for the added family, ``tune``."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from editscope.data import load_cases
from editscope.edit.context import mlp_out_of_keys
from editscope.edit.hparams import shipped_hparams_path
from editscope.edit.patch import Patch
from editscope.edit.plugins import PLUGINS
from editscope.edit.registry import EDITORS, get_editor, register_editor
from editscope.errors import EditscopeError
from editscope.lm import load
from editscope.lm.archs import ARCHS, arch_for_config
from editscope.lm.engine import ScoringEngine
from editscope.run import Runner, parse_config
from editscope.suites import SUITES

MODULE = "tests.run.extension_example"
WEIGHT = 1.0
OVERRIDES = {"v_steps": 3}
N_CASES = 2
REGISTERED = ((EDITORS, "half_rome"), (EDITORS, "quoted"), (EDITORS, "doubled"), (PLUGINS, "ridge"), (SUITES, "p_new"),
              (SUITES, "said"), (ARCHS, "olmo"))


def config_data(rome_hparams: str) -> dict:
    return {"model": "tiny-llama", "plugin_modules": [MODULE], "save_patches": True,
            "methods": [{"name": "half_rome", "hparams": rome_hparams, "overrides": OVERRIDES,
                         "plugins": [{"name": "ridge", "weight": WEIGHT}]}],
            "dataset": "counterfact", "slice": {"limit": N_CASES}, "suites": ["p_new", "said"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_llama):
    """The run, with the example module first imported by the config (registries restored afterwards)."""
    rome_hparams = str(shipped_hparams_path("rome", "tiny-llama"))
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, MODULE, raising=False)
        for registry, name in REGISTERED:
            mp.delitem(registry, name, raising=False)
        assert "half_rome" not in EDITORS and "p_new" not in SUITES
        cfg = parse_config(config_data(rome_hparams), where="ext.yaml")  # imports MODULE: it registers all four
        assert "half_rome" in EDITORS and "ridge" in PLUGINS and "p_new" in SUITES
        out = tmp_path_factory.mktemp("extension")
        Runner(cfg, out_dir=out, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
        rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        try:
            yield {"out": out, "rows": rows, "rome_hparams": rome_hparams}
        finally:  # what the module registered goes too: later tests see the shipped registries only
            for registry, name in REGISTERED:
                registry.pop(name, None)
            sys.modules.pop(MODULE, None)


def saved_patch(run, row) -> Patch:
    return Patch.load(run["out"] / "patches" / row["method"] / f"{row['dataset']}-g{row['group']:05d}-0.safetensors")


def rows_by_case(run) -> list[tuple[dict, object]]:
    cases = {c.case_id: c for c in load_cases("counterfact", limit=N_CASES)}
    assert sorted(r["case_id"] for r in run["rows"]) == sorted(cases)
    return [(row, cases[row["case_id"]]) for row in run["rows"]]


def test_rows_name_the_editor_and_record_the_plugin(run):
    assert len(run["rows"]) == N_CASES
    for row in run["rows"]:
        assert row["method"] == "half_rome+ridge" and row["method_display"] == "HalfROME+Ridge"
        assert row["editor"] == "half_rome" and row["plugins"] == [{"name": "ridge", "weight": WEIGHT}]
    stored = json.loads((run["out"] / "run.json").read_text())["metrics"]
    assert stored[0]["suite"] == "p_new" and [m["name"] for m in stored[0]["metrics"]] == ["p_new"]
    assert stored[1]["suite"] == "said" and [m["name"] for m in stored[1]["metrics"]] == ["said"]


def test_half_rome_delta_w_is_half_of_rome_with_the_same_plugin(run, tiny_llama):
    rome = get_editor("rome")
    hp = rome.load_hparams(tiny_llama, run["rome_hparams"], OVERRIDES)
    for row, case in rows_by_case(run):
        got = saved_patch(run, row)
        assert got.method == "half_rome" and got.info["scale"] == 0.5
        want = rome.compute_patch(tiny_llama, case.request, hp, plugins=[("ridge", {"weight": WEIGHT})])
        plain = rome.compute_patch(tiny_llama, case.request, hp)
        assert got.deltas.keys() == want.deltas.keys() == plain.deltas.keys()
        for name, delta in got.deltas.items():
            delta, ref = delta.cpu(), 0.5 * want.deltas[name].cpu()
            scale = float(ref.abs().max())
            assert scale > 0 and float((delta - ref).abs().max()) <= 1e-6 * scale
            # the plug-in's term was in the loss: without it ROME's ΔW is measurably different
            assert float((want.deltas[name].cpu() - plain.deltas[name].cpu()).abs().max()) > 1e-3 * 2 * scale


def test_suite_metric_equals_the_engine_before_and_after_the_edit(run, tiny_llama):
    from tests.run.extension_example import p_new  # the metric's pure function (the module is imported by now)

    engine = ScoringEngine(tiny_llama)
    for row, case in rows_by_case(run):
        req = case.request
        (pre,) = engine.score([(req.text, req.target_new)])
        patch = saved_patch(run, row)
        patch.apply(tiny_llama)
        try:
            (post,) = engine.score([(req.text, req.target_new)])
        finally:
            patch.revert(tiny_llama)
        metrics = row["metrics"]["p_new"]
        assert metrics["p_new_pre"] == pytest.approx(math.exp(pre.sum), rel=1e-4)
        assert metrics["p_new_post"] == pytest.approx(math.exp(post.sum), rel=1e-4)
        assert metrics["p_new_post"] == pytest.approx(p_new(post.sum), rel=1e-4)
        assert not math.isclose(metrics["p_new_pre"], metrics["p_new_post"], rel_tol=1e-3)  # the edit did something


def _report_and_cards(out: Path, rows: list[dict], bundle, into: Path) -> None:
    """The report of the run names every method and suite; each method's card, replayed from the run directory,
    gives the run's own metric rows for the case (its edit is the run's edit)."""
    from editscope.report import build_report
    from editscope.report.card import write_card
    from editscope.run.inspect import compute_card, job_from_run
    from tests.suites.test_collateral import known_fact_file

    build_report([out], into)
    text = (into / "report.md").read_text()
    assert all(r["method"] in text for r in rows)
    assert all(f"## {suite} on counterfact" in text for r in rows for suite in r["metrics"])
    facts = into / "facts.json"  # facts the random tiny model "knows" (its own greedy answers), for the card's scan
    known_fact_file(facts, ScoringEngine(bundle))
    for method in dict.fromkeys(r["method"] for r in rows):
        row = next(r for r in rows if r["method"] == method)
        job = job_from_run(out, row["case_id"], method=method, bundle=bundle, collateral_facts=5,
                           collateral_sources=[str(facts)])
        card = compute_card(job, generate_tokens=2, trace=False, progress=False)
        for name in job.run_suites:
            assert card["suites"][name]["metrics"] == row["metrics"][name], (method, name)
        assert "<h1>" in write_card(card, into / f"card-{method}.html").read_text()
    assert not bundle.applied and not bundle.contexts and not bundle.has_memory


def test_the_editor_plugin_suite_and_protocol_reach_the_report_the_card_and_tune(run, tiny_llama, tmp_path):
    """The example's editor with its plug-in, scored by its suite and its protocol: the report and the cards read the
    run; ``tune`` searches the extension editor's knob with the plug-in attached, each candidate an ordinary run of
    that editor."""
    from editscope.tune import Tuner, TuneSettings

    _report_and_cards(run["out"], run["rows"], tiny_llama, tmp_path / "report")
    settings = TuneSettings(model="tiny-llama", method="half_rome", out=str(tmp_path / "tune"),
                            hparams=run["rome_hparams"], overrides=OVERRIDES, plugins=[("ridge", {"weight": WEIGHT})],
                            knobs=["v_lr"], grid={"v_lr": (0.1, 0.5)}, first=2, eta=2, max_cases=2)
    result = Tuner(settings, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
    assert result.chosen is not None and result.chosen.to_dict()["hparams"]["v_lr"] in (0.1, 0.5)
    for folder in sorted((tmp_path / "tune" / "candidates").iterdir()):
        meta = json.loads((folder / "run.json").read_text())
        (method,) = meta["config"]["methods"]
        assert method["name"] == "half_rome" and method["plugins"][0]["name"] == "ridge"


def test_the_context_and_memory_editors_reach_the_report_and_the_card(kinds_run, tiny_llama, tmp_path):
    _report_and_cards(kinds_run["out"], kinds_run["rows"], tiny_llama, tmp_path / "report")


def test_a_taken_name_is_refused(run):
    from tests.run.extension_example import HALF_ROME

    assert register_editor(HALF_ROME) is HALF_ROME  # the same entry again: a no-op
    with pytest.raises(EditscopeError, match="^edit method 'half_rome' is already registered$"):
        register_editor(replace(EDITORS["rome"], name="half_rome"))


def test_the_protocol_judges_the_greedy_answer_and_pairs_with_its_counterpart(run, tiny_llama):
    """said: 1 exactly when a plain one-prompt greedy loop says target_new (after the saved patch is applied); the
    rows name the protocol; summary.md pairs it with p_new per case."""
    for row, case in rows_by_case(run):
        req = case.request
        assert row["protocol"]["said"]["name"] == "said"
        patch = saved_patch(run, row)
        patch.apply(tiny_llama)
        try:
            ids = tiny_llama.tokenizer(req.text, return_tensors="pt").input_ids
            for _ in range(4):  # greedy, one token at a time
                nxt = tiny_llama.model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        finally:
            patch.revert(tiny_llama)
        text = tiny_llama.tokenizer.decode(ids[0, -4:]).split(".")[0].strip()
        said = float(text.casefold() == req.target_new.casefold())
        assert row["post"]["said"]["prompts"][0]["answer"] == text
        assert row["metrics"]["said"]["said_post"] == said
    summary = (run["out"] / "summary.md").read_text()
    assert "minus teacher-forced" in summary and "p_new p_new_post" in summary and "said said_post" in summary


@pytest.fixture(scope="module")
def olmo_run(tmp_path_factory):
    """A ROME run on a tiny OLMo 1, a model family editscope does not ship, added by the example module's ArchMap."""
    rome_hparams = str(shipped_hparams_path("rome", "tiny-llama"))
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, MODULE, raising=False)
        for registry, name in REGISTERED:
            mp.delitem(registry, name, raising=False)
        with pytest.raises(EditscopeError, match="unsupported architecture model_type='olmo'"):
            arch_for_config(SimpleNamespace(model_type="olmo"))
        folder = importlib.import_module(MODULE).save_tiny_olmo(tmp_path_factory.mktemp("olmo") / "tiny-olmo")
        data = {"model": str(folder), "plugin_modules": [MODULE], "save_patches": True,
                "methods": [{"name": "rome", "hparams": rome_hparams, "overrides": OVERRIDES}],
                "dataset": "counterfact", "slice": {"limit": N_CASES}, "suites": ["p_new"]}
        out = tmp_path_factory.mktemp("olmo-run")
        Runner(parse_config(data, where="olmo.yaml"), out_dir=out, progress=False, log=lambda _m: None).run()
        rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        try:
            yield {"out": out, "rows": rows, "rome_hparams": rome_hparams, "folder": folder}
        finally:
            for registry, name in REGISTERED:
                registry.pop(name, None)
            sys.modules.pop(MODULE, None)


def test_a_model_family_added_by_one_arch_map_runs_a_rome_edit(olmo_run):
    bundle = load(str(olmo_run["folder"]))
    assert bundle.arch is ARCHS["olmo"] and "blocks.{i}.mlp_key" in bundle.arch.hook_points
    rome = get_editor("rome")
    hp = rome.load_hparams(bundle, olmo_run["rome_hparams"], OVERRIDES)
    layer = hp.layers[0]
    name = bundle.arch.weight_name(layer)
    assert name == f"model.layers.{layer}.mlp.down_proj.weight"
    engine = ScoringEngine(bundle)
    for row, case in rows_by_case(olmo_run):
        assert row["method"] == "rome"
        got = saved_patch(olmo_run, row)
        want = rome.compute_patch(bundle, case.request, hp, engine=engine)  # the edit outside the runner
        assert got.deltas.keys() == want.deltas.keys() == {name}
        scale = float(want.deltas[name].abs().max())
        assert scale > 0 and float((got.deltas[name].cpu() - want.deltas[name].cpu()).abs().max()) <= 1e-6 * scale
        # ROME's closed form on the new family (eq. 2, paper convention): the edited W maps k* to v*
        k_star, v_star = (want.info["vectors"][key][0].double() for key in ("k_star", "v_star"))
        w_k = mlp_out_of_keys(bundle, layer, k_star.float()[None])[0].double()
        delta = bundle.arch.as_out_in(got.deltas[name]).double()
        assert torch.allclose(delta @ k_star, v_star - w_k, rtol=1e-4, atol=1e-5)
        # the suite's numbers are the engine's before and after applying the saved patch
        req = case.request
        (pre,) = engine.score([(req.text, req.target_new)])
        got.apply(bundle)
        try:
            (post,) = engine.score([(req.text, req.target_new)])
        finally:
            got.revert(bundle)
        assert row["metrics"]["p_new"]["p_new_pre"] == pytest.approx(math.exp(pre.sum), rel=1e-4)
        assert row["metrics"]["p_new"]["p_new_post"] == pytest.approx(math.exp(post.sum), rel=1e-4)
        assert post.sum > pre.sum  # the edit raised the new target


def test_a_family_module_reaches_every_command_through_the_global_option(olmo_run):
    """``editscope --plugin-module MODULE COMMAND``: the family the module registers is known to commands that take
    no run config (here ``score``, which loads the folder); without it, one line naming the model type. The
    log-probs are the engine's on the same model."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo)])}
    score = ["score", "--model", str(olmo_run["folder"]), "--prompt", "The capital of France is",
             "--candidates", "Paris", "--json"]
    without = subprocess.run([sys.executable, "-m", "editscope", *score], capture_output=True, text=True, env=env,
                             cwd=repo)
    assert without.returncode == 2 and "model_type='olmo'" in without.stderr
    assert len(without.stderr.strip().splitlines()) == 1
    with_module = subprocess.run([sys.executable, "-m", "editscope", "--plugin-module", MODULE, *score],
                                 capture_output=True, text=True, env=env, cwd=repo)
    assert with_module.returncode == 0, with_module.stderr[-1500:]
    (got,) = json.loads(with_module.stdout)
    (want,) = ScoringEngine(load(str(olmo_run["folder"]))).score([("The capital of France is", " Paris")])
    assert got["logprob_sum"] == pytest.approx(want.sum, rel=1e-5, abs=1e-6)
    bad = subprocess.run([sys.executable, "-m", "editscope", "--plugin-module", "no_such_module_x", "models"],
                         capture_output=True, text=True, env=env, cwd=repo)
    assert bad.returncode == 2 and "plug-in module 'no_such_module_x' cannot be imported" in bad.stderr


def test_the_model_family_reaches_the_report_the_card_and_tune(olmo_run, tmp_path):
    """The family the example module adds: its run is reported, each case's card replays its edit, and ``tune``
    searches ROME's knob on it (candidates run on the folder's model, the family found through the module)."""
    from editscope.tune import Tuner, TuneSettings

    bundle = load(str(olmo_run["folder"]))
    _report_and_cards(olmo_run["out"], olmo_run["rows"], bundle, tmp_path / "report")
    settings = TuneSettings(model=str(olmo_run["folder"]), method="rome", out=str(tmp_path / "tune"),
                            hparams=olmo_run["rome_hparams"], overrides=OVERRIDES, knobs=["v_lr"],
                            grid={"v_lr": (0.1, 0.5)}, first=2, eta=2, max_cases=2)
    result = Tuner(settings, bundle=bundle, progress=False, log=lambda _m: None).run()
    assert result.chosen is not None and len(list((tmp_path / "tune" / "candidates").iterdir())) == 2


def test_a_stored_run_config_imports_its_own_plugin_modules(olmo_run):
    """Reading a run back (inspect, resume) imports the modules its config names: the run records them, so no
    reader has to repeat them (before, ``inspect RUN_DIR`` said "unknown suite 'p_new'")."""
    from editscope.run import RunConfig
    from editscope.run.store import RUN_JSON, read_json

    meta = read_json(olmo_run["out"] / RUN_JSON)
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, MODULE)
        for registry, name in REGISTERED:
            mp.delitem(registry, name)
        config = RunConfig.from_run_json(meta["config"], olmo_run["out"] / RUN_JSON)
        assert MODULE in sys.modules and "olmo" in ARCHS and config.plugin_modules == (MODULE,)
        broken = {**meta["config"], "plugin_modules": ["no_such_module_x"]}
        with pytest.raises(EditscopeError, match=r"run\.json: field 'config\.plugin_modules': plug-in module "
                                                 r"'no_such_module_x' cannot be imported"):
            RunConfig.from_run_json(broken, olmo_run["out"] / RUN_JSON)


def _writer(query: int, value: torch.Tensor):
    """A forward hook writing ``value`` as the module's output from position ``query`` on."""
    def write(_m, _a, out):
        out = out.clone()
        out[:, query:] = value.to(out)
        return out
    return write


@pytest.fixture(scope="module")
def kinds_run(tmp_path_factory, tiny_llama):
    """A run of the example's context editor and memory editor (the module imported by the config)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(sys.modules, MODULE, raising=False)
        for registry, name in REGISTERED:
            mp.delitem(registry, name, raising=False)
        out = tmp_path_factory.mktemp("kinds")
        hparams = out.parent / "doubled.yaml"  # a method with no shipped file: the user's own hparams
        hparams.write_text("layers: [1]\n")
        data = {"model": "tiny-llama", "plugin_modules": [MODULE], "save_patches": True,
                "methods": ["quoted", {"name": "doubled", "hparams": str(hparams)}],
                "dataset": "counterfact", "slice": {"limit": N_CASES}, "suites": ["p_new"]}
        cfg = parse_config(data, where="kinds.yaml")
        Runner(cfg, out_dir=out, bundle=tiny_llama, progress=False, log=lambda _m: None).run()
        rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        try:
            yield {"out": out, "rows": rows}
        finally:
            for registry, name in REGISTERED:
                registry.pop(name, None)
            sys.modules.pop(MODULE, None)


def test_a_context_and_a_memory_editor_run_through_the_runner_and_the_report(kinds_run, tiny_llama):
    """Each row's p_new after the edit equals an independent computation: the unedited model scoring the quoted
    facts' text before the prompt; the unedited model with a hand-installed hook writing twice the projection's own
    output from the prompt's last token on. The saved edit files load back as their kinds; the report reads the run."""
    from editscope.edit.intervention import load_intervention
    from editscope.report import build_report

    engine = ScoringEngine(tiny_llama)
    cases = {c.case_id: c for c in load_cases("counterfact", limit=N_CASES)}
    assert {r["method"] for r in kinds_run["rows"]} == {"quoted", "doubled"}
    for row in kinds_run["rows"]:
        req = cases[row["case_id"]].request
        saved = load_intervention(kinds_run["out"] / "patches" / row["method"] /
                                  f"{row['dataset']}-g{row['group']:05d}-0.safetensors")
        assert row["edit_info"]["kind"] == saved.kind == {"quoted": "context", "doubled": "memory"}[row["method"]]
        if row["method"] == "quoted":
            text = f'Quoted from the latest records:\nNew Fact: "{req.text} {req.target_new}."\nPrompt: {req.text}'
            (want,) = engine.score([(text, req.target_new)])
        else:
            ctx, _ = engine.encode_pair(req.text, req.target_new)
            module = tiny_llama.model.get_submodule(tiny_llama.arch.layer_module_path(1, "mlp_out"))

            keys = engine.hidden_states([req.text], [1], kind="mlp_key")[0, 0]
            value = 2 * module.forward(keys[None])[0]

            handle = module.register_forward_hook(_writer(len(ctx) - 1, value))
            try:
                (want,) = engine.score([(req.text, req.target_new)])
            finally:
                handle.remove()
        assert row["metrics"]["p_new"]["p_new_post"] == pytest.approx(math.exp(want.sum), rel=1e-4)
    assert not tiny_llama.applied and not tiny_llama.contexts and not tiny_llama.has_memory
    build_report([kinds_run["out"]])
    summary = (kinds_run["out"] / "summary.md").read_text()
    assert "quoted" in summary and "doubled" in summary
