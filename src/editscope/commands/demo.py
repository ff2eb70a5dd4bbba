"""``editscope demo``: MEMIT and AlphaEdit on SmolLM2-135M through all four suites, then the report.

Runs ``configs/demo.yaml`` (CounterFact -> counterfact suite, zsRE -> zsre suite, PEAK-CF -> peak and one_to_n
suites) into ``runs/demo`` and writes ``runs/demo/report.html``. Everything expensive is cached (the converted
model, the layer statistics, the co-occurrence counts) and the run resumes, so a second demo is quick.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from editscope.commands._device import add_device_arguments
from editscope.ranges import option


def demo_config_path() -> Path:
    from editscope.paths import configs_dir

    return configs_dir() / "demo.yaml"


def sample_config_path() -> Path:
    """The demo on the packaged sample datasets (a pip install without the data folder)."""
    from editscope.paths import configs_dir

    return configs_dir() / "demo-sample.yaml"


HELP = "edit SmolLM2 with MEMIT and AlphaEdit, evaluate all four suites, write the report"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help=HELP,
        description="Run configs/demo.yaml (10 cases each of CounterFact, zsRE and PEAK-CF, edited in batches of "
        "10 by MEMIT and AlphaEdit on SmolLM2-135M) and write an HTML + Markdown report. Resumes if interrupted. "
        "Without the dataset folder (EDITSCOPE_DATA, or ../shared/data beside a source checkout) it runs "
        "configs/demo-sample.yaml instead: the same edits of CounterFact and zsRE on the records packaged with "
        "editscope (PEAK-CF is not packaged), into runs/demo-sample.",
    )
    parser.add_argument("--output", "-o", metavar="DIR", help="output directory (default: runs/demo)")
    parser.add_argument("--config", metavar="YAML", help="another demo config (default: configs/demo.yaml)")
    parser.add_argument("--limit", type=option(int, "[1, inf)"), metavar="N", help="at most N cases per dataset")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_device_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from editscope.errors import EditscopeError
    from editscope.lm import load
    from editscope.paths import missing_data
    from editscope.report import build_report
    from editscope.run import Runner, load_config

    t0 = time.perf_counter()
    path = Path(args.config) if args.config else demo_config_path()
    if not args.config and (problem := missing_data()):
        print(f"[demo] {problem}: running the demo on the packaged sample (CounterFact and zsRE; PEAK-CF is not "
              "packaged). Set EDITSCOPE_DATA to the folder holding counterfact/, zsre/, peak/ for the whole demo.",
              flush=True)
        path = sample_config_path()
    if not path.is_file():
        raise EditscopeError(f"demo config not found: {path} (run from a source checkout, or pass --config)")
    config = load_config(path)
    print(f"[demo] config {path}")
    from editscope.run.blocks import load_blocks

    load_blocks(config, limit=args.limit)  # the data first: a missing or malformed file fails before the model loads
    print(f"[demo] preparing {config.model} (converted once, then cached)", flush=True)
    bundle = load(config.model, progress=lambda msg: print(f"[demo]   {msg}", flush=True),
                  device=args.device or config.device, dtype=args.dtype or config.dtype)
    print(f"[demo] loaded {bundle.name}: {bundle.n_layers} layers, fingerprint {bundle.fingerprint}", flush=True)
    runner = Runner(config, out_dir=args.output, limit=args.limit, progress=not args.no_progress, bundle=bundle,
                    log=lambda msg: print(f"[demo] {msg}", flush=True))
    result = runner.run()
    print(f"[demo] {result.written} rows computed, {result.skipped} reused; results in "
          f"{result.out_dir / 'results.jsonl'}", flush=True)
    html_path, md_path = build_report([result.out_dir])
    print((result.out_dir / "summary.md").read_text())
    print(f"[demo] done in {time.perf_counter() - t0:.0f} s")
    print(f"[demo] report: {html_path.resolve()}")
    print(f"[demo] markdown: {md_path.resolve()}")
    return 0
