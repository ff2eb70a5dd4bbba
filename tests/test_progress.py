"""Progress a user sees within seconds: the listener mechanism, the editor's steps, the commands' status lines, the
results table at the end of ``run``, ``--version`` and the default model named exactly."""

from __future__ import annotations

import io
import re
from importlib import metadata

import pytest

from editscope.cli import main
from editscope.data.records import EditRequest
from editscope.progress import StatusLine, listening, report


def test_report_reaches_the_innermost_listener_only_inside_its_block():
    outer, inner = [], []
    report("nobody hears this")
    with listening(outer.append):
        report("a")
        with listening(inner.append):
            report("step", 2, 5)
        with listening(None):
            report("muted")
        report("b", 3)
    report("after")
    assert outer == ["a", "b 3"] and inner == ["step 2/5"]


def test_status_line_shows_at_most_one_update_per_interval(monkeypatch):
    clock = iter([0.0, 0.2, 0.5, 1.1, 1.15, 2.3])
    monkeypatch.setattr("editscope.progress.time.monotonic", lambda: next(clock))
    stream = io.StringIO()
    line = StatusLine("x: ", stream=stream, every=1.0)
    for k in range(6):
        line(f"m{k}")
    assert stream.getvalue().splitlines() == ["x: m0", "x: m3", "x: m5"]  # not a terminal: one line each


def test_the_optimiser_reports_every_step(tiny_bundles):
    from editscope.edit import get_editor

    bundle = tiny_bundles["llama"]
    editor = get_editor("rome")
    hp = editor.load_hparams(bundle, None, {"v_steps": 6, "stop_loss": 0.0})
    heard: list[str] = []
    with listening(heard.append):
        patch = editor.apply(bundle, EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"), hp)
    patch.revert(bundle)
    assert heard[0] == "rome: editing 1 fact(s)"
    steps = [m for m in heard if m.startswith("v* optimisation")]
    assert steps == [f"v* optimisation of 1 request(s), step {i}/6" for i in range(1, 7)]


REQUESTS = [EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France"),
            EditRequest("The mother tongue of {} is", "Thomas Joannes Stieltjes", "English", "Dutch")]


@pytest.mark.parametrize("method, overrides, want", [
    # one side-memory training per edit, each step counted (the loss cannot meet the stop rule's margins in 3)
    ("wise", {"n_iter": 3, "layers": [1], "context_templates": [[5, 1]], "irrelevant_pool": "counterfact-train-sample"},
     [f"wise: edit {i}/2, step {s}/3" for i in (1, 2) for s in (1, 2, 3)]),
    # both values trained in one wave, a row leaving only when its loss is below stop_loss (0: never)
    ("grace", {"n_iter": 3, "layers": [1], "stop_loss": 0.0},
     [f"grace: values of 2 request(s), step {s}/3" for s in (1, 2, 3)]),
    ("kn", {}, [f"kn: locating the neurons of request {i}/2" for i in (1, 2)]),
])
def test_editors_without_a_v_star_loop_report_each_request_and_step(tiny_bundles, method, overrides, want):
    """A WISE round of 100 edits runs for half an hour on a CPU: what it is doing is shown while it does it."""
    from editscope.edit import get_editor
    from editscope.lm.engine import ScoringEngine

    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    hp = editor.load_hparams(bundle, overrides=overrides)
    heard: list[str] = []
    with listening(heard.append):
        edit = editor.apply(bundle, REQUESTS, hp, editor.new_state(), engine=ScoringEngine(bundle))
    edit.revert(bundle)
    assert heard[0] == f"{method}: editing 2 fact(s)"
    assert [m for m in heard if m.startswith(f"{method}: ") and m != heard[0]] == want


def test_edit_command_shows_progress_on_stderr_and_is_quiet_when_asked(capsys):
    args = ["edit", "--model", "tiny-llama", "--method", "rome", "--prompt", "{} is a citizen of", "--subject",
            "Danielle Darrieux", "--target", "Japan", "--set", "v_steps=3"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "edit: loading tiny-llama" in captured.err and "edit: editing with ROME" in captured.err
    assert re.search(r"edit: edited in [0-9.]+ s; scoring after the edit", captured.err)
    assert "edit:" not in captured.out  # the results stay on stdout, alone
    assert main([*args, "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_run_prints_the_headline_table(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model: tiny-llama\nmethods: [{name: rome, overrides: {v_steps: 2}}]\ndataset: counterfact\n"
                      "slice: {offset: 0, limit: 2}\nsuites: [counterfact]\n")
    assert main(["run", str(config), "-o", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("counterfact on counterfact")
    assert out[at + 1].split() == ["method", "n", "ES", "↑", "(%)", "PS", "↑", "(%)", "NS", "↑", "(%)", "Score", "↑",
                                   "(%)"]
    rows = {line.split()[0]: line.split()[1:] for line in out[at + 2:at + 4]}
    assert set(rows) == {"unedited", "rome"} and rows["rome"][0] == "2"
    # the printed numbers are summary.md's compact table
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "| rome | 2 | " + " | ".join(rows["rome"][1:]) + " |" in md


def test_version_names_editscope_and_the_libraries(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"editscope {metadata.version('editscope')} (")
    assert f"torch {metadata.version('torch')}" in out and f"transformers {metadata.version('transformers')}" in out


def test_models_names_the_default_model_exactly(capsys):
    assert main(["models"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SmolLM2-135M-Instruct" in out and "Q4_1 GGUF" in out and "float32" in out
    assert "smollm2-135m is HuggingFaceTB's SmolLM2-135M-Instruct" in out


def test_a_run_names_each_suite_while_it_probes(tmp_path, tiny_bundles, monkeypatch):
    """With several suites, the run's status line names the suite at work while it probes (a slow one is not hidden
    behind one line)."""
    from editscope.run import Runner, parse_config

    config = parse_config({"model": "tiny-llama", "methods": [{"name": "rome", "overrides": {"v_steps": 2}}],
                           "dataset": "counterfact", "slice": {"offset": 0, "limit": 1},
                           "suites": ["counterfact", {"name": "wild", "options": {"max_new_tokens": 2}}]})
    heard: list[str] = []  # what the trial tells the status line (which shows at most one a second)
    monkeypatch.setattr("editscope.run.trial.report", heard.append)
    Runner(config, out_dir=tmp_path, bundle=tiny_bundles["llama"], progress=False, log=lambda _m: None).run()
    assert [m for m in heard if "probing" in m] == [
        "counterfact: probing 1 case(s) before editing: counterfact",
        "counterfact: probing 1 case(s) before editing: wild",
        "counterfact, rome: probing 1 case(s) after the edits: counterfact",
        "counterfact, rome: probing 1 case(s) after the edits: wild"]
