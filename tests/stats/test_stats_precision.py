"""Statistics precision and memory: float32 (compensated) accumulation against an independent float64 C, the
precision as part of the cache key, and the accumulation's memory independent of the token budget."""

from __future__ import annotations

import importlib
import shutil
import warnings
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.hooks import capture
from editscope.stats import Corpus, accumulate, cache_file, corpus_rows, second_moments

sm = importlib.import_module("editscope.stats.second_moment")
EPS32 = float(torch.finfo(torch.float32).eps)  # 2^-23
BUDGET, SEQ = 256, 32


@pytest.fixture
def stats_home(tiny_bundles, monkeypatch, tmp_path):
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))
    return tmp_path


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def realistic_keys(n: int, d: int, seed: int) -> torch.Tensor:
    """MLP-key-like activations: small dense values with a mean offset, and a few hundred-fold outliers in a few
    dimensions (the massive activations of LLM MLPs)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, d, generator=g) * 0.3 + 0.05
    tokens = torch.randint(0, n, (n // 500,), generator=g)
    dims = torch.randint(0, d, (8,), generator=g)
    keys[tokens[:, None], dims[None, :]] *= 80.0
    return keys


def test_compensated_sum_keeps_the_error_of_one_rounding():
    """Kahan: 8,192 float32 terms summed with compensation are within 2 eps of the float64 sum of the same terms,
    while a plain float32 running sum of them has drifted far past that (so the compensation is what holds it)."""
    g = torch.Generator().manual_seed(0)
    terms = torch.rand(8192, 8, 8, generator=g) + 0.5
    want = terms.double().sum(0)
    acc = sm.CompensatedSum(8, "cpu")
    plain = torch.zeros(8, 8)
    for term in terms:
        plain += term
        acc.add_(term.clone())
    assert acc.total.dtype == torch.float32
    assert rel(acc.total, want) <= 2 * EPS32
    assert rel(plain, want) > 20 * rel(acc.total, want)


@pytest.mark.parametrize("n_chunks", [8, 64])
def test_float32_statistics_error_bound(n_chunks):
    """C summed in float32 (1,024-token float32 products, compensated sum, mean) against keysᵀkeys / n computed in
    float64 from the same keys. Bound: each product entry is a 1,024-term float32 dot product (rounding ~√m·u
    relative typically, measured ~1e-7 of ‖C‖), the compensated sum adds ~2u and the division u, none growing with
    the number of chunks: 4·eps32 = 4.8e-7 relative Frobenius, with ~4x margin over the measured ~1.1e-7."""
    d = 384
    keys = realistic_keys(n_chunks * sm.OUTER_CHUNK, d, seed=n_chunks)
    want = keys.double().T @ keys.double() / keys.shape[0]
    acc = sm.CompensatedSum(d, "cpu")
    for start in range(0, keys.shape[0], 2048):  # one forward batch of 8 x 256 tokens at a time, as accumulate
        sm.add_outer(acc, keys[start:start + 2048])
    got = sm.mean_of(acc, keys.shape[0])
    assert got.dtype == torch.float32
    assert rel(got, want) < 4 * EPS32
    assert torch.equal(got, got.T)


def independent_c(bundle, rows: torch.Tensor, layer: int) -> torch.Tensor:
    """Every key of the layer read by a capture hook over full forwards, then keysᵀkeys / n in float64."""
    name = f"blocks.{layer}.mlp_key"
    keys = []
    for row in rows:
        with torch.no_grad(), capture(bundle.model, bundle.arch, [name]) as store:
            bundle.model(input_ids=row[None].to(bundle.device))
        keys.append(store[name][0].double().cpu())
    k = torch.cat(keys)
    return k.T @ k / k.shape[0]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_float32_second_moments_of_a_model(tiny_bundles, stats_home, family):
    bundle = tiny_bundles[family]
    rows = corpus_rows(ScoringEngine(bundle), Corpus.default(), BUDGET, SEQ)
    got = second_moments(bundle, [1, 2], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float32")
    for layer in (1, 2):
        want = independent_c(bundle, rows, layer)
        assert got[layer].dtype == torch.float32
        assert rel(got[layer], want) < 1e-5  # the forward's own float32 rounding of k dominates here
    path = cache_file(bundle.fingerprint, 1, Corpus.default().digest, BUDGET, SEQ, "float32")
    assert path.is_file() and path.parent.name.endswith("-f32")
    assert not cache_file(bundle.fingerprint, 1, Corpus.default().digest, BUDGET, SEQ).exists()
    again = second_moments(bundle, [1], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float32")
    assert torch.equal(again[1], got[1])


def test_precision_is_part_of_the_cache_key(tiny_bundles, stats_home):
    """float64 and float32 are two files; a float64 file found under the float32 key is recomputed, not served."""
    bundle = tiny_bundles["llama"]
    c64 = second_moments(bundle, [2], token_budget=BUDGET, seq_len=SEQ, progress=False)[2]
    c32 = second_moments(bundle, [2], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float32")[2]
    assert c64.dtype == torch.float64 and c32.dtype == torch.float32
    assert rel(c32, c64) < 1e-6
    f64 = cache_file(bundle.fingerprint, 2, Corpus.default().digest, BUDGET, SEQ)
    f32 = cache_file(bundle.fingerprint, 2, Corpus.default().digest, BUDGET, SEQ, "float32")
    assert f64 != f32 and f64.is_file() and f32.is_file()
    shutil.copyfile(f64, f32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = second_moments(bundle, [2], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float32")[2]
    assert back.dtype == torch.float32 and torch.equal(back, c32)
    assert any("was built for stats_dtype 'float64', not 'float32'" in str(w.message) for w in caught)
    with pytest.raises(EditscopeError, match="statistics dtype must be one of float64, float32, got 'float16'"):
        second_moments(bundle, [2], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float16")


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors that ops allocate and that are still alive, and their peak: an op's output counts when
    its storage is none of its inputs' (views and in-place results allocate nothing) and stops counting when the
    tensor is freed. Deterministic: no clock, no allocator state."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            if size and key not in inputs and key not in self.live:
                self.live[key] = size
                self.now += size
                self.peak = max(self.peak, self.now)
                weakref.finalize(t, self._free, key)
        return out


@pytest.mark.parametrize("stats_dtype", ["float64", "float32"])
def test_accumulation_memory_does_not_grow_with_the_budget(tiny_bundles, stats_dtype):
    """The pass holds the per-layer sums, one batch's activations and one k kᵀ product whatever the budget: the
    peak of live allocations with a 4x larger budget equals the smaller one's, and stays below the sums plus one
    product plus a generous bound on one batch's activations."""
    bundle = tiny_bundles["llama"]
    d = bundle.arch.mlp_size(bundle.config)
    hidden = bundle.config.hidden_size
    g = torch.Generator().manual_seed(0)
    peaks = []
    for n_rows in (4, 16):
        rows = torch.randint(0, 1000, (n_rows, SEQ), generator=g)
        with LiveBytes() as mem:
            sums, count = accumulate(bundle, rows, [1, 2], batch_rows=2, progress=False, stats_dtype=stats_dtype)
        assert count == n_rows * SEQ
        peaks.append(mem.peak)
        del sums
    assert peaks[1] == peaks[0]
    sums_bytes = 2 * d * d * 8  # float64 sum, or float32 sum + compensation
    batch_tokens = 2 * SEQ
    activations = 32 * batch_tokens * max(d, hidden) * 4  # 32 live [tokens, width] float32 tensors: generous
    assert sums_bytes < peaks[0] <= sums_bytes + d * d * 4 + activations


def test_float32_export_import_round_trip(tiny_bundles, stats_home, monkeypatch, tmp_path):
    """Both precisions cached: export names the option that picks each; the float32 file imports elsewhere as the
    same matrix under the float32 key; a file whose recorded precision is not its matrix's is refused in one line."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from editscope.integrity import seal
    from editscope.stats.artefact import export_stats, import_stats, list_cached

    bundle = tiny_bundles["llama"]
    c32 = second_moments(bundle, [1], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float32")[1]
    second_moments(bundle, [1], token_budget=BUDGET, seq_len=SEQ, progress=False)
    out = tmp_path / "s32.safetensors"
    with pytest.raises(EditscopeError, match=r"2 statistics settings.*--stats-dtype float32 \(rows of 32 tokens"):
        export_stats(bundle.fingerprint, out)
    export_stats(bundle.fingerprint, out, stats_dtype="float32")
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "other"))
    import_stats(bundle, out)
    assert [(s.layer, s.stats_dtype) for s in list_cached()] == [(1, "float32")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read from the imported file, not recomputed
        back = second_moments(bundle, [1], token_budget=BUDGET, seq_len=SEQ, progress=False, stats_dtype="float32")
    assert torch.equal(back[1], c32)
    with safe_open(str(out), framework="pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(out))
    as64 = {**tensors, "layer1.mom2": tensors["layer1.mom2"].double()}
    wrong = tmp_path / "wrong.safetensors"
    save_file(as64, str(wrong), metadata=seal(meta, as64))
    with pytest.raises(EditscopeError, match=r"wrong.safetensors: layer 1: a torch.float64 matrix, but its field "
                                             r"'stats_dtype' says float32"):
        import_stats(bundle, wrong)


def test_hparams_key_mom2_dtype(tmp_path):
    from editscope.edit import parse_overrides
    from editscope.edit.hparams import load_yaml
    from editscope.edit.memit import MemitHParams

    path = tmp_path / "h.yaml"
    path.write_text("layers: [1, 2]\nmom2_dtype: float16\n")
    with pytest.raises(EditscopeError, match=r"h\.yaml: key 'mom2_dtype': must be one of float64, float32, got "
                                             r"'float16'"):
        load_yaml(path, MemitHParams)
    path.write_text("layers: [1, 2]\n")
    hp = load_yaml(path, MemitHParams, parse_overrides(["mom2_dtype=float32"]))
    assert hp.stats_dtype() == "float32" and hp.to_dict()["mom2_dtype"] == "float32"  # what every row records
    assert load_yaml(path, MemitHParams).mom2_dtype == "float64"


@pytest.mark.parametrize("method", ["memit", "rome"])
def test_editors_solve_with_the_precision_they_are_given(tiny_bundles, stats_home, method):
    """The same edit with mom2_dtype float64 and float32: the float32 statistics are computed (and cached under
    their own key) and the update, solved in float64 either way, moves by no more than C's rounding allows."""
    from editscope.data.records import EditRequest
    from editscope.edit import get_editor

    bundle = tiny_bundles["llama"]
    editor = get_editor(method)
    hp = editor.load_hparams(bundle).replace(mom2_tokens=BUDGET, v_steps=3)
    req = EditRequest("{} is a citizen of", "Danielle Darrieux", "Japan", "France")
    deltas = {}
    for dtype in ("float64", "float32"):
        patch = editor.apply(bundle, req, hp.replace(mom2_dtype=dtype), editor.new_state())
        deltas[dtype] = {name: d.double().clone() for name, d in patch.deltas.items()}
        patch.revert(bundle)
    for layer in hp.layers:
        assert cache_file(bundle.fingerprint, layer, Corpus.default().digest, BUDGET, 256, "float32").is_file()
    num = sum(float((deltas["float32"][n] - deltas["float64"][n]).norm() ** 2) for n in deltas["float64"]) ** 0.5
    den = sum(float(d.norm() ** 2) for d in deltas["float64"].values()) ** 0.5
    assert den > 0 and num / den < 1e-3
