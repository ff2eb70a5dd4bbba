"""The command line: help everywhere, one-line errors."""

from __future__ import annotations

import pytest

from editscope.cli import COMMANDS, build_parser, main


def test_every_command_has_help(capsys):
    parser = build_parser()
    names = list(parser._subparsers._group_actions[0].choices)
    assert len(names) == len(COMMANDS) or len(names) >= len(COMMANDS)
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "usage: editscope " + name in out
        assert "%%" not in out, f"{name} --help prints a doubled percent sign"  # descriptions are not %-formatted


def test_help_lists_every_command_without_building_their_parsers():
    """``editscope --help`` lists every command with the line its full parser has, and builds none of them: the
    editors' registry (and torch with it) is never imported. Checked in a fresh interpreter."""
    import subprocess
    import sys

    probe = ("import sys; from editscope.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('IMPORTED', sorted(m for m in ('torch', 'editscope.edit.registry') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    listing, _, imported = proc.stdout.rpartition("IMPORTED ")
    assert imported.strip() == "[]"
    assert listing == build_parser().format_help()  # the same text as with every command's parser built


@pytest.mark.parametrize(("argv", "command"), [
    (["run", "x.yaml"], "run"), (["--plugin-module", "m", "edit"], "edit"), (["--plugin-mod", "m", "plan"], "plan"),
    (["--plugin-module=m", "tune", "--method", "rome"], "tune"), (["--version"], None), (["--", "report"], "report"),
])
def test_the_command_word_skips_global_options(argv, command):
    from editscope.cli import _command_word

    assert _command_word(argv) == command


def test_a_named_command_gets_its_full_parser_and_the_others_are_listed():
    parser = build_parser(["edit", "--prompt", "{} is"])
    choices = parser._subparsers._group_actions[0].choices
    assert set(choices) == set(COMMANDS)
    assert any(a.dest == "method" for a in choices["edit"]._actions)
    assert not any(a.dest == "method" for a in choices["tune"]._actions)  # listed only: no arguments


def test_unknown_model_is_one_line_error(capsys):
    assert main(["score", "--model", "nope", "--prompt", "x", "--candidates", "y"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("editscope: error: unknown model 'nope'") and "\n" not in err


def test_score_on_tiny_model_prints_a_ranked_table(capsys):
    assert main(["score", "--model", "tiny-llama", "--prompt", "The capital of France is",
                 "--candidates", "Paris", "London"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["candidate", "tokens", "logprob_sum", "logprob_mean", "rank"]
    ranks = sorted(int(line.split()[-1]) for line in lines[1:])
    assert ranks == [1, 2]


def test_configs_lists_every_shipped_config_with_what_it_reproduces(capsys, tmp_path):
    import json

    from editscope.commands.configs import describe
    from editscope.paths import configs_dir

    assert main(["configs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    shipped = {f"experiments/{p.stem}" for p in (configs_dir() / "experiments").glob("*.yaml")}
    shipped |= {"demo", "demo-sample"}
    assert {r["name"] for r in rows} == shipped
    table1 = next(r for r in rows if r["name"] == "experiments/evk-table1")
    assert table1["reproduces"].startswith("Paper 004") and "alphaedit" in table1["methods"]
    config = tmp_path / "mine.yaml"
    config.write_text("# My table. More text.\n# Wall time: 12 min on 2 cores\nmodel: tiny-llama\nmethods: [rome]\n"
                      "dataset: counterfact\nsuites: [counterfact]\n")
    row = describe(config, "mine")
    assert (row["reproduces"], row["wall_time"], row["methods"]) == ("My table.", "12 min on 2 cores", ["rome"])


@pytest.mark.parametrize("argv", [
    ["edit", "--method", "rome", "--prompt", "{} is in", "--subject", "Paris", "--target", "Italy"],
    ["inspect"], ["tune", "--method", "rome", "--budget", "1"], ["mend", "train"]])
def test_repeated_set_keeps_every_override(argv):
    """``--set a=1 b=2 --set c=3`` keeps all three (a repeated --set used to replace the earlier ones silently)."""
    args = build_parser().parse_args([*argv, "--set", "a=1", "b=2", "--set", "c=3"])
    assert args.set == ["a=1", "b=2", "c=3"]
    assert build_parser().parse_args(argv).set == []


def test_demo_checks_its_data_before_loading_the_model(tmp_path, monkeypatch, capsys):
    """A data folder without the demo's files fails in one line before any model is loaded or converted."""
    import editscope.lm

    monkeypatch.setenv("EDITSCOPE_DATA", str(tmp_path))  # a folder that exists but holds no dataset

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(editscope.lm, "load", no_load)
    assert main(["demo", "-o", str(tmp_path / "out"), "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "counterfact" in err and "not found" in err and "Traceback" not in err
