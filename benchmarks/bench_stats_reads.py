"""What an edit pays to read its cached layer statistics: every digest computed on every read (before) against
once per file and process (now, :class:`editscope.stats.second_moment._VerifiedFiles`).

ROME and the MEMIT family read C of their layers at every edit. The cache file is sealed (a sha256 over its
tensors and metadata) and carries a content checksum (blake2b of C); verifying both on every read cost ~8 GB of
hashing twice per MEMIT edit on an 8B model. A random-init Llama of ``--d-ff`` MLP width (C is d_ff² float64 per
layer) has its statistics computed for ``--layers``, then both ways of reading them are timed ``--rounds`` times,
interleaved, keeping the fastest: the baseline forgets every verification (the earlier behaviour), the default
remembers it. Prints seconds per read of each and ``speedup X.XX``; the values read are checked bit-equal. Usage:

    python benchmarks/bench_stats_reads.py [--d-ff 8192] [--layers 4,5,6,7,8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time

import torch

sm = importlib.import_module("editscope.stats.second_moment")  # the package attribute is the function


def build(d_ff: int, n_layers: int):
    import transformers
    from transformers import AutoModelForCausalLM

    from editscope.lm.bundle import finish
    from editscope.lm.tiny import gpt2_tokenizer

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=d_ff, num_hidden_layers=n_layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50257,
                                      max_position_embeddings=512, bos_token_id=50256, eos_token_id=50256)
    torch.manual_seed(0)
    return finish(AutoModelForCausalLM.from_config(config), gpt2_tokenizer(), f"bench-dff{d_ff}", "random init")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-ff", type=int, default=8192)
    parser.add_argument("--layers", default="4,5,6,7,8")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    with tempfile.TemporaryDirectory() as home:
        os.environ["EDITSCOPE_HOME"] = home
        bundle = build(args.d_ff, max(layers) + 1)
        read = lambda: sm.second_moments(bundle, layers, token_budget=args.tokens, progress=False)  # noqa: E731
        reference = read()
        old = time.time_ns() - 10**10  # files written 10 s ago: past the racy window, as between two edits
        for path in (sm.cache_file(bundle.fingerprint, layer, sm.Corpus.default().digest, args.tokens,
                                   sm.DEFAULT_SEQ_LEN) for layer in layers):
            os.utime(path, ns=(old, old))
        best = {"every read verified (before)": float("inf"), "verified once (now)": float("inf")}
        for _ in range(args.rounds):
            for label in best:
                if label.startswith("every"):
                    sm._VERIFIED = sm._VerifiedFiles(limit=0)  # remembers nothing: the earlier behaviour
                else:
                    sm._VERIFIED = sm._VerifiedFiles()
                    read()  # the one verification this process makes
                start = time.perf_counter()
                got = read()
                best[label] = min(best[label], time.perf_counter() - start)
                assert all(torch.equal(got[k], reference[k]) for k in reference)
    mib = sum(c.numel() * c.element_size() for c in reference.values()) / 2**20
    print(f"C of layers {layers}, d_ff {args.d_ff}: {mib:.0f} MiB read per edit")
    for label, seconds in best.items():
        print(f"{label:<30} {seconds:.3f} s per read")
    print(f"speedup {best['every read verified (before)'] / best['verified once (now)']:.2f}")


if __name__ == "__main__":
    main()
