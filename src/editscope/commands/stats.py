"""``editscope stats compute|list|export|import``: layer statistics C = E[k kᵀ] as a shareable artefact.

- ``compute --model M --layers L... [--corpus PATH...] [--field F] [--budget N] [--seq-len N]
  [--stats-dtype float64|float32]`` computes (or reads from the cache) the statistics of each layer, with a
  progress bar. A corpus is text files, folders of .txt files, or JSONL files with --field naming the text;
  default wikitext-2. float32 halves C (cached separately; the hparams key ``mom2_dtype`` makes editors read it).
- ``list [--model M] [--json]`` shows the cache: fingerprint, model, layer, corpus digest, tokens, seconds, size.
- ``export --model M --out FILE [--layers L...] [--corpus-digest D] [--budget N] [--stats-dtype D]`` writes
  cached layers to one safetensors file (one corpus/budget/precision setting; the error lists the cached ones when
  there are several).
- ``import FILE --model M`` checks the file against M (fingerprint, dimensions, weights and content checksums)
  and puts its layers into the cache, where edits find them.
"""

from __future__ import annotations

import argparse

from editscope.commands._device import add_device_arguments
from editscope.commands._trust import add_trust_argument
from editscope.ranges import option

#: the token budget's range (the hparams key ``mom2_tokens`` declares the same) and the row length's
BUDGET, SEQ_LEN = "[1, 1e12]", "[1, 1000000]"


HELP = "compute, list, export or import layer statistics"


def register(sub: argparse._SubParsersAction) -> None:
    from editscope.stats.settings import DEFAULT_SEQ_LEN, DEFAULT_STATS_DTYPE, DEFAULT_TOKEN_BUDGET, STATS_DTYPE_NAMES

    parser = sub.add_parser("stats", help=HELP,
                            description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    compute = actions.add_parser("compute", help="compute layer statistics (cached)")
    compute.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    add_device_arguments(compute)
    compute.add_argument("--layers", type=int, nargs="+", required=True)
    compute.add_argument("--corpus", nargs="*", default=[], help="text files, folders of .txt, or JSONL files")
    compute.add_argument("--field", help="JSONL field holding the text")
    # 0 is refused, not read as "the default": a budget or row length of 0 tokens cannot give statistics
    compute.add_argument("--budget", type=option(int, BUDGET), default=None,
                         help=f"tokens, in {BUDGET} (default: the editors' default, {DEFAULT_TOKEN_BUDGET})")
    compute.add_argument("--seq-len", type=option(int, SEQ_LEN), default=None,
                         help=f"tokens per row, in {SEQ_LEN} (default: {DEFAULT_SEQ_LEN})")
    compute.add_argument("--stats-dtype", choices=list(STATS_DTYPE_NAMES), default=DEFAULT_STATS_DTYPE,
                         help="precision C is summed and cached in (the hparams key mom2_dtype; default "
                              f"{DEFAULT_STATS_DTYPE}; float32 halves C, relative error ~1e-7, docs/scale.md)")
    compute.set_defaults(func=run_compute)
    lst = actions.add_parser("list", help="list cached statistics")
    lst.add_argument("--model", help="only this model's (current weights) statistics")
    add_device_arguments(lst)
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=run_list)
    export = actions.add_parser("export", help="write cached statistics to one safetensors file")
    export.add_argument("--model", required=True)
    add_device_arguments(export)
    export.add_argument("--out", required=True)
    export.add_argument("--layers", type=int, nargs="+")
    export.add_argument("--corpus-digest", help="which corpus, when several are cached")
    export.add_argument("--budget", type=option(int, BUDGET), default=None,
                        help="which token budget, when several are cached (e.g. the demo's and an editor's)")
    export.add_argument("--stats-dtype", choices=list(STATS_DTYPE_NAMES), default=None,
                        help="which precision, when both are cached")
    export.set_defaults(func=run_export)
    imp = actions.add_parser("import", help="check an exported file against a model and cache its layers")
    imp.add_argument("file")
    imp.add_argument("--model", required=True)
    add_trust_argument(imp, "the export file; recorded in each cache file written as unverified_source")
    add_device_arguments(imp)
    imp.set_defaults(func=run_import)


def run_compute(args: argparse.Namespace) -> int:
    from editscope.finite import fmt
    from editscope.lm import load
    from editscope.stats import second_moments
    from editscope.stats.artefact import corpus_from

    corpus = corpus_from(args.corpus, args.field)
    bundle = load(args.model, device=args.device, dtype=args.dtype)
    from editscope.stats.settings import DEFAULT_SEQ_LEN, DEFAULT_TOKEN_BUDGET

    budget = DEFAULT_TOKEN_BUDGET if args.budget is None else args.budget
    seq_len = DEFAULT_SEQ_LEN if args.seq_len is None else args.seq_len
    stats = second_moments(bundle, args.layers, corpus=corpus, token_budget=budget, seq_len=seq_len, progress=True,
                           stats_dtype=args.stats_dtype)
    for layer, mom2 in sorted(stats.items()):
        trace = fmt(float(mom2.trace()), ".6g", f"stats compute: layer {layer}: trace")
        print(f"layer {layer}: C {tuple(mom2.shape)} {args.stats_dtype}  trace {trace}  corpus {corpus.digest}  "
              f"model {bundle.name} ({bundle.fingerprint})")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from editscope.finite import strict_dumps
    from editscope.stats.artefact import as_dicts, list_cached

    fingerprint = None
    if args.model:
        from editscope.lm import load

        fingerprint = load(args.model, device=args.device, dtype=args.dtype).fingerprint
    stats = list_cached(fingerprint)
    if args.json:
        print(strict_dumps(as_dicts(stats), "stats list --json", indent=1))
        return 0
    print(f"{'fingerprint':<34} {'model':<16} {'layer':>5} {'corpus':<24} {'budget':>8} {'seq':>5} {'dtype':>7} "
          f"{'tokens':>8} {'seconds':>8} {'MB':>7}")
    for s in stats:
        print(f"{s.fingerprint:<34} {s.model[:16]:<16} {s.layer:>5} {s.corpus:<24} {s.token_budget:>8} "
              f"{s.seq_len:>5} {s.stats_dtype:>7} {s.tokens:>8} {s.seconds:>8.1f} {s.bytes / 1e6:>7.2f}")
    if not stats:
        print("(no cached statistics)")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from editscope.lm import load
    from editscope.stats.artefact import export_stats

    bundle = load(args.model, device=args.device, dtype=args.dtype)
    chosen = export_stats(bundle.fingerprint, args.out, layers=args.layers, corpus=args.corpus_digest,
                          token_budget=args.budget, stats_dtype=args.stats_dtype)
    first = chosen[0]
    print(f"wrote {len(chosen)} layer(s) ({', '.join(str(s.layer) for s in chosen)}) of {bundle.name} to {args.out}: "
          f"corpus {first.corpus}, {first.token_budget} tokens, rows of {first.seq_len}, {first.stats_dtype}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from editscope.lm import load
    from editscope.stats.artefact import import_stats

    bundle = load(args.model, device=args.device, dtype=args.dtype)
    written = import_stats(bundle, args.file, trust_unverified=args.trust_unverified)
    for path in written:
        print(f"cached {path}")
    return 0
