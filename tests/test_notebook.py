"""examples/quickstart.ipynb: stored without outputs, and its code cells run in order, end to end, in a fresh Python
process on tiny-llama (fast) and on SmolLM2-135M (slow). No Jupyter kernel: the cells use no IPython magics, so
running them as one script is what a kernel would do, and the test needs only json. The notebook's own asserts check
that every edit raised the log-prob of target_new and that the saved patch round-trips bit-exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import editscope

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"

# Appended after the last cell: the plot exists and says what its axes are.
PLOT_CHECK = """
import matplotlib.pyplot as plt
(ax,) = plt.gcf().axes
assert ax.get_xlabel() and ax.get_ylabel() and len(ax.patches) == 2 * len(rows), "the plot is not as described"
print("notebook test: done")
"""


def _notebook() -> dict:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))


def _code_cells(nb: dict) -> list[str]:
    return ["".join(cell["source"]) for cell in nb["cells"] if cell["cell_type"] == "code"]


def test_notebook_is_stored_stripped_and_runs_as_plain_python():
    nb = _notebook()
    assert nb["nbformat"] == 4 and "widgets" not in nb["metadata"]
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert code
    for i, cell in enumerate(code):
        assert cell["outputs"] == [], f"code cell {i} has stored outputs: clear them before committing"
        assert cell["execution_count"] is None, f"code cell {i} has an execution count: clear it before committing"
        assert "execution" not in cell.get("metadata", {}), f"code cell {i} stores execution timings"
    for i, source in enumerate(_code_cells(nb)):
        magics = [line for line in source.splitlines() if line.lstrip().startswith(("%", "!"))]
        assert not magics, f"code cell {i} uses IPython syntax the test cannot run as Python: {magics}"
        compile(source, f"<cell {i}>", "exec")


def _run_notebook(model: str, tmp_path: Path, timeout: int) -> str:
    script = tmp_path / "quickstart.py"
    script.write_text("\n\n".join(_code_cells(_notebook())) + "\n" + PLOT_CHECK, encoding="utf-8")
    src = str(Path(editscope.__file__).resolve().parents[1])  # the editscope this test imports
    env = {**os.environ, "EDITSCOPE_NOTEBOOK_MODEL": model, "MPLBACKEND": "Agg", "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]),
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"the notebook failed on {model}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_notebook_runs_end_to_end_on_tiny_llama(tmp_path):
    out = _run_notebook("tiny-llama", tmp_path, timeout=300)
    assert "tiny-llama" in out and "patch round trip: bit-exact" in out and out.endswith("notebook test: done\n")
    assert len(list(tmp_path.glob("editscope-quickstart-*/rome-darrieux.safetensors"))) == 1  # under TMPDIR


@pytest.mark.slow
def test_notebook_runs_end_to_end_on_smollm2(tmp_path):
    out = _run_notebook("smollm2-135m", tmp_path, timeout=1800)
    assert "smollm2-135m" in out and "patch round trip: bit-exact" in out and out.endswith("notebook test: done\n")
