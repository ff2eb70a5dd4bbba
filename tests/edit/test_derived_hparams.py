"""Hyperparameters for models without a shipped file: layers derived by proportional depth
from the published ROME/MEMIT choices of the family, with a warning saying how to override; methods without a
rule fail naming --hparams. The paper models' shipped files (GPT-2 XL, GPT-J 6B, Llama-3-8B) validate and stay
inside those models' depths, and hub ids / folder names of those models find them."""

from __future__ import annotations

import warnings

import pytest

from editscope.edit import get_editor
from editscope.edit.hparams import (
    LAYER_REFERENCES,
    DerivedHParamsWarning,
    config_root,
    derived_layers,
    load_yaml,
    resolve_hparams,
    shipped_hparams_path,
)
from editscope.errors import EditscopeError

#: n_layer / num_hidden_layers of the papers' models (their HF configs)
PAPER_DEPTHS = {"gpt2-xl": 48, "gpt-j-6b": 28, "llama3-8b": 32}
#: the layers the original configs edit, as published (kmeng01/rome, kmeng01/memit, jianghoucheng/AlphaEdit)
PUBLISHED = {
    ("rome", "gpt2-xl"): [17], ("rome", "gpt-j-6b"): [5], ("rome", "llama3-8b"): [5],
    ("memit", "gpt2-xl"): [13, 14, 15, 16, 17], ("memit", "gpt-j-6b"): [3, 4, 5, 6, 7, 8],
    ("memit", "llama3-8b"): [4, 5, 6, 7, 8], ("alphaedit", "gpt2-xl"): [13, 14, 15, 16, 17],
    ("alphaedit", "gpt-j-6b"): [3, 4, 5, 6, 7, 8], ("alphaedit", "llama3-8b"): [4, 5, 6, 7, 8],
    ("ft", "gpt2-xl"): [0], ("ft", "gpt-j-6b"): [0], ("ft", "llama3-8b"): [21],
}


def R(method: str):
    """The hparams class of ``method``: it declares the layer rule (LAYER_RULE) derived_layers follows."""
    return get_editor(method).hparams_class


def _hand(layer: int, ref_depth: int, n_layers: int) -> int:
    """floor(layer * n / D) by repeated subtraction, independent of the code's integer division."""
    product, out = layer * n_layers, 0
    while product >= ref_depth:
        product -= ref_depth
        out += 1
    return out


@pytest.mark.parametrize("family,depth", [(f, 4) for f in ("gpt2", "gptj", "llama", "gemma3", "llama3", "qwen3",
                                                            "gemma2", "phi3", "gpt_neox", "olmo2", "smollm3")])
def test_tiny_models_get_derived_layers(tiny_bundles, family, depth):
    bundle = tiny_bundles[family]
    assert bundle.n_layers == depth
    # families without a published config of their own (Gemma, Qwen3, Phi-3, OLMo 2, SmolLM3) follow Llama-3-8B's
    ref = LAYER_REFERENCES.get(bundle.arch.family, LAYER_REFERENCES["llama"])
    assert (bundle.arch.family in LAYER_REFERENCES) == (bundle.arch.family in ("gpt2", "gptj", "llama", "gpt_neox"))
    for method in ("rome", "memit", "alphaedit", "ft", "prune", "rect"):
        editor = get_editor(method)
        if not editor.supports(bundle.arch.family):
            continue
        name = f"unshipped-{family}"  # a local folder's name: no file under configs/hparams
        with pytest.warns(DerivedHParamsWarning) as caught:
            hp = resolve_hparams(method, editor.hparams_class, name, (bundle.arch.family, bundle.n_layers))
        if method in ("rome", "ft"):
            want = [_hand(ref.single, ref.depth, depth)]
        else:
            want = list(range(_hand(ref.window[0], ref.depth, depth), _hand(ref.window[1], ref.depth, depth) + 1))
        assert hp.layers == want and all(0 <= layer < depth for layer in hp.layers)
        message = str(caught[0].message)
        assert "derived" in message and "--hparams" in message and "--set layers" in message
        assert hp.to_dict() == editor.hparams_class(layers=want).to_dict()  # every other key: the class default


def test_hand_values_of_the_rule():
    # tiny GPT-2: floor(17*4/48) = 1, window floor(13*4/48)..floor(17*4/48) = 1..1
    assert derived_layers(R("rome"), "gpt2", 4)[0] == [1] and derived_layers(R("memit"), "gpt2", 4)[0] == [1]
    # tiny GPT-J: floor(5*4/28) = 0; window floor(12/28)..floor(32/28) = 0..1
    assert derived_layers(R("rome"), "gptj", 4)[0] == [0] and derived_layers(R("memit"), "gptj", 4)[0] == [0, 1]
    # SmolLM2 (llama, 30 layers): floor(150/32) = 4 (its shipped ROME layer); window floor(120/32)..floor(240/32)
    assert derived_layers(R("rome"), "llama", 30)[0] == [4]
    assert derived_layers(R("memit"), "llama", 30)[0] == [3, 4, 5, 6, 7]
    # the rule reproduces ROME's own published layers of GPT-2 medium (8 of 24) and large (12 of 36)
    assert derived_layers(R("rome"), "gpt2", 24)[0] == [8] and derived_layers(R("rome"), "gpt2", 36)[0] == [12]
    # and every published choice on its own reference model
    for (method, model), layers in PUBLISHED.items():
        family = {"gpt2-xl": "gpt2", "gpt-j-6b": "gptj", "llama3-8b": "llama"}[model]
        if method != "ft":
            assert derived_layers(R(method), family, PAPER_DEPTHS[model])[0] == layers
    assert derived_layers(R("kn"), "llama", 30) is None and derived_layers(R("mend"), "gpt2", 12) is None
    # GPT-NeoX-20B's own published layers (ROME 15 of 44, MEMIT 6-10), and Pythia-1.4B (24 layers) from them:
    # floor(15*24/44) = 8, window floor(144/44)..floor(240/44) = 3..5
    assert derived_layers(R("rome"), "gpt_neox", 44)[0] == [15]
    assert derived_layers(R("memit"), "gpt_neox", 44)[0] == [6, 7, 8, 9, 10]
    assert derived_layers(R("rome"), "gpt_neox", 24)[0] == [8]
    assert derived_layers(R("alphaedit"), "gpt_neox", 24)[0] == [3, 4, 5]
    # a family without published layers of its own follows Llama-3-8B's: Qwen3-0.6B (28 layers) gets floor(140/32)
    assert derived_layers(R("rome"), "qwen3", 28) == derived_layers(R("rome"), "llama", 28)
    assert derived_layers(R("rome"), "qwen3", 28)[0] == [4]


def test_no_rule_or_unknown_depth_names_hparams():
    with pytest.raises(EditscopeError, match=r"no hparams for kn .*no derivation rule.*pass --hparams FILE"):
        resolve_hparams("kn", get_editor("kn").hparams_class, "unshipped", ("llama", 4))
    with pytest.raises(EditscopeError, match=r"depth is unknown.*pass --hparams FILE"):
        get_editor("rome").load_hparams("unshipped")  # a name only, no loaded model


def test_overrides_apply_to_derived_and_are_named(tiny_bundles):
    arch = ("llama", 4)
    editor = get_editor("memit")
    with pytest.warns(DerivedHParamsWarning):
        hp = resolve_hparams("memit", editor.hparams_class, "x", arch, {"layers": [2, 3], "v_steps": 3})
    assert hp.layers == [2, 3] and hp.v_steps == 3
    with pytest.raises(EditscopeError, match=r"--set layers=\[9\] .*out of range 0\.\.3"):
        resolve_hparams("memit", editor.hparams_class, "x", arch, {"layers": [9]})


def test_shipped_file_wins_without_warning(tiny_bundles):
    bundle = tiny_bundles["gpt2"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DerivedHParamsWarning)
        hp = get_editor("rome").load_hparams(bundle)  # configs/hparams/rome/tiny.yaml
    assert hp.layers == [1] and hp.v_steps == 5


@pytest.mark.parametrize("model", ["openai-community/gpt2-xl", "EleutherAI/gpt-j-6B", "gpt2-xl",
                                   "meta-llama/Meta-Llama-3-8B-Instruct", "Meta-Llama-3-8B"])
def test_paper_models_by_hub_id_or_folder_name(model):
    path = shipped_hparams_path("memit", model)
    assert path is not None and path.stem in PAPER_DEPTHS
    assert shipped_hparams_path("memit", "someorg/other-model") is None


def test_every_paper_model_file_validates_within_depth():
    files = sorted(p for p in config_root().glob("*/*.yaml") if p.stem in PAPER_DEPTHS)
    assert {(p.parent.name, p.stem) for p in files} == set(PUBLISHED)
    for path in files:
        depth = PAPER_DEPTHS[path.stem]
        hp = load_yaml(path, get_editor(path.parent.name).hparams_class, None, depth)
        assert hp.layers == PUBLISHED[(path.parent.name, path.stem)]
        assert all(0 <= layer < depth for layer in hp.layers)
        text = path.read_text()
        assert "hparams/" in text and ".json" in text  # cites the original repo file
    with pytest.raises(EditscopeError, match="out of range"):  # the depth check bites on a smaller model
        load_yaml(config_root() / "rome" / "gpt2-xl.yaml", get_editor("rome").hparams_class, None, 12)


def test_every_editor_declares_its_layer_rule_on_its_hparams_class():
    """The rule lives with the editor: the ROME-like single-layer editors, the MEMIT family's window, the memory
    editors' own published layer, none for KN,
    MEND, UltraEdit and the layerless context editors (which need no layers)."""
    from editscope.edit.registry import EDITORS

    rules = {name: EDITORS[name].hparams_class.LAYER_RULE for name in EDITORS.names()}
    assert rules == {"rome": "single", "ft": "single", "grace": "own", "wise": "own", "memit": "window",
                     "prune": "window", "rect": "window", "alphaedit": "window", "evk_edit": "window", "kn": None,
                     "mend": None, "ultraedit": None, "prompt": None, "ike": None, "retrieval": None}


def test_tiny_models_share_one_file_per_method_unless_they_have_their_own():
    """``tiny.yaml`` holds every tiny test model's hparams; a ``tiny-NAME.yaml`` beside it wins for that model (KN's
    threshold on the families whose post-MLP norm flattens the attributions); no other model reads it."""
    assert shipped_hparams_path("rome", "tiny-qwen3") == config_root() / "rome" / "tiny.yaml"
    assert shipped_hparams_path("kn", "tiny-llama") == config_root() / "kn" / "tiny.yaml"
    assert shipped_hparams_path("kn", "tiny-gemma2") == config_root() / "kn" / "tiny-gemma2.yaml"
    own = load_yaml(shipped_hparams_path("kn", "tiny-gemma2"), get_editor("kn").hparams_class)
    assert own.adaptive_threshold == 0.1
    assert shipped_hparams_path("rome", "tinyllama-1.1b") is None
    assert shipped_hparams_path("grace", "tiny-llama") is None


def test_memory_editors_derive_their_own_published_late_layer():
    """GRACE and WISE follow their own published layer (EasyEdit's configs: both 27 of 32 on LLaMA-2-7B; on GPT-J
    GRACE 25 and WISE 21 of 28), not ROME's early one; a family without its own follows LLaMA-2-7B's."""
    grace, wise = R("grace"), R("wise")
    assert derived_layers(grace, "llama", 32)[0] == [27] and derived_layers(wise, "llama", 32)[0] == [27]
    assert derived_layers(grace, "gptj", 28)[0] == [25] and derived_layers(wise, "gptj", 28)[0] == [21]
    # SmolLM2 (30 layers): the shipped GRACE and WISE layer 25; Qwen2.5-Coder-1.5B (28): 23
    assert derived_layers(grace, "llama", 30)[0] == [_hand(27, 32, 30)] == [25]
    assert derived_layers(wise, "llama", 28)[0] == [_hand(27, 32, 28)] == [23]
    for method, cls in (("grace", grace), ("wise", wise)):
        assert load_yaml(shipped_hparams_path(method, "smollm2-135m"), cls).layers == [25]
    assert derived_layers(grace, "gpt2", 48) == derived_layers(grace, "llama", 48)
    layers, how = derived_layers(wise, "gptj", 12)
    assert layers == [_hand(21, 28, 12)] and "WISE's layer 21 of 28 on GPT-J 6B" in how and "gpt-j-6B.yaml" in how
    with pytest.warns(DerivedHParamsWarning, match=r"derived layers \[3\].*GRACE's layer 27 of 32"):
        hp = resolve_hparams("grace", grace, "unshipped-llama", ("llama", 4))
    assert hp.layers == [3]
