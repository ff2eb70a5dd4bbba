"""Device and dtype cleanliness. No GPU here, so two stand-ins for "nothing assumes CPU":

* a static scan: in the engine, editor, statistics and locating modules every tensor *constructor* names its
  ``device=`` (or carries a ``# host`` comment saying why it may stay on the host, e.g. a seeded CPU generator's
  noise moved right after, or an empty placeholder). Index tensors built with ``torch.tensor`` may stay on the
  host: PyTorch moves CPU index tensors to the indexed tensor's device.
* a static scan of the whole package: every ``.numpy()`` reads a tensor already on the host (``.cpu()`` in its
  receiver chain, or a ``# host`` comment saying why it is there). The first run on a real GPU found such a call
  in the EVK suite, outside the modules the constructor scan covered.
* a bfloat16 model on CPU: the same class of bug (a float32 tensor meeting bfloat16 weights) fails loudly, and an
  edit + evaluation must give the float32 numbers within bfloat16's precision.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import editscope
from editscope.data.records import EditRequest
from editscope.edit import get_editor
from editscope.lm import load
from editscope.lm.engine import ScoringEngine
from editscope.stats.second_moment import second_moment

SRC = Path(editscope.__file__).parent
#: modules whose tensors meet the model's activations and weights (MEND's nets are nn.Modules moved as a whole)
SCANNED = ["lm/engine.py", "edit/*.py", "edit/plugins/*.py", "stats/*.py", "locate/causal_trace.py",
           "locate/attribution.py"]
CONSTRUCTORS = {"zeros", "ones", "full", "empty", "eye", "arange", "rand", "randn", "randint", "linspace"}


def scan(path: Path, root: Path, flag: Callable[[ast.Call], str | None]) -> list[str]:
    """``path:line: message`` for each call ``flag`` names, unless a ``# host`` comment on its lines says why."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        message = flag(node) if isinstance(node, ast.Call) else None
        if message and not any("# host" in lines[i - 1] for i in range(node.lineno, node.end_lineno + 1)):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {message}")
    return found


def bare_constructor(node: ast.Call) -> str | None:
    """``torch.<constructor>(...)`` without ``device=``."""
    func = node.func
    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch"
            and func.attr in CONSTRUCTORS and not any(k.arg == "device" for k in node.keywords)):
        return f"torch.{func.attr}(...) without device="
    return None


def device_numpy(node: ast.Call) -> str | None:
    """``X.numpy()`` without ``.cpu()`` in X's call chain."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "numpy"):
        return None
    chain = node.func.value
    while isinstance(chain, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(chain, ast.Call) and isinstance(chain.func, ast.Attribute) and chain.func.attr == "cpu":
            return None
        chain = chain.func if isinstance(chain, ast.Call) else chain.value
    return ".numpy() of a tensor that may be on the GPU"


def host_constructors(path: Path, root: Path = SRC) -> list[str]:
    return scan(path, root, bare_constructor)


def device_numpy_calls(path: Path, root: Path = SRC) -> list[str]:
    return scan(path, root, device_numpy)


@pytest.mark.parametrize(("scanner", "source", "flagged"), [
    (host_constructors, "import torch\nx = torch.zeros(3)\ny = torch.ones(2, device=x.device)\n"
     "z = torch.eye(2)  # host\nw = torch.full(\n    (2,), 1.0,\n)\n",
     ["m.py:2: torch.zeros(...) without device=", "m.py:5: torch.full(...) without device="]),
    (device_numpy_calls, "a = h[:, 0].float().numpy()\nb = h[:, 0].float().cpu().numpy()\nc = t.numpy()  # host\n"
     "d = f(x.cpu()).numpy()\ne = x.cpu()[0].numpy()\n",
     ["m.py:1: .numpy() of a tensor that may be on the GPU", "m.py:4: .numpy() of a tensor that may be on the GPU"]),
])
def test_scanners_flag_what_they_should(tmp_path, scanner, source, flagged):
    bad = tmp_path / "m.py"
    bad.write_text(source)
    assert scanner(bad, tmp_path) == flagged


def test_no_tensor_constructor_assumes_the_host():
    files = sorted({p for pattern in SCANNED for p in SRC.glob(pattern)})
    assert len(files) > 15
    problems = [msg for path in files for msg in host_constructors(path)]
    assert not problems, "\n".join(problems)


def test_no_numpy_call_assumes_the_host():
    problems = [msg for path in sorted(SRC.rglob("*.py")) for msg in device_numpy_calls(path)]
    assert not problems, "\n".join(problems)


REQUEST = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")
PAIRS = [("Danielle Darrieux is a citizen of", " Japan"), ("Danielle Darrieux is a citizen of", " France"),
         ("Danielle Darrieux's citizenship is", " Japan")]


def edit_and_score(method: str, dtype: str) -> tuple[list[float], list[float], torch.dtype]:
    bundle = load("tiny-llama", dtype=dtype)
    engine, editor = ScoringEngine(bundle), get_editor(method)
    before = {n: p.detach().clone() for n, p in bundle.model.named_parameters()}
    pre = [s.mean for s in engine.score(PAIRS)]
    patch = editor.apply(bundle, REQUEST, state=editor.new_state(), engine=engine)
    post = [s.mean for s in engine.score(PAIRS)]
    patch.revert(bundle)
    assert all(torch.equal(p, before[n]) for n, p in bundle.model.named_parameters())
    return pre, post, next(bundle.model.parameters()).dtype


@pytest.mark.parametrize("method", ["rome", "memit"])
def test_bfloat16_edit_and_evaluation_match_float32(method):
    """Tolerance: bfloat16 keeps 8 significant bits (relative rounding 2⁻⁹ ≈ 0.2 % per operation); over the tiny
    model's forward the mean log-probs (≈ -11) moved by at most 0.03 when measured, so 0.05 + 1 % is allowed."""
    pre32, post32, _ = edit_and_score(method, "float32")
    pre16, post16, dtype = edit_and_score(method, "bfloat16")
    assert dtype == torch.bfloat16
    for got, want in zip(pre16 + post16, pre32 + post32, strict=True):
        assert abs(got - want) <= 0.05 + 0.01 * abs(want), (got, want)
    assert post32[0] > pre32[0] and post16[0] > pre16[0]  # the edit moved target_new up in both precisions
    if method == "rome":  # a large edit: its effect agrees to 10 %
        assert abs((post16[0] - pre16[0]) - (post32[0] - pre32[0])) <= 0.1 * (post32[0] - pre32[0])


def test_statistics_stay_float64_for_a_bfloat16_model():
    c32 = second_moment(load("tiny-llama"), 1, token_budget=1024, progress=False, use_cache=False)
    c16 = second_moment(load("tiny-llama", dtype="bfloat16"), 1, token_budget=1024, progress=False, use_cache=False)
    assert c16.dtype == torch.float64 and c16.device.type == "cpu"
    assert float((c16 - c32).norm() / c32.norm()) < 0.03  # bfloat16 keys, float64 sums
