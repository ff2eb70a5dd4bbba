"""The evidence behind a locate-then-edit layer choice: the MLP indirect effect per layer averaged over facts
(ROME, Meng et al. 2022, §2.2 and Fig. 2: the average indirect effect of MLP states at the subject's last token,
which peaks in the early-middle layers and sets ROME's edit layer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from editscope.lm.engine import ScoringEngine
from editscope.locate.causal_trace import trace
from editscope.locate.prompt import encode_prompt


@dataclass
class LayerCurve:
    """Per-layer means over the traced facts: ``effect`` = P(restored) − P(corrupted) (ROME's AIE), and
    ``normalised`` = that effect / (P(clean) − P(corrupted)) per fact (facts whose corruption moved nothing,
    clean ≤ corrupted, are left out of this mean). ``skipped`` holds the facts the model does not know."""

    effect: np.ndarray
    normalised: np.ndarray
    n_facts: int
    window: int
    kind: str = "mlp"
    facts: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def top_layers(self, n: int = 5) -> list[int]:
        return [int(i) for i in np.argsort(-self.effect, kind="stable")[:n]]


def layer_curve(engine: ScoringEngine, facts: Sequence[tuple[str, str, str]], *, kind: str = "mlp",
                window: int | None = None, samples: int = 10, seed: int = 0, known_only: bool = True,
                limit: int | None = None, progress: bool = True,
                done: Sequence[dict] = (), on_fact: Callable[[dict], None] | None = None) -> LayerCurve:
    """Trace ``kind`` states at the subject's last token for each (template, subject, answer) fact and average.

    ``known_only`` keeps facts whose answer's first token is the model's greedy next token (ROME traced only
    facts the model knows); ``limit`` stops after that many traced facts. ``done``: rows of facts traced before
    (as in :attr:`LayerCurve.facts`, e.g. read back from a file ``on_fact`` appended to): they count, enter the
    means and are not traced again, so a stopped curve resumes with the same numbers. ``progress``: one tqdm bar
    on stderr over the facts counted (traced or resumed), unknown facts skipped shown beside it; it changes no
    number."""
    effects, normalised, rows, skipped = [], [], [], []
    used_window = None
    previous = {row["prompt"]: row for row in done}
    bar = tqdm(total=limit if limit is not None else len(facts), desc=f"layer curve ({kind})", unit="fact",
               disable=not progress)
    for template, subject, answer in facts:
        if limit is not None and len(effects) >= limit:
            break
        text = template.replace("{}", subject)
        if text in previous:
            row = previous[text]
            effect = np.asarray(row["effect"], dtype=float)
            effects.append(effect)
            if row["clean_prob"] > row["corrupted_prob"]:
                normalised.append(effect / (row["clean_prob"] - row["corrupted_prob"]))
            rows.append(row)
            bar.update(1)
            continue
        prompt = encode_prompt(engine, template, subject, answer)
        if known_only and int(engine.next_token_logprobs([prompt.text])[0].argmax()) != prompt.answer_id:
            skipped.append(prompt.text)
            bar.set_postfix(unknown_skipped=len(skipped))
            continue
        result = trace(engine, prompt, kinds=(kind,), tokens="subject_last", window=window, samples=samples,
                       seed=seed, progress=False)
        used_window = result.meta["window"]
        last = prompt.subject_span[1] - 1
        effect = result.states[kind][:, last] - result.meta["corrupted_prob"]
        gap = result.meta["clean_prob"] - result.meta["corrupted_prob"]
        effects.append(effect)
        if gap > 0:
            normalised.append(effect / gap)
        rows.append({"prompt": prompt.text, "answer": prompt.answer, "clean_prob": result.meta["clean_prob"],
                     "corrupted_prob": result.meta["corrupted_prob"], "effect": effect.tolist(),
                     "window": used_window, "samples": samples, "seed": seed, "kind": kind})
        if on_fact:
            on_fact(rows[-1])
        bar.update(1)
    bar.close()
    n_layers = engine.bundle.n_layers
    mean = np.mean(effects, axis=0) if effects else np.full(n_layers, np.nan)
    norm = np.mean(normalised, axis=0) if normalised else np.full(n_layers, np.nan)
    used_window = used_window or (rows[0].get("window", 0) if rows else 0)
    return LayerCurve(effect=mean, normalised=norm, n_facts=len(effects), window=used_window, kind=kind,
                      facts=rows, skipped=skipped)
