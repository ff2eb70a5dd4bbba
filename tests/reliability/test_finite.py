"""Finite or refused: NaN/inf hyperparameters and config values are refused naming the key (and
the override), an edit producing non-finite ΔW or v* is refused naming the method and request with nothing applied,
and ``edit --json`` never prints NaN."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.edit.hparams import HParams, Params, load_yaml
from editscope.edit.patch import tensor_checksum
from editscope.edit.registry import EDITORS, Editor, register_editor
from editscope.errors import EditscopeError
from editscope.run import Runner, parse_config
from tests.run.helpers import SUITES, base_config

REQUEST = EditRequest("{} is located in", "Eiffel Tower", "Rome", "Paris")


@pytest.mark.parametrize("text,key", [("v_lr: .nan", "v_lr"), ("kl_factor: .nan", "kl_factor"),
                                      ("v_weight_decay: -.inf", "v_weight_decay"),
                                      ("context_templates: [[10, 5]]\nstop_loss: .inf", "stop_loss")])
def test_nan_or_inf_in_an_hparams_file_names_the_key(tmp_path, text, key):
    path = tmp_path / "rome.yaml"
    path.write_text(f"layers: [1]\n{text}\n")
    with pytest.raises(EditscopeError, match=rf"^{path}: key '{key}': must be a finite number"):
        load_yaml(path, get_editor("rome").hparams_class)


def test_overrides_are_blamed_for_their_own_errors(tiny_llama):
    rome = get_editor("rome")
    with pytest.raises(EditscopeError, match=r"^--set layers=\[7\] \(over .*tiny.yaml\): key 'layers': "
                                             r"layer 7 out of range 0..3"):
        rome.load_hparams(tiny_llama, None, {"layers": [7]})
    with pytest.raises(EditscopeError, match=r"^--set v_lr=\.nan \(over .*\): key 'v_lr': must be a finite number"):
        rome.load_hparams(tiny_llama, None, {"v_lr": math.nan})
    with pytest.raises(EditscopeError, match=r"^--set bogus=1 \(over .*\): key 'bogus': unknown hyperparameter"):
        rome.load_hparams(tiny_llama, None, {"bogus": 1})
    assert rome.load_hparams(tiny_llama, None, {"layers": [2]}).layers == [2]


def test_plugin_style_params_refuse_nan_in_nested_values():
    @dataclasses.dataclass
    class P(Params):
        weight: float = 1.0
        scales: list[float] = dataclasses.field(default_factory=list)

    assert P.from_dict({"weight": 2, "scales": [1.0]}).weight == 2.0
    with pytest.raises(EditscopeError, match=r"<x>: key 'weight': must be a finite number, got inf"):
        P.from_dict({"weight": math.inf}, "<x>")
    with pytest.raises(EditscopeError, match=r"<x>: key 'scales\[1\]': must be a finite number, got nan"):
        P.from_dict({"scales": [1.0, math.nan]}, "<x>")


def test_run_config_refuses_nan_anywhere():
    data = base_config(methods=[{"name": "rome", "overrides": {"v_lr": math.nan}}])
    with pytest.raises(EditscopeError, match=r"key 'methods\[0\]\.overrides\.v_lr': must be a finite number"):
        parse_config(data, where="cfg.yaml", suites=SUITES)
    data = base_config(suites=[{"name": "rewrite_es", "options": {"paraphrases": math.inf}}])
    with pytest.raises(EditscopeError, match=r"cfg.yaml: key 'suites\[0\]\.options\.paraphrases'"):
        parse_config(data, where="cfg.yaml", suites=SUITES)


@dataclasses.dataclass
class NanHParams(HParams):
    method = "nan_test"
    where: str = "delta"  # delta | vector


def _nan_compute(bundle, requests, hp, state, *, engine, runtime, extra_terms=()):
    name = bundle.arch.weight_name(hp.layers[0], "mlp_out")
    delta = torch.zeros_like(dict(bundle.model.named_parameters())[name])
    vectors = {"v_star": [torch.ones(3)]}
    if hp.where == "delta":
        delta[0, 0] = math.nan
    else:
        vectors["v_star"][0][1] = math.inf
    return {name: delta.detach()}, {"vectors": vectors}


@pytest.fixture
def nan_editor():
    editor = register_editor(Editor("nan_test", "NaN", NanHParams, _nan_compute, optimises=False))
    yield editor
    EDITORS.pop("nan_test", None)


@pytest.mark.parametrize("where,named", [("delta", r"model\.layers\.1\.mlp\.down_proj\.weight"),
                                         ("vector", r"v_star\.0")])
def test_non_finite_edit_is_refused_and_nothing_applied(tiny_llama, nan_editor, where, named):
    before = {n: tensor_checksum(p) for n, p in tiny_llama.model.named_parameters()}
    fingerprint = tiny_llama.fingerprint
    with pytest.raises(EditscopeError, match=rf"^nan_test: the edit of 'Eiffel Tower' -> 'Rome' produced "
                                             rf"non-finite values in {named}; nothing was applied"):
        nan_editor.apply(tiny_llama, REQUEST, NanHParams(layers=[1], where=where))
    assert {n: tensor_checksum(p) for n, p in tiny_llama.model.named_parameters()} == before
    assert not tiny_llama.applied and tiny_llama.fingerprint == fingerprint


def test_runner_names_dataset_case_and_method_and_saves_nothing(tmp_path, tiny_llama, nan_editor):
    cfg = parse_config(base_config(methods=[{"name": "nan_test", "hparams": str(_hparams_file(tmp_path))}],
                                   slice={"offset": 0, "limit": 2}, save_patches=True), suites=SUITES)
    runner = Runner(cfg, out_dir=tmp_path / "run", bundle=tiny_llama, suite_factories=SUITES, progress=False,
                    log=lambda _m: None)
    with pytest.raises(EditscopeError, match=r"case \S+, method nan_test: nan_test: the edit of .* non-finite"):
        runner.run()
    assert (tmp_path / "run" / "results.jsonl").read_text() == ""
    assert not (tmp_path / "run" / "patches").exists()


def _hparams_file(tmp_path):
    path = tmp_path / "nan.yaml"
    path.write_text("layers: [1]\n")
    return path


def test_edit_json_never_prints_nan():
    from editscope.commands.edit import _strict_json

    assert _strict_json({"pre": {"target": -1.5}}) == '{\n "pre": {\n  "target": -1.5\n }\n}'
    with pytest.raises(EditscopeError, match=r"edit --json: non-finite result \(post\.target=nan"):
        _strict_json({"pre": {"target": -1.5}, "post": {"target": math.nan}})
