"""Figures of the registered suites, drawn for the report through their ``figures`` hooks: the 1-to-N
distribution of a sampled case against its gold distribution (paper 000, Fig. 5) and the probability shift of
correct vs false answers after an appending edit (paper 003, Fig. 2). Imported only when a report is built
(matplotlib). Every function returns PNG bytes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from editscope.metrics.intervals import mean_ci
from editscope.plotting import method_colors, plt, png

KIND_LABELS = {"correct": "correct (O)", "hard_false": "hard false", "random_false": "random false",
               "new": "new answer o*"}
KIND_COLORS = {"correct": "#009E73", "hard_false": "#D55E00", "random_false": "#E69F00", "new": "#0072B2"}


def _renorm(logprobs: Sequence[float]) -> np.ndarray:
    lp = np.asarray(logprobs, dtype=np.float64)
    lp = lp - lp.max()
    p = np.exp(lp)
    return p / p.sum()


def one_to_n_case(case_id: str, query: str, gold: dict[str, Any], pre: dict[str, Any],
                  posts: dict[str, dict[str, Any]], edit_note: str = "", max_answers: int = 10) -> bytes:
    """Paper 000 Fig. 5: the model's distribution over the valid answers of one query before and after each
    method's edit (sequence probabilities renormalised over the valid answers) beside the gold distribution."""
    answers = list(gold["answers"])

    def valid_lp(probe: dict[str, Any]) -> list[float]:
        cands = {c["text"]: c for p in probe["prompts"] if p["role"] == "rewrite" for c in p["candidates"]
                 if c.get("kind") == "correct"}
        return [float(cands[a]["logprob_sum"]) for a in answers]

    series = [("gold Q (" + gold.get("source", "?") + ")", np.asarray(gold["weights"], float), "#777777", "//")]
    series.append(("before edit", _renorm(valid_lp(pre)), "#bbbbbb", ""))
    colors = method_colors(list(posts))
    for m, probe in posts.items():
        series.append((f"after {m}", _renorm(valid_lp(probe)), colors[m], ""))
    # at most max_answers answers: the largest by gold weight, then by any probability shown
    peak = np.max(np.vstack([v for _, v, _, _ in series]), axis=0)
    order = sorted(range(len(answers)), key=lambda i: (-series[0][1][i], -peak[i]))[:max_answers]
    hidden = len(answers) - len(order)
    answers = [answers[i] for i in order]
    series = [(label, vals[order], color, hatch) for label, vals, color, hatch in series]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.75 * len(answers) + 2.5), 3.4))
    x = np.arange(len(answers))
    for k, (label, vals, color, hatch) in enumerate(series):
        ax.bar(x - 0.4 + width * (k + 0.5), vals, width, label=label, color=color, hatch=hatch,
               edgecolor="white" if not hatch else "#444444", linewidth=0.5)
    ax.set_xticks(x, [a if len(a) <= 18 else a[:16] + "…" for a in answers], rotation=20, ha="right")
    ax.set_ylabel("probability over valid answers")
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("valid answer a of the query" + (f" ({hidden} more with small probability not shown)"
                                                   if hidden else ""))
    ax.set_title(f"1-to-N distribution, case {case_id}: “{query}”" + (f"\n{edit_note}" if edit_note else ""))
    ax.legend(frameon=False, ncol=2, loc="upper right")
    fig.tight_layout()
    return png(fig)


def _kind_probs(probe: dict[str, Any], kind: str, role: str = "rewrite", prob: str = "mean") -> list[float]:
    out = []
    for p in probe["prompts"]:
        if p["role"] != role:
            continue
        for c in p["candidates"]:
            if c.get("kind") == kind:
                lp = float(c["logprob_sum"])
                out.append(math.exp(lp / c["n_tokens"] if prob == "mean" else lp))
    return out


def peak_shift(pairs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]], *, prob: str = "mean") -> bytes:
    """Paper 003 Fig. 2: mean probability of correct, hard false, random false and the new answer on the edit
    prompt, before vs after each method's appending edit, on a log axis; error bars = 95% CI over cases (per
    case the mean over its answers of that kind; lower bars clipped above 0 for the log axis).
    P = exp(mean token log-prob) (PEAK's convention) unless ``prob='sum'``."""
    methods = list(pairs)
    kinds = ["correct", "hard_false", "random_false", "new"]
    fig, axes = plt.subplots(1, len(methods), figsize=(3.3 * len(methods) + 0.4, 3.1), squeeze=False, sharey=True)
    shown: list[float] = []
    for ax, m in zip(axes[0], methods, strict=True):
        x = np.arange(len(kinds))
        for j, (tag, shade) in enumerate((("before", 0.45), ("after", 1.0))):
            means, errs = [], [[], []]
            for kind in kinds:
                per_case = []
                for pre, post in pairs[m]:
                    vals = _kind_probs(pre if tag == "before" else post, kind, prob=prob)
                    if vals:
                        per_case.append(float(np.mean(vals)))
                mean, lo, hi, _ = mean_ci(per_case)
                means.append(mean)
                shown += [v for v in (mean, lo, hi) if math.isfinite(v) and v > 0]
                errs[0].append(mean - max(lo, mean * 1e-3) if math.isfinite(lo) else 0)
                errs[1].append(hi - mean if math.isfinite(hi) else 0)
            ax.bar(x + (j - 0.5) * 0.38, np.nan_to_num(means), 0.38, yerr=errs, capsize=2.5,
                   color=[KIND_COLORS[k] for k in kinds], alpha=shade, edgecolor="#333333", linewidth=0.5,
                   label=tag, error_kw={"elinewidth": 0.8})
        ax.set_xticks(x, [KIND_LABELS[k] for k in kinds], rotation=25, ha="right")
        ax.set_title(f"{m} (n={len(pairs[m])} case{'s' if len(pairs[m]) != 1 else ''})")
    if shown:  # log axis: false answers start orders of magnitude below the new answer
        axes[0][0].set_yscale("log")
        axes[0][0].set_ylim(min(shown) / 3, min(1.0, max(shown) * 3))
    axes[0][0].set_ylabel("P(answer | edit prompt)" + ("\n= exp(mean token log-prob)" if prob == "mean" else ""))
    light = plt.Rectangle((0, 0), 1, 1, facecolor="#999999", alpha=0.45, edgecolor="#333333")
    dark = plt.Rectangle((0, 0), 1, 1, facecolor="#999999", alpha=1.0, edgecolor="#333333")
    fig.legend([light, dark], ["before edit (light)", "after edit (dark)"], loc="upper center", ncol=2,
               frameon=False, bbox_to_anchor=(0.5, 1.06))
    fig.suptitle("Probability shift of correct vs false answers after appending o* (mean, 95% CI)", y=1.12,
                 fontsize=10)
    fig.tight_layout()
    return png(fig)
