"""The report page of a search: every candidate's objective per rung (the search curve: score and its 95% CI
against the number of validation cases seen) as ``search.png``, and ``report.md`` with the same numbers: per rung
the score, each reported metric's mean and CI (PEAK: ES, AFF_hard, ANF_hard, so the additivity cut and its
efficacy cost read side by side), the guard's reference (the unedited model, or the editor-alone run, which gets
its own row) and floor."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from editscope.atomic import atomic_write_bytes, atomic_write_text
from editscope.tables import Table
from editscope.tune.search import CandidateScore, HalvingResult, Objective, rank_key


def _pct(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{100 * x:.1f}"


def _ci(m: tuple[float, float, float] | None) -> str:
    if m is None:
        return "–"
    mean, lo, hi = m
    return _pct(mean) + (f" [{_pct(lo)}, {_pct(hi)}]" if math.isfinite(lo) and math.isfinite(hi) else "")


def write_page(out: Path, result: HalvingResult, by_id: dict[str, Any], chosen: str | None, objective: Objective,
               sizes: list[int], wall: float, settings: Any,
               reference: dict[int, CandidateScore] | None = None) -> Path:
    """Write ``search.png`` and ``report.md`` under ``out``; returns the page's path. ``reference``: the
    editor-alone run's scores per rung size, when the guard compares with it."""
    reference = reference or {}
    lines = [f"# editscope tune: {settings.method}"
             + "".join(f"+{name}" for name, _ in settings.plugins) + f" on {settings.model}", "",
             f"Objective: {objective.describe()}.", "",
             f"Rungs (validation cases): {sizes}, keep 1/{settings.eta}; "
             + ("complete" if result.complete else "stopped early (budget): the choice is made on the last finished "
                "rung") +
             f"; wall time {wall / 60:.1f} min.", ""]
    if chosen:
        lines += [f"**Chosen: {chosen}** ({by_id[chosen].label()}), hparams in `tuned.yaml`.", ""]
    else:
        lines += ["**No candidate chosen**: " + ("no rung finished." if not result.rungs else
                                                  f"the {objective.guard} guard refuses every candidate of the "
                                                  "last rung."), ""]
    if objective.guard_reference == "editor_alone":
        lines += [f"Reference: `reference/`, {settings.method} alone (base hparams, no plug-ins) on the same cases; "
                  f"the low end of its mean {objective.guard}'s 95% CI is the floor a candidate must reach.", ""]
    if _plot(out, result, by_id, chosen, objective, reference):
        lines += ["![search curve](search.png)", ""]
    g, ref = objective.guard, objective.reference_label
    names = objective.metrics
    head = (["candidate", "settings", objective.score, "95% CI", *(f"{m} [95% CI]" for m in names), f"{g} {ref}",
             f"{g} floor", "passes"])

    def row(name: str, label: str, s: CandidateScore, passes: str) -> list[str]:
        return ([name, label, _pct(s.score), f"[{_pct(s.score_lo)}, {_pct(s.score_hi)}]"]
                + [_ci(s.metrics.get(m)) for m in names] + [_pct(s.guard_ref), _pct(s.guard_floor), passes])

    for n, scores in result.rungs:
        rows = [row("reference", f"{settings.method} alone", reference[n], "–")] if n in reference else []
        for cid in sorted(scores, key=lambda c: rank_key(scores[c]), reverse=True):
            s = scores[cid]
            mark = " ✓" if cid == chosen and n == result.rungs[-1][0] else ""
            rows.append(row(f"{cid}{mark}", by_id[cid].label(), s, "yes" if s.local else "no"))
        table = Table(head, rows, align="llrl" + "r" * len(names) + "rrl")
        lines += [f"## {n} cases", "", table.markdown(), ""]
    lines.append("Each candidate's rows: `candidates/<id>/` (an ordinary run directory; `editscope report` reads it)"
                 + ("; the reference's: `reference/`." if reference else "."))
    return atomic_write_text(out / "report.md", "\n".join(lines) + "\n")


def _plot(out: Path, result: HalvingResult, by_id: dict[str, Any], chosen: str | None, objective: Objective,
          reference: dict[int, CandidateScore]) -> bool:
    if not result.rungs:
        return False
    from editscope.plotting import method_colors, plt, png

    ids = list(result.rungs[0][1])
    colors = method_colors(ids)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for cid in ids:
        pts = [(n, s) for n, scores in result.rungs for c, s in scores.items() if c == cid]
        xs = [n for n, _ in pts]
        ys = [100 * s.score for _, s in pts]
        lo = [100 * (s.score - s.score_lo) if math.isfinite(s.score_lo) else 0 for _, s in pts]
        hi = [100 * (s.score_hi - s.score) if math.isfinite(s.score_hi) else 0 for _, s in pts]
        local = all(s.local for _, s in pts[-1:])
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o" if local else "x", capsize=2, color=colors[cid],
                    lw=2.2 if cid == chosen else 0.8, alpha=1.0 if cid == chosen else 0.6,
                    label=f"{by_id[cid].label()}{' (chosen)' if cid == chosen else ''}")
    if reference:
        ns = sorted(reference)
        ax.plot(ns, [100 * reference[n].score for n in ns], ls="--", marker=".", color="0.4", lw=1,
                label="editor alone (reference)")
    ax.set_xscale("log")
    ax.minorticks_off()  # only the rungs' sizes are labelled
    ax.set_xticks([n for n, _ in result.rungs], [str(n) for n, _ in result.rungs])
    ax.set_xlabel("validation cases")
    ax.set_ylabel(f"{objective.suite_label} {objective.score} (×100, 95% CI)")
    ax.set_title(f"successive halving (x: refused by the {objective.guard} guard)")
    if len(ids) <= 12:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    atomic_write_bytes(out / "search.png", png(fig))
    return True
