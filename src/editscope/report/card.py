"""Edit cards on disk: the page and the JSON of a card :mod:`editscope.run.inspect` computed, and the cards of a
run's cases for the report."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from editscope.errors import EditscopeError
from editscope.finite import nulled
from editscope.lm.loading import Bundle
from editscope.run.inspect import compute_card, job_from_run, not_replayable
from editscope.run.store import RESULTS, read_results

Log = Callable[[str], None]


def card_stem(dataset: str, case_id: str, method: str) -> str:
    """The file name (without extension) of a card: safe characters only."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", f"card-{dataset}-{case_id}-{method}")


def write_card(card: dict[str, Any], html_path: str | Path, json_path: str | Path | None = None) -> Path:
    """Write the page (and the JSON) atomically; returns the page's path."""
    import json

    from editscope.atomic import atomic_write_text
    from editscope.report.card_html import render_card

    if json_path is not None:
        atomic_write_text(Path(json_path), json.dumps(nulled(card)[0], indent=1) + "\n")
    return atomic_write_text(Path(html_path), render_card(card))


def choose_cases(rows: Sequence[dict[str, Any]], *, n: int | None = None, ids: Sequence[str] = (),
                 seed: int = 0) -> list[tuple[str, str]]:
    """(dataset, case id) pairs of a run's rows for cards: a seeded sample of ``n`` cases (kept in run order) and the
    cases named in ``ids`` (looked up in every dataset of the run)."""
    import random

    cases = list(dict.fromkeys((r["dataset"], str(r["case_id"])) for r in rows if not r.get("checkpoint")))
    picked: set[int] = set()
    if n is not None:
        if n < 1:
            raise EditscopeError(f"--cards {n}: expected N >= 1")
        picked = set(random.Random(seed).sample(range(len(cases)), min(n, len(cases))))
    for wanted in ids:
        hits = {i for i, c in enumerate(cases) if c[1] == str(wanted)}
        if not hits:
            raise EditscopeError(f"--cards-for {wanted}: no such case in the run's results")
        picked |= hits
    return [c for i, c in enumerate(cases) if i in picked]


def make_cards(run_dir: str | Path, out_dir: str | Path, *, n: int | None = None, ids: Sequence[str] = (),
               seed: int = 0,
               bundle: Bundle | None = None, progress: bool = True, trace: bool = False,
               log: Log | None = None) -> dict[tuple[str, str, str], str]:
    """Write the cards of the cases :func:`choose_cases` picks (``n`` sampled, ``ids`` named), every method of the run,
    under ``out_dir/cards/``; returns (dataset, case id, method) -> path relative to ``out_dir`` (what
    :func:`editscope.report.build.build_report` links). The model is loaded once."""
    from editscope.run.config import NO_EDIT

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    say = log or (lambda _msg: None)
    if why := not_replayable(run_dir):
        say(f"cards: none written: {why}")
        return {}
    rows = read_results(run_dir / RESULTS)
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"] != NO_EDIT))
    links: dict[tuple[str, str, str], str] = {}
    for dataset, case_id in choose_cases(rows, n=n, ids=ids, seed=seed):
        for method in methods:
            job = job_from_run(run_dir, case_id, method=method, dataset=dataset, bundle=bundle, log=log)
            bundle = job.bundle
            card = compute_card(job, trace=trace, progress=progress, log=log)
            stem = card_stem(dataset, case_id, method)
            write_card(card, out_dir / "cards" / f"{stem}.html", out_dir / "cards" / f"{stem}.json")
            links[(dataset, case_id, method)] = f"cards/{stem}.html"
    return links


__all__ = ["card_stem", "choose_cases", "make_cards", "write_card"]
