"""Numeric CLI options out of range (``bench klob --k nan``, ``locate --noise nan``...) are argparse usage errors:
exit code 2, one ``error:`` line naming the option and its range, no traceback, before any model is loaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from editscope.cli import main
from editscope.ranges import option

KLOB = ["bench", "klob", "--model", "no-such-model", "-o", "unused"]
LOCATE = ["locate", "--model", "no-such-model", "--prompt", "{} is in", "--subject", "Paris"]


@pytest.mark.parametrize(("argv", "needle"), [
    # wrote NaN into metrics.json
    ([*KLOB, "--k", "nan"], "argument --k: must be a number in [1.1754944e-38, 100], got 'nan'"),
    ([*KLOB, "--k", "150"], "argument --k: must be a number in [1.1754944e-38, 100], got '150'"),
    ([*KLOB, "--k", "5", "0"], "argument --k: must be a number in [1.1754944e-38, 100], got '0'"),
    ([*KLOB, "--k", "inf"], "argument --k: must be a number in [1.1754944e-38, 100], got 'inf'"),
    ([*KLOB, "--n", "0"], "argument --n: must be an integer in [1, 1e7], got '0'"),
    ([*KLOB, "--n", "-1"], "argument --n: must be an integer in [1, 1e7], got '-1'"),
    ([*KLOB, "--n", "2.5"], "argument --n: must be an integer in [1, 1e7], got '2.5'"),
    ([*KLOB, "--samples", "0"], "argument --samples: must be an integer in [1, inf), got '0'"),
    ([*KLOB, "--steps", "100000000"], "argument --steps: must be an integer in [1, 10000], got '100000000'"),
    ([*LOCATE, "--noise", "nan"], "argument --noise: must be a number in [1.1754944e-38, inf), got 'nan'"),  # +nan
    ([*LOCATE, "--noise", "inf"], "argument --noise: must be a number in [1.1754944e-38, inf), got 'inf'"),
    ([*LOCATE, "--noise", "0"], "argument --noise: must be a number in [1.1754944e-38, inf), got '0'"),
    ([*LOCATE, "--noise", "-3"], "argument --noise: must be a number in [1.1754944e-38, inf), got '-3'"),
    ([*LOCATE, "--noise", "1e-320"], "argument --noise: must be a number in [1.1754944e-38, inf), got '1e-320' "
     "(below the smallest normal float32 a value cannot change a float32 weight)"),  # a denormal: noise of 0
    ([*LOCATE, "--samples", "0"], "argument --samples: must be an integer in [1, inf), got '0'"),
    ([*LOCATE, "--layer-curve", "0"], "argument --layer-curve: must be an integer in [1, inf), got '0'"),
])
def test_out_of_range_option_is_a_one_line_usage_error(capsys, argv, needle):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and needle in errors[0], err
    assert "Traceback" not in err


def test_in_range_values_parse():
    assert option(float, "(0, 100]")("100") == 100.0 and option(float, "(0, 100]")("0.5") == 0.5
    assert option(int, "[1, inf)")("1") == 1
    assert option(float, "(0, inf)")("3") == 3.0


def test_cli_subprocess_refuses_nan_without_traceback():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "editscope.cli", *KLOB, "--k", "nan"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("editscope bench klob: error: argument --k: must be a number in "
                                                    "[1.1754944e-38, 100], got 'nan'")
