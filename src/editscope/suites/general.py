"""General ability and known-fact locality of the model as a whole: what long chains of edits erode.

AlphaEdit (§4.3) and the EVK paper (004, Table 1 and §4) follow the model's general ability and the facts it already
knew over 1,000-10,000 sequential edits. No GLUE-like task data ships offline (DESIGN.md), so this suite measures,
on fixed inputs chosen once:

* ``PPL``: perplexity of a fixed wikitext-2 *test* slice (the first paragraphs, each scored as a document from the
  start token, up to ``text_tokens`` tokens): exp of the mean token NLL;
* ``NTA``: next-token accuracy on the same tokens (share whose argmax is the next token);
* ``KnownFacts``: the share of a fixed probe set of facts the *unedited* model knows that the model still answers:
  CounterFact records from the last ``fact_pool`` of the edit split whose prompt occurs nowhere else in the file
  (CounterFact repeats some facts verbatim: so no run of other records edits them), kept when every token of
  ``target_true`` is the argmax after the prompt (zsRE's top-1 rule), the first ``facts``
  of them in file order; chosen on the first probe, which must be of the unedited model (absent when it knows
  none of them, as a random-init test model);
* ``GE``: generation entropy (paper 002, eq 27, paper convention) of greedy continuations of fixed prompts (the
  first words of wikitext paragraphs): a collapsing model repeats itself.

These are properties of the model, not of a case: one probe measures them once and every case of that probe
carries the same numbers (so a checkpoint's mean over its cases is the value). A probe of a model already measured
(same weights fingerprint, e.g. the unedited model before each case in ``mode: single``) is reused.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from editscope.data.corpus import Corpus
from editscope.data.records import Case
from editscope.errors import EditscopeError
from editscope.lm.scorer import Scorer
from editscope.metrics.generation import generation_entropy
from editscope.metrics.registry import MetricSpec
from editscope.suites.base import Suite
from editscope.suites.known_facts import FactPool

_P = "general ability (AlphaEdit §4.3, paper 004 §4)"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("PPL", _P, "exp(mean token NLL), wikitext-2 test slice", False, (1.0, float("inf")), "ppl",
               description="perplexity of a fixed held-out text slice"),
    MetricSpec("NTA", _P, "share of next tokens predicted (argmax)", True,
               description="next-token accuracy on the same slice"),
    MetricSpec("KnownFacts", _P, "share of the known-fact probe set answered (top-1)", True, paper_scale=100,
               description="facts the unedited model knew (never edited) that the model still answers"),
    MetricSpec("GE", "002 (ROME), appendix C.2", "eq 27", True, (0.0, float("inf")), "bits",
               description="generation entropy of greedy continuations of fixed prompts", headline=False),
)


class GeneralAbilitySuite(Suite):
    """General ability and known-fact locality (see the module docstring)."""

    name = "general"
    chooses_edits = False  # the model as a whole: any block's edits

    def __init__(self, *, text_tokens: int = 2048, row_tokens: int = 256, facts: int = 200, fact_pool: int = 3000,
                 fact_dataset: str = "counterfact", generation_prompts: int = 8, generation_tokens: int = 30) -> None:
        for option, value in (("text_tokens", text_tokens), ("row_tokens", row_tokens), ("facts", facts),
                              ("fact_pool", fact_pool), ("generation_prompts", generation_prompts),
                              ("generation_tokens", generation_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EditscopeError(f"general suite: option {option} must be an integer >= 1, not {value!r}")
        self.text_tokens, self.row_tokens = text_tokens, row_tokens
        self.facts, self.fact_pool, self.fact_dataset = facts, fact_pool, fact_dataset
        #: the last fact_pool records whose prompt occurs nowhere else in the file (CounterFact repeats some facts
        #: verbatim: so no run of other records edits them)
        self.pool = FactPool((fact_dataset,), tail=fact_pool)
        self.generation_prompts, self.generation_tokens = generation_prompts, generation_tokens
        self._text: list[str] | None = None
        self._known: list[tuple[str, str]] | None = None
        self._measured: dict[str, dict[str, Any]] = {}  # weights fingerprint -> probe (the last few models)

    metrics_declared = METRICS

    @property
    def protocol(self) -> dict[str, str]:
        return {"name": "general", "note": f"PPL/NTA: the first wikitext-2 test paragraphs of <= {self.row_tokens} "
                f"tokens up to {self.text_tokens} tokens, each scored from the start token; KnownFacts: the first "
                f"{self.facts} of the last {self.fact_pool} {self.fact_dataset} records the unedited model answers "
                f"top-1; GE: greedy {self.generation_tokens} tokens after {self.generation_prompts} fixed prompts"}

    # -- fixed inputs ---------------------------------------------------------------------------------------------
    def text_slice(self, engine: Scorer) -> list[str]:
        """The held-out paragraphs scored for PPL/NTA (wikitext-2 test split first, then validation)."""
        if self._text is None:
            rows, total = [], 0
            for paragraph in Corpus.default().paragraphs():
                n = len(engine.encode_text(paragraph))  # a document, not a prompt
                if n > self.row_tokens:
                    continue
                rows.append(paragraph)
                total += n
                if total >= self.text_tokens:
                    break
            self._text = rows
        return self._text

    def prompts(self, engine: Scorer) -> list[str]:
        """Fixed generation prompts: the first eight words of the slice's first paragraphs."""
        return [" ".join(p.split()[:8]) for p in self.text_slice(engine)[: self.generation_prompts]]

    def known_facts(self, engine: Scorer) -> list[tuple[str, str]]:
        """The (prompt, answer) probe set, chosen on the unedited model (cached on disk by its fingerprint)."""
        if self._known is not None:
            return self._known
        chosen = self.pool.known(engine, self.facts, who="general suite")
        self._known = [(f.prompt, f.answer) for f in chosen.facts]
        if not self._known:  # KnownFacts is then absent from the rows (undefined), not 0
            warnings.warn(f"general suite: the model answers none of the last {self.fact_pool} {self.fact_dataset} "
                          "facts top-1, so KnownFacts is not measured (raise fact_pool)", stacklevel=2)
        return self._known

    # -- probing --------------------------------------------------------------------------------------------------
    def probe_many(self, engine: Scorer, cases: Sequence[Case]) -> list[dict[str, Any]]:
        """One measurement of the model as it is now, shared by every case."""
        known = self.known_facts(engine)
        edited = {r.text for c in cases for r in c.requests} & {p for p, _ in known}
        if edited:
            raise EditscopeError(f"general suite: the run edits a fact of the known-fact probe set "
                                 f"({sorted(edited)[0]!r}); use cases outside the dataset's last fact_pool records")
        fingerprint = engine.fingerprint
        probe = self._measured.get(fingerprint)
        if probe is None:
            probe = self._measure(engine, known)
            self._measured = {k: v for k, v in list(self._measured.items())[-3:]} | {fingerprint: probe}
        return [probe for _ in cases]

    def _measure(self, engine: Scorer, known: list[tuple[str, str]]) -> dict[str, Any]:
        text = engine.score([("", paragraph) for paragraph in self.text_slice(engine)])
        facts = engine.score(known) if known else []
        texts = engine.generate(self.prompts(engine), max_new_tokens=self.generation_tokens)
        return {
            "text": {"nll_sum": -sum(s.sum for s in text), "tokens": sum(s.n_tokens for s in text),
                     "argmax": sum(sum(s.token_is_argmax) for s in text)},
            "facts": {"answered": sum(all(s.token_is_argmax) for s in facts), "n": len(facts)},
            "generation": texts,
        }

    def metrics(self, case: Case, pre: dict[str, Any], post: dict[str, Any]) -> dict[str, float]:
        row: dict[str, float] = {}
        for tag, probe in (("pre", pre), ("post", post)):
            text, facts = probe["text"], probe["facts"]
            mean_nll = text["nll_sum"] / text["tokens"]
            row[f"PPL_{tag}"] = math.exp(mean_nll) if mean_nll < 700 else math.inf  # exp overflows past ~709
            row[f"NTA_{tag}"] = text["argmax"] / text["tokens"]
            if facts["n"]:
                row[f"KnownFacts_{tag}"] = facts["answered"] / facts["n"]
            row[f"GE_{tag}"] = generation_entropy(probe["generation"])
        return row
