"""``editscope patch export``: the edited model as a Hugging Face folder that plain ``AutoModelForCausalLM``
loads, with logits equal to the in-memory edited model's."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from editscope.cli import main
from editscope.edit import edited


def test_export_loads_in_transformers_with_equal_logits(tiny_bundles, request_a, tmp_path):
    bundle = tiny_bundles["llama"]
    ids = bundle.tokenizer("Danielle Darrieux is a citizen of", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = bundle.model(input_ids=ids.to(bundle.device)).logits
    with edited(bundle, "rome", request_a) as patch:
        with torch.no_grad():
            expected = bundle.model(input_ids=ids.to(bundle.device)).logits
        patch_file = patch.save(tmp_path / "p.safetensors")
    assert not torch.equal(expected, before)  # the edit changed the output
    out = tmp_path / "exported"
    assert main(["patch", "export", str(patch_file), "--model", "tiny-llama", "--out", str(out)]) == 0
    assert any(out.glob("*.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval().to(bundle.device)  # as the bundle
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert torch.equal(tokenizer("Danielle Darrieux is a citizen of", return_tensors="pt")["input_ids"], ids)
    with torch.no_grad():
        got = model(input_ids=ids.to(bundle.device)).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
