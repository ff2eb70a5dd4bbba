"""``editscope configs``: the shipped experiment configs, what each reproduces and what it costs."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

HELP = "list the shipped experiment configs"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "configs", help=HELP,
        description="List the experiment configs shipped with editscope (run one with 'editscope run NAME'): the "
        "paper table or figure each reproduces (its header comment), its models, methods and datasets, and its "
        "measured wall time where one was measured (a '# Wall time:' header line).")
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.set_defaults(func=run)


def describe(path: Path, name: str) -> dict[str, Any]:
    """One config's name, header summary, models, methods, datasets and measured wall time (None: not measured)."""
    from editscope.run import load_config

    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    summary = re.split(r"(?<=[.])\s+(?=[A-Z])", " ".join(header[:3]).strip())[0]  # the first sentence
    wall = next((re.sub(r"^wall time:\s*", "", h, flags=re.I) for h in header if h.lower().startswith("wall time:")),
                None)
    config = load_config(path)
    return {"name": name, "reproduces": summary, "models": list(config.models or (config.model,)),
            "methods": [m.label for m in config.methods],
            "datasets": [b.label for b in config.blocks], "mode": config.mode.label, "wall_time": wall}


def run(args: argparse.Namespace) -> int:
    from editscope.paths import configs_dir

    root = configs_dir()
    paths = [(root / "demo.yaml", "demo"), (root / "demo-sample.yaml", "demo-sample")] + [(p, f"experiments/{p.stem}")
                                             for p in sorted((root / "experiments").glob("*.yaml"))]
    rows = [describe(path, name) for path, name in paths]
    if args.json:
        from editscope.finite import strict_dumps

        print(strict_dumps(rows, "configs --json", indent=1))
        return 0
    for row in rows:
        print(f"{row['name']}\n  {row['reproduces']}\n  models: {', '.join(row['models'])}; methods: "
              f"{', '.join(row['methods'])}; datasets: "
              f"{', '.join(row['datasets'])}; mode {row['mode']}; wall time: {row['wall_time'] or 'not measured'}")
    return 0
