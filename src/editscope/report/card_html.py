"""The edit card as one self-contained HTML page (template ``templates/card.html``, autoescaped): tables, and
figures embedded as base64 PNG data URIs. This module turns a card (:mod:`editscope.report.card`) into the page's
view data (text, numbers formatted, figures drawn) and renders it.

Sections (each an ``<section id=...>``, present on every card; one whose data the case lacks says so): ``request``,
``logprobs`` (log-probs of target and true answer on the edit prompt, paraphrases and neighbours), ``generation``,
``siblings`` (1-to-N), ``peak-answers``, ``evk-stability``, ``causal-trace``, ``delta-w``, ``collateral-damage`` and
``metrics`` (every suite's row, as the runner stores it). Which suite feeds which section is the card's
``sections`` entry (chosen by suite class), so this module names no suite."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from editscope.report.pages import png_src, render

SECTIONS = ("request", "logprobs", "generation", "siblings", "peak-answers", "evk-stability", "causal-trace", "delta-w",
            "collateral-damage", "metrics")
TITLES = {"request": "The edit", "logprobs": "Log-probs on the edit prompt, paraphrases and neighbours",
          "generation": "Generations before and after", "siblings": "1-to-N siblings",
          "peak-answers": "PEAK answers", "evk-stability": "EVK stability against σ",
          "causal-trace": "Where the fact sits (causal trace)", "delta-w": "ΔW",
          "collateral-damage": "Collateral damage", "metrics": "Every suite's metrics"}

View = dict[str, Any]


class Signed(NamedTuple):
    """A signed change, coloured by its sign (CSS class ``up``, ``down`` or none)."""

    text: str
    cls: str


def num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def signed(x: float | None, digits: int = 3) -> Signed | str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return Signed(f"{x:+.{digits}f}", "up" if x > 0 else "down" if x < 0 else "")


def grid(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = (0,), cls: str = "") -> View:
    """A card table: cells are text or :class:`Signed`; columns in ``left`` are left-aligned."""
    return {"headers": list(headers), "rows": [list(r) for r in rows], "left": set(left), "cls": cls}


def figure(png: bytes, alt: str, caption: str) -> View:
    return {"alt": alt, "src": png_src(png), "caption": caption, "axes": None}


def na(text: str) -> View:
    """A section without data: the sentence saying why."""
    return {"na": text}


# -- figures ---------------------------------------------------------------------------------------------------

def _scores_png(rows: list[dict[str, Any]]) -> bytes:
    from editscope.plotting import png

    return png(scores_figure(rows))


def arrow_span(rows: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """The x range that holds every arrow whole: matplotlib scales an axis to plotted data only, and an arrow is an
    annotation, so an axis set from the pre-edit points alone drops every arrow whose post-edit end lies outside."""
    ends = [float(r[k]) for r in rows for k in ("pre", "post")]
    low, high = min(ends), max(ends)
    pad = 0.05 * (high - low) or 0.5
    return low - pad, high + pad


def scores_figure(rows: list[dict[str, Any]]):
    """The card's pre -> post arrow chart of log-probs, one arrow per row (a matplotlib Figure)."""
    from editscope.plotting import PALETTE, plt

    labels = [f"{r['role']} {r['kind']}: {r['text'][:16]}" for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 0.28 * len(rows) + 1.2))
    for y, r in enumerate(rows):
        color = PALETTE[0] if r["kind"] == "new" else PALETTE[1]
        ax.annotate("", xy=(r["post"], y), xytext=(r["pre"], y),
                    arrowprops={"arrowstyle": "->", "color": color, "lw": 1.4})
        ax.plot([r["pre"]], [y], "o", color=color, ms=3)
    ax.set_xlim(*arrow_span(rows))
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("log-prob of the answer (sum over its tokens): pre -> post")
    return fig


def _evk_png(curves: dict[str, list[list[float]]], sigma: float) -> bytes:
    from editscope.plotting import PALETTE, plt, png

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for i, (panel, points) in enumerate(curves.items()):
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, "o-", color=PALETTE[i % len(PALETTE)], label=panel, ms=3)
    ax.axhline(1.0, ls="--", color="#888", lw=0.8)
    ax.axvline(sigma, ls=":", color="#888", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("σ of the embedding drift")
    ax.set_ylabel("Embedding Stability (cos pre/post)")
    ax.legend()
    return png(fig)


def _trace_png(trace: dict[str, Any], title: str) -> bytes:
    import numpy as np

    from editscope.plotting import plt, png

    states = trace["states"]
    kinds = list(states)
    labels = list(trace["tokens"])
    span = trace.get("subject_span")
    if span:
        for i in range(*span):
            labels[i] += "*"
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.8 * len(kinds), 0.3 * len(labels) + 1.5), squeeze=False)
    cmaps = {"residual": "Purples", "mlp": "Greens", "attn": "Reds"}
    for ax, kind in zip(axes[0], kinds, strict=True):
        data = np.array(states[kind], dtype=float).T  # tokens x layers
        image = ax.pcolormesh(np.ma.masked_invalid(data), cmap=cmaps.get(kind, "viridis"),
                              vmin=trace["meta"].get("corrupted_prob", np.nanmin(data)))
        ax.invert_yaxis()
        ax.set_yticks(np.arange(len(labels)) + 0.5, labels, fontsize=7)
        ax.set_xlabel("layer")
        ax.set_title(kind, fontsize=9)
        ax.grid(False)
        fig.colorbar(image, ax=ax)
    fig.suptitle(title, fontsize=9)
    return png(fig)


def _effect_png(pre: dict[str, Any] | None, post: dict[str, Any] | None, edited: list[int]) -> bytes:
    from editscope.plotting import PALETTE, plt, png

    fig, ax = plt.subplots(figsize=(6, 2.8))
    for i, (tag, trace) in enumerate((("before the edit, true answer", pre), ("after the edit, new target", post))):
        if trace:
            effect = trace["meta"]["mlp_indirect_effect"]
            ax.plot(range(len(effect)), effect, "o-", ms=3, color=PALETTE[i], label=tag)
    for layer in edited:
        ax.axvline(layer, color="#b00020", lw=0.8, ls="--")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("layer (dashed: edited)")
    ax.set_ylabel("MLP indirect effect")
    ax.legend()
    return png(fig)


def _spectra_png(delta: list[dict[str, Any]]) -> bytes:
    from editscope.plotting import PALETTE, plt, png

    fig, ax = plt.subplots(figsize=(5.5, 3))
    for i, d in enumerate(x for x in delta if x.get("singular")):
        ax.semilogy(range(1, len(d["singular"]) + 1), [max(s, 1e-12) for s in d["singular"]], "o-", ms=3,
                    color=PALETTE[i % len(PALETTE)], label=d["name"])
    ax.set_xlabel("singular value index")
    ax.set_ylabel("singular value of ΔW")
    ax.legend(fontsize=6)
    return png(fig)


def _shift_png(shifts: list[float], flipped: int) -> bytes:
    from editscope.plotting import PALETTE, plt, png

    fig, ax = plt.subplots(figsize=(5.5, 2.8))
    ax.hist(shifts, bins=40, color=PALETTE[0])
    ax.set_yscale("log")
    ax.set_xlabel(f"log-prob change of each probe fact's answer ({flipped} flipped)")
    ax.set_ylabel("facts")
    return png(fig)




# -- sections: the view data of each ---------------------------------------------------------------------------

def _source(source: dict[str, Any]) -> str:
    """Where the card's edit comes from, in words: a run's row (its folder and config digest) or the command line."""
    if source.get("cli"):
        text = "the command line (editscope inspect with a request, no run)"
        if source.get("derived_hparams"):
            text += ("; its hparams were derived, not chosen — the collateral scan below shows what the edit did to "
                     "facts the model knew; choose hparams with editscope tune. " + source["derived_hparams"])
        return text
    return ", ".join(f"{k} {v}" for k, v in source.items())


def _short(value: Any) -> str:
    """A number of the editor's diagnostics as a reader needs it: four significant digits, not float repr."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def _request(card: dict[str, Any]) -> View:
    c, m = card["case"], card["method"]
    rows = [[r["prompt"].replace("{}", r["subject"]), r["subject"], r["target_new"], r["target_true"] or "–"]
            for r in c["requests"]]
    info = [("model", f"{card['model']['name']} (fingerprint {card['model']['fingerprint']})"),
            ("method", f"{m['display']} (label {m['label']})"), ("case", f"{c['dataset']}: {c['case_id']}"),
            ("source", _source(card["source"])),
            ("conventions", ", ".join(f"{k}={v}" for k, v in m["conventions"].items()) or "–"),
            ("edit info", ", ".join(f"{k} {_short(v)}" for k, v in card.get("edit_info", {}).items()) or "–"),
            ("time", ", ".join(f"{k} {v:.1f} s" for k, v in card.get("timing", {}).items()))]
    return {"info": info, "glance": _glance(card), "hparams": m["hparams"],
            "requests": grid(["edit prompt", "subject", "new target", "true answer"], rows, left=(0, 1, 2, 3))}


def _glance(card: dict[str, Any]) -> str:
    """One line: the edit prompt's new-target log-prob pre -> post, the flip count, the largest relative ΔW."""
    parts = []
    rewrite = [c for c in card["suites"].get(card["sections"].get("logprobs", ""), {}).get("candidates", [])
               if c["role"] == "rewrite"]
    for c in rewrite:
        parts.append(f"log P({c['text']}) {num(c['pre'], 2)} → {num(c['post'], 2)}")
    col = card.get("collateral_scan")
    if col:
        parts.append(f"{col['flipped']} of {col['counted']} known facts flipped")
    if card["delta"]:
        biggest = max(card["delta"], key=lambda d: d["relative"] if d["relative"] == d["relative"] else -1)
        parts.append(f"largest ‖ΔW‖/‖W‖ {num(biggest['relative'], 4)} ({biggest['name']})")
    return "; ".join(parts)


_CAND_HEAD = ["role", "prompt", "answer", "kind", "log-prob pre", "post", "shift"]
_P_HEAD = ["P pre", "P post", "ΔP"]


def _candidates(rows: list[dict[str, Any]], with_p: bool = False) -> View:
    out = []
    for r in rows:
        cells = [r["role"], r["prompt"], r["text"], r["kind"], num(r["pre"]), num(r["post"]),
                 signed(r["post"] - r["pre"])]
        if with_p:
            cells += [num(r["p_pre"], 4), num(r["p_post"], 4), signed(r["p_post"] - r["p_pre"], 4)]
        out.append(cells + [num(r["top1_pre"]), num(r["top1_post"])])
    return grid([*_CAND_HEAD, *(_P_HEAD if with_p else []), "top-1 pre", "top-1 post"], out, left=(0, 1, 2))


def _scores(card: dict[str, Any]) -> View:
    name = card["sections"].get("logprobs")
    if name is None:
        return na("no CounterFact/zsRE suite measured this case (the edit has no true answer to compare)")
    rows = card["suites"][name]["candidates"]
    return {"suite": name, "table": _candidates(rows),
            "figure": figure(_scores_png(rows), "log-prob arrows", "Each arrow goes from the pre-edit to the post-edit "
                             "log-prob; blue: new target, orange: true answer.")}


def _generation(card: dict[str, Any]) -> View:
    generated = None
    if card["generation"]:
        generated = grid(["prompt", "before", "after"],
                         [[g["prompt"], g["pre"], g["post"]] for g in card["generation"]], left=(0, 1, 2), cls="gen")
    answers = [{"suite": name, "note": suite["protocol"].get("note", ""),
                "table": grid(["role", "prompt", "gold", "before", "after"],
                              [[a["role"], a["prompt"], " / ".join(a["gold"]), a["pre"], a["post"]]
                               for a in suite["answers"]], left=(0, 1, 2, 3, 4), cls="gen")}
               for name, suite in card["suites"].items() if suite.get("answers")]  # suites judging generated answers
    return {"generated": generated, "answers": answers}


def _metric_table(suite: dict[str, Any], keep: Sequence[str] | None = None) -> View:
    row = suite["metrics"]
    out: list[list[Any]] = []
    for spec in suite["declared"]:
        if spec.get("aggregate") or (keep is not None and spec["name"] not in keep):
            continue
        arrow = {True: " ↑", False: " ↓"}.get(spec.get("higher_is_better"), "")
        if spec.get("pairing", "pre_post") == "pre_post":
            a, b = row.get(f"{spec['name']}_pre"), row.get(f"{spec['name']}_post")
            if a is None and b is None:
                continue
            shift = signed(b - a) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) \
                else "–"
            out.append([spec["name"] + arrow, num(a), num(b), shift])
        elif spec["name"] in row:
            out.append([spec["name"] + arrow, "", num(row[spec["name"]]), ""])
    return grid(["metric", "pre", "post", "shift"], out)


def _siblings(card: dict[str, Any]) -> View:
    suite = card["suites"].get(card["sections"].get("siblings", ""))
    if suite is None:
        return na("the case has no 1-to-N answer list (siblings): not measured")
    return {"metrics": _metric_table(suite), "table": _candidates(suite["candidates"], True)}


def _peak(card: dict[str, Any]) -> View:
    suite = card["suites"].get(card["sections"].get("peak-answers", ""))
    if suite is None:
        return na("the case has no PEAK answer lists (correct and hard false answers): not measured")
    rows = [r for r in suite["candidates"] if r["role"] != "neighborhood"]
    return {"metrics": _metric_table(suite), "table": _candidates(rows, True)}


def _evk(card: dict[str, Any]) -> View:
    evk = card.get("evk_curves")
    if not evk:
        return na("EVK not measured")
    sigmas = sorted({p[0] for points in evk["curves"].values() for p in points})
    rows = [[panel] + [num(dict((p[0], p[1]) for p in points).get(s), 4) for s in sigmas]
            for panel, points in evk["curves"].items()]
    chart = None
    if len(sigmas) > 1:
        chart = figure(_evk_png(evk["curves"], evk["sigma"]), "EVK stability vs sigma",
                       "Cosine of the final-token state before vs after the edit on EVK instances (subject, relation "
                       "or all token embeddings drifted by N(0, σ²I)); 1 = untouched.")
    # the suite's metric table is in the metrics section with every suite's: shown once
    return {"table": grid(["drift"] + [f"σ={s:g}" for s in sigmas], rows), "figure": chart}


def _trace(card: dict[str, Any]) -> View:
    trace = card.get("trace")
    if not trace:
        return na("causal trace not run (editscope inspect --trace)")
    edited = sorted({d["layer"] for d in card["delta"] if d["layer"] is not None})
    runs = []
    for tag, key in (("before the edit, true answer", "pre"), ("after the edit, new target", "post")):
        t = trace.get(key)
        if t is None:
            continue
        meta = t["meta"]
        effect = meta["mlp_indirect_effect"]
        top = sorted(range(len(effect)), key=lambda i: -effect[i])[:3]
        runs.append({"tag": tag, "prompt": t["prompt"], "answer": t["answer"], "clean": num(meta["clean_prob"], 4),
                     "corrupted": num(meta["corrupted_prob"], 4), "top": ", ".join(map(str, top)),
                     "edited": ", ".join(map(str, edited)) or "–",
                     "figure": figure(_trace_png(t, f"{tag}: {t['answer']!r}"), f"causal trace {key}",
                                      "Probability of the answer's first token with one state restored in the "
                                      "corrupted run (ROME's causal trace); * marks subject tokens.")})
    return {"runs": runs, "effect": figure(
        _effect_png(trace.get("pre"), trace.get("post"), edited), "MLP indirect effect",
        "MLP indirect effect at the subject's last token per layer, before (true answer) and after (new target); "
        "does the new fact live at the edited layers?")}


def _delta(card: dict[str, Any]) -> View:
    rows = [[d["name"], num(d["layer"]), "×".join(map(str, d["shape"])), num(d["norm"], 4), num(d["w_norm"], 2),
             num(d["relative"], 5), num(d.get("rank")), num(d.get("spectral"), 4), num(d.get("spectral_relative"), 4),
             f"{d['nonzero']}/{d['numel']}", ", ".join(f"{s:.3g}" for s in d.get("singular", [])[:6])]
            for d in card["delta"]]
    spectra = None
    if any(d.get("singular") for d in card["delta"]):
        spectra = figure(_spectra_png(card["delta"]), "singular values of ΔW", "Leading singular values of each "
                         "edited parameter's ΔW (log scale): a rank-one edit shows one.")
    return {"table": grid(["parameter", "layer", "shape", "‖ΔW‖F", "‖W‖F", "‖ΔW‖/‖W‖", "rank", "σ₁(ΔW)",
                           "σ₁(ΔW)/σ₁(W)", "non-zero", "leading singular values"], rows), "figure": spectra}


def _collateral(card: dict[str, Any]) -> View:
    col = card.get("collateral_scan")
    if not col:
        return na("collateral scan not run")
    facts = ["prompt", "answer", "relation", "log-prob pre", "post", "shift", "flipped", "shared words"]
    groups = ["group", "facts", "flipped", "mean shift", "min shift"]

    def fact_rows(found: list[dict[str, Any]]) -> View:
        return grid(facts, [[f["prompt"], f["answer"], f["relation"], num(f["pre"]), num(f["post"]), signed(f["shift"]),
                             num(f["flipped"]), ", ".join(f["shares_subject"] + f["shares_object"])] for f in found],
                    left=(0, 1, 2, 7))

    def group_rows(rows: list[dict[str, Any]], n: int = 15) -> View:
        return grid(groups, [[r["group"], num(r["n"]), num(r["flipped"]), signed(r["mean_shift"]),
                              signed(r["min_shift"])] for r in rows[:n]])

    return {"flipped": col["flipped"], "counted": col["counted"], "n": col["n"], "sources": ", ".join(col["sources"]),
            "excluded": len(col["excluded"]), "mean_shift": num(col["mean_shift"], 4),
            "figure": figure(_shift_png(col["shifts"], col["flipped"]), "collateral shifts",
                             "Distribution of the post - pre log-prob of every probe fact's answer."),
            "flipped_facts": fact_rows(col["flipped_facts"]) if col["flipped_facts"] else None,
            "drops": fact_rows(col["largest_drops"]), "n_drops": len(col["largest_drops"]),
            "by_overlap": group_rows(col["by_overlap"]), "by_relation": group_rows(col["by_relation"])}


def _metrics(card: dict[str, Any]) -> View:
    return {"suites": [{"name": name, "where": "the run's suite" if suite["run_suite"] else "added by the card",
                        "table": _metric_table(suite), "note": suite["protocol"].get("note", "")}
                       for name, suite in card["suites"].items()],
            "run_row": bool(card.get("run_row"))}


_VIEWS = {"request": _request, "logprobs": _scores, "generation": _generation, "siblings": _siblings,
          "peak-answers": _peak, "evk-stability": _evk, "causal-trace": _trace, "delta-w": _delta,
          "collateral-damage": _collateral, "metrics": _metrics}


def render_card(card: dict[str, Any]) -> str:
    """The card as one self-contained HTML page."""
    r = card["case"]["requests"][0]
    title = f"Edit card: {r['prompt'].replace('{}', r['subject'])} -> {r['target_new']} ({card['method']['display']})"
    return render("card.html", title=title, sections=SECTIONS, titles=TITLES,
                  view={s: _VIEWS[s](card) for s in SECTIONS})


__all__ = ["SECTIONS", "render_card"]
