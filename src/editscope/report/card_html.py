"""The edit card as one self-contained HTML page: tables, and figures embedded as base64 PNG data URIs.

Sections (each an ``<section id=...>``, present on every card; one whose data the case lacks says so): ``request``,
``logprobs`` (log-probs of target and true answer on the edit prompt, paraphrases and neighbours), ``generation``,
``siblings`` (1-to-N), ``peak-answers``, ``evk-stability``, ``causal-trace``, ``delta-w``, ``collateral-damage`` and
``metrics`` (every suite's row, as the runner stores it). Which suite feeds which section is the card's
``sections`` entry (chosen by suite class), so this module names no suite."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from typing import Any

from editscope.report.style import CSS

SECTIONS = ("request", "logprobs", "generation", "siblings", "peak-answers", "evk-stability", "causal-trace", "delta-w",
            "collateral-damage", "metrics")
_CARD_CSS = CSS + """.na{color:#888;font-style:italic}td.l,th.l{text-align:left;white-space:normal;max-width:38em}
.up{color:#087f23}.down{color:#b00020}section{margin-bottom:2em}.gen td{white-space:pre-wrap;text-align:left}"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"


def signed(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    cls = "up" if x > 0 else "down" if x < 0 else ""
    return f"<span class='{cls}'>{x:+.{digits}f}</span>"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,), cls: str = "") -> str:
    """An HTML table; ``rows`` hold HTML already escaped; columns in ``left`` are left-aligned."""
    head = "".join(f"<th class='{'l' if i in left else ''}'>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td class='{'l' if i in left else ''}'>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(png: bytes, alt: str, caption: str) -> str:
    b64 = base64.b64encode(png).decode("ascii")
    return (f"<figure><img alt='{esc(alt)}' src='data:image/png;base64,{b64}'>"
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def na(text: str) -> str:
    return f"<p class='na'>{esc(text)}</p>"


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


# -- sections --------------------------------------------------------------------------------------------------

def _request(card: dict[str, Any]) -> str:
    c, m = card["case"], card["method"]
    rows = [[esc(r["prompt"].replace("{}", r["subject"])), esc(r["subject"]), esc(r["target_new"]),
             esc(r["target_true"] or "–")] for r in c["requests"]]
    info = [("model", f"{card['model']['name']} (fingerprint {card['model']['fingerprint']})"),
            ("method", f"{m['display']} (label {m['label']})"), ("case", f"{c['dataset']}: {c['case_id']}"),
            ("source", ", ".join(f"{k} {v}" for k, v in card["source"].items())),
            ("conventions", ", ".join(f"{k}={v}" for k, v in m["conventions"].items()) or "–"),
            ("edit info", ", ".join(f"{k} {v}" for k, v in card.get("edit_info", {}).items()) or "–"),
            ("time", ", ".join(f"{k} {v:.1f} s" for k, v in card.get("timing", {}).items()))]
    meta = "<table class='meta'>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in info) + \
        "</table>"
    hp = "<details><summary>hyperparameters</summary><pre>" + esc(m["hparams"]) + "</pre></details>"
    head = ["edit prompt", "subject", "new target", "true answer"]
    return meta + _glance(card) + table(head, rows, left=(0, 1, 2, 3)) + hp


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
    return f"<p><b>At a glance:</b> {esc('; '.join(parts))}</p>" if parts else ""


def _cand_rows(rows: list[dict[str, Any]], with_p: bool = False) -> list[list[str]]:
    out = []
    for r in rows:
        cells = [esc(r["role"]), esc(r["prompt"]), esc(r["text"]), esc(r["kind"]), num(r["pre"]), num(r["post"]),
                 signed(r["post"] - r["pre"])]
        if with_p:
            cells += [num(r["p_pre"], 4), num(r["p_post"], 4), signed(r["p_post"] - r["p_pre"], 4)]
        out.append(cells + [num(r["top1_pre"]), num(r["top1_post"])])
    return out


_CAND_HEAD = ["role", "prompt", "answer", "kind", "log-prob pre", "post", "shift"]
_P_HEAD = ["P pre", "P post", "ΔP"]


def _scores(card: dict[str, Any]) -> str:
    name = card["sections"].get("logprobs")
    if name is None:
        return na("no CounterFact/zsRE suite measured this case (the edit has no true answer to compare)")
    rows = card["suites"][name]["candidates"]
    return (f"<p>Suite <code>{esc(name)}</code>: every prompt it scores, the new target (kind <code>new</code>) and "
            "the true answer (<code>true</code>; a neighbour's own answer on neighbourhood prompts), natural-log "
            "probability summed over the answer's tokens.</p>"
            + table([*_CAND_HEAD, "top-1 pre", "top-1 post"], _cand_rows(rows), left=(0, 1, 2))
            + figure(_scores_png(rows), "log-prob arrows", "Each arrow goes from the pre-edit to the post-edit "
                     "log-prob; blue: new target, orange: true answer."))


def _generation(card: dict[str, Any]) -> str:
    if card["generation"]:
        rows = [[esc(g["prompt"]), esc(g["pre"]), esc(g["post"])] for g in card["generation"]]
        out = "<p>Greedy continuations.</p>" + table(["prompt", "before", "after"], rows, left=(0, 1, 2), cls="gen")
    else:
        out = na("generation turned off")
    for name, suite in card["suites"].items():
        if suite.get("answers"):  # a suite that judges generated answers (evaluation in the wild)
            rows = [[esc(a["role"]), esc(a["prompt"]), esc(" / ".join(a["gold"])), esc(a["pre"]), esc(a["post"])]
                    for a in suite["answers"]]
            out += (f"<p>Answers the model generated for suite <code>{esc(name)}</code> "
                    f"({esc(suite['protocol'].get('note', ''))}).</p>"
                    + table(["role", "prompt", "gold", "before", "after"], rows, left=(0, 1, 2, 3, 4), cls="gen"))
    return out


def _metric_table(suite: dict[str, Any], keep: Sequence[str] | None = None) -> str:
    row = suite["metrics"]
    out = []
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
            out.append([esc(spec["name"] + arrow), num(a), num(b), shift])
        elif spec["name"] in row:
            out.append([esc(spec["name"] + arrow), "", num(row[spec["name"]]), ""])
    return table(["metric", "pre", "post", "shift"], out)


def _siblings(card: dict[str, Any]) -> str:
    suite = card["suites"].get(card["sections"].get("siblings", ""))
    if suite is None:
        return na("the case has no 1-to-N answer list (siblings): not measured")
    rows = suite["candidates"]
    return (_metric_table(suite) + "<p>Each valid answer (sibling, kind <code>correct</code>) and false answer "
            "after the query, before and after the edit:</p>"
            + table([*_CAND_HEAD, *_P_HEAD, "top-1 pre", "top-1 post"], _cand_rows(rows, True), left=(0, 1, 2)))


def _peak(card: dict[str, Any]) -> str:
    suite = card["suites"].get(card["sections"].get("peak-answers", ""))
    if suite is None:
        return na("the case has no PEAK answer lists (correct and hard false answers): not measured")
    rows = [r for r in suite["candidates"] if r["role"] != "neighborhood"]
    return (_metric_table(suite) + "<p>Probability shift of each correct and false answer (P = exp of the mean "
            "token log-prob, as PEAK computes it):</p>"
            + table([*_CAND_HEAD, *_P_HEAD, "top-1 pre", "top-1 post"], _cand_rows(rows, True), left=(0, 1, 2)))


def _evk(card: dict[str, Any]) -> str:
    evk = card.get("evk_curves")
    if not evk:
        return na("EVK not measured")
    sigmas = sorted({p[0] for points in evk["curves"].values() for p in points})
    rows = [[esc(panel)] + [num(dict((p[0], p[1]) for p in points).get(s), 4) for s in sigmas]
            for panel, points in evk["curves"].items()]
    body = table(["drift"] + [f"σ={s:g}" for s in sigmas], rows)
    if len(sigmas) > 1:
        body += figure(_evk_png(evk["curves"], evk["sigma"]), "EVK stability vs sigma",
                       "Cosine of the final-token state before vs after the edit on EVK instances (subject, relation "
                       "or all token embeddings drifted by N(0, σ²I)); 1 = untouched.")
    return body + _metric_table(card["suites"][evk["suite"]])


def _trace(card: dict[str, Any]) -> str:
    trace = card.get("trace")
    if not trace:
        return na("causal trace not run (editscope inspect --trace)")
    edited = sorted({d["layer"] for d in card["delta"] if d["layer"] is not None})
    out = []
    for tag, key in (("before the edit, true answer", "pre"), ("after the edit, new target", "post")):
        t = trace.get(key)
        if t is None:
            continue
        meta = t["meta"]
        effect = meta["mlp_indirect_effect"]
        top = sorted(range(len(effect)), key=lambda i: -effect[i])[:3]
        out.append(f"<p>{esc(tag)}: {esc(t['prompt'])!s} -> {esc(t['answer'])}; p(clean) {num(meta['clean_prob'], 4)}, "
                   f"p(corrupted) {num(meta['corrupted_prob'], 4)}; top MLP layers {', '.join(map(str, top))} "
                   f"(edited: {', '.join(map(str, edited)) or '–'})</p>")
        out.append(figure(_trace_png(t, f"{tag}: {t['answer']!r}"), f"causal trace {key}",
                          "Probability of the answer's first token with one state restored in the corrupted run "
                          "(ROME's causal trace); * marks subject tokens."))
    out.append(figure(_effect_png(trace.get("pre"), trace.get("post"), edited), "MLP indirect effect",
                      "MLP indirect effect at the subject's last token per layer, before (true answer) and after "
                      "(new target); does the new fact live at the edited layers?"))
    return "".join(out)


def _delta(card: dict[str, Any]) -> str:
    rows = [[esc(d["name"]), num(d["layer"]), esc("×".join(map(str, d["shape"]))), num(d["norm"], 4),
             num(d["w_norm"], 2), num(d["relative"], 5), num(d.get("rank")), num(d.get("spectral"), 4),
             num(d.get("spectral_relative"), 4), esc(f"{d['nonzero']}/{d['numel']}"),
             esc(", ".join(f"{s:.3g}" for s in d.get("singular", [])[:6]))] for d in card["delta"]]
    body = table(["parameter", "layer", "shape", "‖ΔW‖F", "‖W‖F", "‖ΔW‖/‖W‖", "rank", "σ₁(ΔW)", "σ₁(ΔW)/σ₁(W)",
                  "non-zero", "leading singular values"], rows)
    if any(d.get("singular") for d in card["delta"]):
        body += figure(_spectra_png(card["delta"]), "singular values of ΔW",
                       "Leading singular values of each edited parameter's ΔW (log scale): a rank-one edit shows one.")
    return body


def _collateral(card: dict[str, Any]) -> str:
    col = card.get("collateral_scan")
    if not col:
        return na("collateral scan not run")
    head = (f"<p><b>{col['flipped']}</b> of {col['counted']} facts the unedited model answered top-1 no longer are "
            f"(probe set: {col['n']} facts from {', '.join(col['sources'])}, {len(col['excluded'])} of them the "
            f"edited case's own and left out); mean log-prob change {num(col['mean_shift'], 4)}.</p>")

    def fact_rows(facts: list[dict[str, Any]]) -> list[list[str]]:
        return [[esc(f["prompt"]), esc(f["answer"]), esc(f["relation"]), num(f["pre"]), num(f["post"]),
                 signed(f["shift"]), num(f["flipped"]), esc(", ".join(f["shares_subject"] + f["shares_object"]))]
                for f in facts]

    fhead = ["prompt", "answer", "relation", "log-prob pre", "post", "shift", "flipped", "shared words"]
    groups = ["group", "facts", "flipped", "mean shift", "min shift"]

    def group_rows(rows: list[dict[str, Any]], n: int = 15) -> list[list[str]]:
        return [[esc(r["group"]), num(r["n"]), num(r["flipped"]), signed(r["mean_shift"]), signed(r["min_shift"])]
                for r in rows[:n]]

    return (head + figure(_shift_png(col["shifts"], col["flipped"]), "collateral shifts",
                          "Distribution of the post - pre log-prob of every probe fact's answer.")
            + "<h3>Flipped facts</h3>" + (table(fhead, fact_rows(col["flipped_facts"]), left=(0, 1, 2, 7))
                                         if col["flipped_facts"] else na("none flipped"))
            + f"<h3>Largest log-prob drops (top {len(col['largest_drops'])})</h3>"
            + table(fhead, fact_rows(col["largest_drops"]), left=(0, 1, 2, 7))
            + "<h3>By words shared with the edit's subject / answers</h3>"
            + table(groups, group_rows(col["by_overlap"]))
            + "<h3>By relation (most flipped first)</h3>" + table(groups, group_rows(col["by_relation"])))


def _metrics(card: dict[str, Any]) -> str:
    out = []
    for name, suite in card["suites"].items():
        where = "the run's suite" if suite["run_suite"] else "added by the card"
        out.append(f"<h3>{esc(name)} <small>({where})</small></h3>" + _metric_table(suite)
                   + f"<p class='protocol'>{esc(suite['protocol'].get('note', ''))}</p>")
    row = card.get("run_row")
    if row:
        out.append("<p class='protocol'>The run's stored row of this case holds the same metrics (checked by the "
                   "tests: the card calls the same suite code under the runner's seeds).</p>")
    return "".join(out)


_TITLES = {"request": "The edit", "logprobs": "Log-probs on the edit prompt, paraphrases and neighbours",
           "generation": "Generations before and after", "siblings": "1-to-N siblings",
           "peak-answers": "PEAK answers", "evk-stability": "EVK stability against σ",
           "causal-trace": "Where the fact sits (causal trace)", "delta-w": "ΔW",
           "collateral-damage": "Collateral damage", "metrics": "Every suite's metrics"}
_RENDER = {"request": _request, "logprobs": _scores, "generation": _generation, "siblings": _siblings,
           "peak-answers": _peak, "evk-stability": _evk, "causal-trace": _trace, "delta-w": _delta,
           "collateral-damage": _collateral, "metrics": _metrics}


def render_card(card: dict[str, Any]) -> str:
    """The card as one self-contained HTML page."""
    r = card["case"]["requests"][0]
    title = f"Edit card: {r['prompt'].replace('{}', r['subject'])} -> {r['target_new']} ({card['method']['display']})"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{_CARD_CSS}</style></head><body><h1>{esc(title)}</h1>"]
    parts.append("<nav>" + " · ".join(f"<a href='#{s}'>{esc(_TITLES[s])}</a>" for s in SECTIONS) + "</nav>")
    for s in SECTIONS:
        parts.append(f"<section id='{s}'><h2>{esc(_TITLES[s])}</h2>{_RENDER[s](card)}</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def cards_section(links: dict[tuple[str, str, str], str]) -> str:
    """The report's section linking each (dataset, case, method) to its card (relative paths)."""
    if not links:
        return ""
    methods = list(dict.fromkeys(m for _, _, m in links))
    cases = list(dict.fromkeys((d, c) for d, c, _ in links))
    rows = [[esc(d), esc(c)] + [f"<a href='{esc(links[(d, c, m)])}'>card</a>" if (d, c, m) in links else ""
                                for m in methods] for d, c in cases]
    return "<h2 id='cards'>Edit cards</h2>" + table(["dataset", "case", *methods], rows, left=(0, 1))


__all__ = ["SECTIONS", "cards_section", "render_card"]
