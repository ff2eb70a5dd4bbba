"""DESIGN rule 4: metrics are pure -- importing them needs neither torch nor a model."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from editscope.metrics import MetricInputError
from editscope.metrics._validate import as_groups


def test_importing_metrics_does_not_import_torch():
    code = "import sys, editscope.metrics; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_metric_errors_are_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="^xs: contains NaN or inf") as info:
        as_groups([1.0, float("nan")], "xs")
    assert isinstance(info.value, MetricInputError)


def test_groups_layouts():
    assert [g.tolist() for g in as_groups([1, 2], "x")] == [[1.0, 2.0]]
    assert [g.tolist() for g in as_groups([[1], [2, 3]], "x")] == [[1.0], [2.0, 3.0]]
    assert [g.tolist() for g in as_groups(np.ones((2, 1)), "x")] == [[1.0], [1.0]]
    with pytest.raises(ValueError, match=r"^x\[1\]: is empty"):
        as_groups([[1], []], "x")


@pytest.mark.parametrize("module", ["editscope.tables", "editscope.run.store", "editscope.run.archive",
                                    "editscope.integrity", "editscope.run.summary", "editscope.run.summary_tables",
                                    "editscope.run.merge", "editscope.suites", "editscope.report",
                                    "editscope.report.findings", "editscope.report.reproduction",
                                    "editscope.commands.report"])
def test_the_results_and_report_load_no_model_library(module):
    """The results (store, archives, merge, summary), the suite registry, the table model and the report (with its
    command) are read without torch or transformers: the run and model packages load their modules on first use,
    and a suite imports torch only inside what runs on a model."""
    code = f"import sys, {module}; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("module", ["editscope.run.config", "editscope.run.plan", "editscope.run.blocks",
                                    "editscope.run.planned", "editscope.run.budget", "editscope.edit.budget",
                                    "editscope.edit.hparams", "editscope.lm.archs", "editscope.stats.settings"])
def test_what_to_run_loads_no_model_library(module):
    """What to run -- the config and its modes, seeds and blocks, the planner, the budget check and the hparams it
    reads, the architecture maps -- is decided without torch or transformers: the edit and stats packages load their
    modules on first use, and the maps name torch types for type checking only."""
    code = f"import sys, {module}; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_package_names_are_the_defining_modules_objects():
    code = ("import sys, editscope.lm as lm, editscope.run as run\n"
            "assert 'torch' not in sys.modules\n"
            "from editscope.lm.archs import ARCHS\n"
            "from editscope.run.runner import Runner\n"
            "assert lm.ARCHS is ARCHS and run.Runner is Runner and 'ARCHS' in vars(lm)\n"
            "try:\n    lm.no_such_name\nexcept AttributeError as e:\n"
            "    assert str(e) == \"module 'editscope.lm' has no attribute 'no_such_name'\"\n"
            "else:\n    raise AssertionError('no error')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
