"""CLI fuzz: every subcommand the parser knows (enumerated from it, so a new command is covered without touching
this file) gets random and boundary argument values - empty, huge, negative, NaN, inf, non-UTF-8 bytes, missing
files, folders where files are expected, output paths that cannot be created. Each probe runs ``editscope.cli.main``
in-process and must end in

- exit code 1 or 2 with the error in exactly one line on stderr (the last; a line before it can only be the
  command's own progress log, such as ``loading model``), and no traceback; or
- exit code 0 (the value is legitimately accepted) with no ``nan``/``inf`` printed; or
- a probe that passes every check and starts real work: stopped by a timer and counted as accepted -
  :data:`WORK_SECONDS` after the tiny model is loaded (every ``--model`` is the tiny random-init model and every
  config names it, so no probe loads SmolLM2), :data:`PROBE_SECONDS` after the start for commands without a model.

Deterministic (seeded); prints how many probes ran, how many were accepted and how many raised a traceback."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import io
import json
import pkgutil
import random
import re
import signal
import traceback
from collections import Counter

import pytest
import torch

import editscope
from editscope.cli import build_parser, main

SEED = 20261124
PROBE_SECONDS = 1.0
WORK_SECONDS = 0.25
#: values tried for every argument (and a few per-argument extras below)
HOSTILE = ["", " ", "0", "-1", "1", "0.5", "9" * 40, "1e308", "-1e308", "nan", "inf", "-inf", "x\udcff",
           "\udcfe\udcff", "a" * 3000, "{}", "-", "--", "null", "[]"]
#: numeric options get all of these; other arguments a seeded sample of HOSTILE plus the path cases
NUMERIC = ["0", "-1", "1", "0.5", "9" * 40, "1e308", "nan", "inf", "-inf", "", "x\udcff"]
#: per argument: this many values from NUMERIC (numeric options) or from HOSTILE and the path cases (others)
PER_NUMERIC, PER_ARGUMENT = 6, 3
#: the progress log lines a command may print to stderr before its error
LOG_LINES = ("loading model ",)


class _Started(BaseException):
    """Raised by the timer: the probe passed every check and began real work."""


def _leaves(parser: argparse.ArgumentParser, path: list[str]):
    """(command words, parser) of every parser that runs something: leaves and parsers with their own func."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path and (not subs or parser.get_default("func") is not None):
        yield path, parser
    seen: set[int] = set()
    for sub in subs:
        for name, child in sub.choices.items():
            if id(child) not in seen:  # an alias (patch export = apply) is the same parser
                seen.add(id(child))
                yield from _leaves(child, [*path, name])


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _is_numeric(action: argparse.Action) -> bool:
    return action.type in (int, float) or getattr(action.type, "__name__", "").startswith(("int in", "float in"))


@pytest.fixture
def fuzz_env(tmp_path, monkeypatch, tiny_llama, run_dir):
    """Files the base command lines need, a private cache folder, and the tiny model built once (deep copies)."""
    from editscope.edit import Patch
    from editscope.edit.patch import tensor_checksum
    from editscope.lm import loading

    monkeypatch.chdir(tmp_path)  # nothing a probe writes lands in the repository
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    cache: dict = {}
    real_build = loading.build_tiny

    def build_tiny(family: str, seed: int = 0):
        if (family, seed) not in cache:
            cache[family, seed] = real_build(family, seed=seed)
        base = cache[family, seed]  # a fresh copy of the weights (a probe may edit them); the tokenizer is shared
        bundle = dataclasses.replace(base, model=copy.deepcopy(base.model), extra=dict(base.extra), _applied=[],
                                     _originals=None, _folded=0)
        signal.setitimer(signal.ITIMER_REAL, WORK_SECONDS)  # the checks before the model are done: work starts
        return bundle

    monkeypatch.setattr(loading, "build_tiny", build_tiny)
    # what the commands import lazily, imported now: a timer must never stop a probe inside an import (a module
    # left half-imported breaks every later probe)
    import matplotlib.pyplot  # noqa: F401
    for module in pkgutil.walk_packages(editscope.__path__, "editscope."):
        if "ray" not in module.name:
            importlib.import_module(module.name)
    name = tiny_llama.arch.weight_name(1, "mlp_out")
    param = dict(tiny_llama.model.named_parameters())[name]
    patch = Patch(deltas={name: torch.zeros_like(param)}, method="rome", hparams={}, fingerprint=tiny_llama.fingerprint,
                  checksums={name: tensor_checksum(param)}, model_name="tiny-llama",
                  requests=[{"prompt": "{} is in", "subject": "Paris", "target_new": "Rome", "target_true": "France"}])
    patch.save(tmp_path / "p.safetensors")
    config = {"model": "tiny-llama", "output": str(tmp_path / "cfg-out"), "methods": [{"name": "rome",
              "overrides": {"v_steps": 1}}], "dataset": "counterfact-1k", "slice": {"limit": 1},
              "suites": ["counterfact"]}
    (tmp_path / "cfg.yaml").write_text(json.dumps(config))
    (tmp_path / "corpus.txt").write_text("The Eiffel Tower is in Paris.\n" * 20)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return {"tmp": tmp_path, "patch": str(tmp_path / "p.safetensors"), "config": str(tmp_path / "cfg.yaml"),
            "run": str(run_dir), "corpus": str(tmp_path / "corpus.txt"), "missing": str(tmp_path / "missing.json"),
            "folder": str(tmp_path), "unwritable": str(blocker / "sub" / "out")}


def _base(words: list[str], parser: argparse.ArgumentParser, env: dict, n: int) -> dict[argparse.Action, list[str]]:
    """A plausible value for each argument the base command line sets: every required one, and --model (never
    the default SmolLM2), --no-progress, outputs in the test's folder."""
    fresh = str(env["tmp"] / f"out-{n}")
    cheap = {"trials": ["2"], "answers": ["2"], "limit": ["1"], "budget": ["64"], "steps": ["1"], "n": ["1"],
             "samples": ["1"]}  # where the default would make a started probe slow
    by_dest = {"model": ["tiny-llama"], "prompt": ["{} is in"], "subject": ["Paris"], "target": ["Rome"],
               "candidates": [" France"], "layers": ["1"], "patch": [env["patch"]], "file": [env["patch"]],
               "config": [env["config"]], "runs": [env["run"]], "out": [fresh], "output": [fresh],
               "out_dir": [fresh], "shards": [env["run"]], "name": ["tiny-llama"], "corpus": [env["corpus"]]}
    out: dict[argparse.Action, list[str]] = {}
    for action in _arguments(parser):
        if action.dest == "no_progress":
            out[action] = []
        elif action.required or not action.option_strings or action.dest in ("model", "config", "output", "out"):
            out[action] = by_dest.get(action.dest, ["x"])
        elif action.dest in cheap:
            out[action] = cheap[action.dest]
    return out


def _argv(words: list[str], values: dict[argparse.Action, list[str]]) -> list[str]:
    argv = list(words)
    for action, vals in values.items():
        if action.option_strings:
            argv += [action.option_strings[-1], *vals] if _takes_value(action) else [action.option_strings[-1]]
    for action, vals in values.items():
        if not action.option_strings:  # positionals last; one that starts with '-' is a probe of its own
            argv += vals
    return argv


def _probe(argv: list[str]) -> tuple[str, int | None, str, str]:
    """(outcome, exit code, stdout, stderr): outcome 'exit', 'started' (timer) or 'traceback'."""
    out, err = io.StringIO(), io.StringIO()

    armed, fired = [True], [False]

    def stop(*_):
        if armed[0]:
            fired[0] = True
            signal.setitimer(signal.ITIMER_REAL, 0.5)  # again later: a stop raised in a __del__ is swallowed there
            raise _Started

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, PROBE_SECONDS)
    outcome, code = "exit", None
    try:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as exc:  # argparse
                    code = exc.code if isinstance(exc.code, int) else 1
        except _Started:
            outcome = "started"
        except Exception:  # noqa: BLE001 (what the fuzz looks for)
            # after the stop fired, an exception that escapes is the stop itself turned into another one by the
            # code it interrupted (matplotlib's C++ converters answer any error with "Invalid bounding box"):
            # the probe had passed every check and started work
            outcome = "started" if fired[0] else "traceback"
            if not fired[0]:
                err.write(traceback.format_exc())
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Started:  # the second stop, fired while the first one unwound
        outcome = "started"
    finally:
        signal.signal(signal.SIGALRM, previous)
        # a stop fired inside torch's no_grad __enter__/__exit__ leaves grad mode off for the next probe, which a
        # real command (a fresh process) never inherits
        torch.set_grad_enabled(True)
    return outcome, code, out.getvalue(), err.getvalue()


_NON_FINITE = re.compile(r"(?<![A-Za-z])[+-]?(nan|inf|infinity)(?![A-Za-z])", re.IGNORECASE)


def _problem(argv: list[str], outcome: str, code: int | None, out: str, err: str) -> str | None:
    if outcome == "traceback" or "Traceback" in err:
        return "traceback: " + err.strip().splitlines()[-1][:300]
    if outcome == "started" or code == 0:
        # an accepted value must not come back as nan/inf (the probe's own values are echoed in paths and names)
        echoed = " ".join(argv)
        for m in _NON_FINITE.finditer(out):
            line = out[out.rfind("\n", 0, m.start()) + 1:out.find("\n", m.end())]
            if m.group(0) not in echoed:
                return f"printed {m.group(0)!r}: {line[:200]}"
        return None
    if code != 2:
        return f"exit code {code}"
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    if len(errors) != 1 or lines[-1] != errors[0] or any(not line.startswith(LOG_LINES) for line in lines[:-1]):
        return f"stderr is not one error line: {err[-400:]!r}"
    return None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # a stop swallowed by a __del__
def test_cli_fuzz(fuzz_env, capsys):
    rng = random.Random(SEED)
    leaves = list(_leaves(build_parser(), []))
    assert len(leaves) >= 15, [" ".join(w) for w, _ in leaves]  # every command is enumerated
    probes: list[list[str]] = []
    for words, parser in leaves:
        base = _base(words, parser, fuzz_env, len(probes))
        probes.append(_argv(words, base))
        for action in _arguments(parser):
            if not _takes_value(action) or action.dest in ("device",):
                continue
            paths = [fuzz_env["missing"], fuzz_env["folder"], fuzz_env["unwritable"]]
            values = (rng.sample(NUMERIC, PER_NUMERIC) if _is_numeric(action)
                      else rng.sample(HOSTILE + paths, PER_ARGUMENT))
            if action.choices:
                values = rng.sample(HOSTILE, 2)
            for value in values:
                probes.append(_argv(words, {**_base(words, parser, fuzz_env, len(probes)), action: [value]}))
        for _ in range(3):  # a few with several hostile values at once
            mutable = [a for a in _arguments(parser) if _takes_value(a) and a.dest != "device"]
            chosen = rng.sample(mutable, min(len(mutable), 3))
            probes.append(_argv(words, {**_base(words, parser, fuzz_env, len(probes)),
                                        **{a: [rng.choice(HOSTILE + NUMERIC)] for a in chosen}}))
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    for argv in probes:
        outcome, code, out, err = _probe(argv)
        outcomes["started" if outcome == "started" else outcome if outcome == "traceback" else f"exit {code}"] += 1
        if problem := _problem(argv, outcome, code, out, err):
            failures.append(f"{[a[:60] for a in argv]}: {problem}")
    tracebacks = sum(": traceback: " in f for f in failures)
    with capsys.disabled():
        print(f"\nCLI fuzz: {len(probes)} probes over {len(leaves)} commands, outcomes "
              f"{dict(sorted(outcomes.items()))}, {tracebacks} raised a traceback, {len(failures)} failed a check")
    assert not failures, f"{len(failures)} of {len(probes)} probes failed (tracebacks: {tracebacks}):\n" + \
        "\n".join(failures[:40])


def test_leaves_cover_every_registered_command():
    from editscope.cli import COMMANDS

    top = {words[0] for words, _ in _leaves(build_parser(), [])}
    assert top == set(COMMANDS.names())
