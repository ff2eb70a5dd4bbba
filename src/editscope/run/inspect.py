"""The edit card's computation: everything one edit did (the page is rendered by :mod:`editscope.report.card`).

A card replays one edit -- a case of a run directory (:func:`job_from_run`) or an edit given on the command line
(:func:`job_from_request`) -- and measures it through the same suite code the runner uses, so its numbers are the
runner's by construction:

1. the pre-edit probes of the case's suites (the run's block suites, in the run's order and under the runner's
   seeds; then the card's own additions: EVK with a σ sweep, PEAK and 1-to-N where the case has their answer
   lists, and the collateral scan), greedy generations, and optionally the causal trace of the true answer;
2. the edit (the run's method, hparams, plug-ins and runtime settings; seeded as the runner seeds it);
3. the same probes after the edit, the suites' metric rows (``Suite.checked_metrics``, as the runner stores them),
   generations, the trace of the new target, and ΔW (per edited parameter: norms, rank, singular values, size
   relative to W);
4. the weights are restored (checked bit-exactly, as the runner checks them).

The collateral section scores a fixed set of facts the unedited model knows
(:class:`editscope.suites.collateral.CollateralSuite`, the builder the general suite shares) before and after in
one batched pass each, and lists the facts that flipped or lost most log-prob, grouped by relation and by words
they share with the edit's subject or answers. Its flip count is the suite's ``Flipped`` metric.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from editscope.data.records import Case, EditRequest
from editscope.errors import EditscopeError
from editscope.lm.engine import ScoringEngine
from editscope.lm.loading import Bundle
from editscope.metrics.registry import specs_to_json
from editscope.run.blocks import load_blocks
from editscope.run.store import RESULTS, RUN_JSON, read_json, read_results
from editscope.run.trial import Method, Trial, request_dicts
from editscope.suites.base import Suite
from editscope.suites.collateral import SOURCES, CollateralSuite
from editscope.suites.counterfact import CounterFactSuite
from editscope.suites.evk import EvkSuite
from editscope.suites.known_facts import Fact
from editscope.suites.one_to_n import OneToNSuite
from editscope.suites.peak import PeakSuite

FORMAT = "editscope-card-1"
EVK_SIGMAS = (0.05, 0.1, 0.3, 0.6, 1.0)  # the card's σ sweep when the run measured no EVK itself
Log = Callable[[str], None]


@dataclass
class CardJob:
    """One edit to put on a card: the case, the trial that edits and measures it (the run's block suites first,
    in their order, as the runner probes them; then the card's additions), its group (the seeds' identity)."""

    bundle: Bundle
    case: Case
    trial: Trial
    run_suites: tuple[str, ...]  # which of the trial's suites are the run's (the others are the card's)
    requests: tuple[EditRequest, ...]
    group: int = 0
    source: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] | None = None  # the run's stored row of this case and method, when there is one
    chat_template: bool = False  # prompts wrapped in the tokenizer's chat template, as the run's were

    @property
    def method(self) -> Method:
        assert self.trial.method is not None
        return self.trial.method


def _extras(case: Case, present: Mapping[str, Suite], collateral_facts: int,
            collateral_sources: Sequence[str] | None, editor: Any) -> dict[str, Suite]:
    """The card's suites beyond the run's: the ones whose edit is the case's own request (so the edit is the same),
    whose data the case has, and that can measure ``editor``'s edit (none that perturbs prompt embeddings for a
    context editor: its context cannot ride on them)."""
    def has(kind: type) -> bool:
        return any(isinstance(s, kind) for s in present.values())

    out: dict[str, Suite] = {}
    if not has(EvkSuite):
        out[EvkSuite.name] = EvkSuite(sigma=0.3, sigmas=list(EVK_SIGMAS))
    if not has(PeakSuite) and case.valid_answers and case.hard_false:
        out[PeakSuite.name] = PeakSuite()
    if not has(OneToNSuite) and len(case.valid_answers) > 1:
        out[OneToNSuite.name] = OneToNSuite(edits="append")  # append: edits the case's request, like the others
    if not has(CollateralSuite):
        out[CollateralSuite.name] = CollateralSuite(facts=collateral_facts, sources=collateral_sources or SOURCES)
    if editor.kind == "context":
        out = {name: suite for name, suite in out.items() if not suite.reads_prompt_embeddings}
    return out


def sections_of(suites: Mapping[str, Suite]) -> dict[str, str]:
    """Card section -> the name of the (first) suite it shows."""
    out: dict[str, str] = {}
    for name, suite in suites.items():
        if suite.card_section is not None:  # declared by the suite (Suite.card_section)
            out.setdefault(suite.card_section, name)
    return out


def not_replayable(run_dir: str | Path) -> str | None:
    """Why no card can replay the edits of the run at ``run_dir`` (one line), or None when it can: a card replays one
    case's edit alone, which is what the run did only in mode single."""
    from editscope.run.config import RunConfig

    run_dir = Path(run_dir)
    if not (run_dir / RUN_JSON).is_file():
        return f"{run_dir}: no {RUN_JSON} (not a run directory)"
    config = RunConfig.from_run_json(read_json(run_dir / RUN_JSON).get("config"), run_dir / RUN_JSON)
    if not config.mode.alone:
        return (f"{run_dir}: mode {config.mode.label}: a card replays one case's edit alone, which is what the run "
                "did only in mode single")
    return None


def job_from_run(run_dir: str | Path, case_id: str, *, method: str | None = None, dataset: str | None = None,
                 bundle: Bundle | None = None, collateral_facts: int = 500,
                 collateral_sources: Sequence[str] | None = None, log: Log | None = None) -> CardJob:
    """The edit of ``case_id`` in the run at ``run_dir`` (its config's model, method, hparams, plug-ins, runtime and
    seeds). ``method``/``dataset`` pick one when the run has several. Only ``mode: single`` runs replay exactly."""
    from editscope.edit.registry import get_editor
    from editscope.edit.runtime import EditRuntime
    from editscope.run.config import NO_EDIT, RunConfig

    run_dir = Path(run_dir)
    if why := not_replayable(run_dir):
        raise EditscopeError(why)
    meta = read_json(run_dir / RUN_JSON)
    config = RunConfig.from_run_json(meta.get("config"), run_dir / RUN_JSON)
    labels = [m.label for m in config.methods]
    if method is None:
        method = labels[0]
    if method not in labels or method == NO_EDIT:
        raise EditscopeError(f"{run_dir}: --method {method!r}: the run's methods are {', '.join(labels)}")
    blocks = load_blocks(config, limit=meta.get("limit"))
    if dataset is None:
        hits = [b for b in blocks if any(c.case_id == case_id for c in b.cases)]
    else:
        hits = [b for b in blocks if b.label == dataset]
        if not hits:
            raise EditscopeError(f"{run_dir}: --dataset {dataset!r}: the run's datasets are "
                                 f"{', '.join(b.label for b in blocks)}")
    block = next(iter(hits), None)
    index = next((i for i, c in enumerate(block.cases) if c.case_id == case_id), None) if block else None
    if block is None or index is None:
        raise EditscopeError(f"{run_dir}: --case {case_id!r}: no such case in the run's datasets")
    spec = next(m for m in config.methods if m.label == method)
    if bundle is None:
        from editscope.lm import load

        bundle = load(config.model, device=config.device, dtype=config.dtype, progress=log)
    if bundle.fingerprint != meta["model"]["fingerprint"]:
        raise EditscopeError(f"{run_dir}: the run's model has fingerprint {meta['model']['fingerprint']}, the loaded "
                             f"one {bundle.fingerprint}")
    editor = get_editor(spec.name)
    editor.check_model(bundle)
    hp = editor.load_hparams(bundle, spec.hparams, spec.overrides or None, f"method {spec.label!r}: override")
    runtime = EditRuntime(config.settings)
    row = next((r for r in read_results(run_dir / RESULTS) if r["dataset"] == block.label
                and r["case_id"] == case_id and r["method"] == method and not r.get("checkpoint")), None)
    suites = {**block.suites, **_extras(block.cases[index], block.suites, collateral_facts, collateral_sources, editor)}
    trial = Trial(block.label, suites, Method(method, editor, hp, tuple(spec.attached_plugins())), runtime,
                  config.seed, meta.get("prompt_format"))
    return CardJob(bundle, block.cases[index], trial, tuple(block.suites), tuple(block.requests[index]),
                   group=index, source={"run": str(run_dir), "config_digest": meta.get("config_digest")}, row=row,
                   chat_template=config.chat_template)


def job_from_request(bundle: Bundle, method: str, request: EditRequest, *, paraphrases: Sequence[str] = (),
                     neighbours: Sequence[tuple[str, str]] = (), hparams: str | None = None,
                     overrides: Mapping[str, Any] | None = None, plugins: Sequence = (), runtime: Any = None,
                     collateral_facts: int = 500, collateral_sources: Sequence[str] | None = None,
                     seed: int = 0) -> CardJob:
    """An edit given as on ``editscope edit``: a one-request case measured by the CounterFact suite (its prompt,
    ``paraphrases`` and ``neighbours`` = ``(prompt, answer)``), plus the card's own suites."""
    from editscope.edit.hparams import noting_derived
    from editscope.edit.registry import get_editor
    from editscope.edit.runtime import EditRuntime
    editor = get_editor(method)
    editor.check_model(bundle)
    hp, derived = noting_derived(lambda: editor.load_hparams(bundle, hparams, dict(overrides) if overrides else None))
    valid = list(dict.fromkeys([*request.correct_answers] + ([request.target_true] if request.target_true else [])))
    case = Case("edit", "cli", (request,), paraphrase_prompts=list(paraphrases), neighborhood=list(neighbours),
                valid_answers=valid if request.correct_answers else [], hard_false=list(request.hard_false))
    suites: dict[str, Suite] = {CounterFactSuite.name: CounterFactSuite()} if request.target_true else {}
    trial = Trial("cli", {**suites, **_extras(case, suites, collateral_facts, collateral_sources, editor)},
                  Method(editor.display(list(plugins)), editor, hp, tuple(plugins)),
                  runtime or EditRuntime.from_settings({}, where="card"), seed)
    source: dict[str, Any] = {"cli": True} | ({"derived_hparams": derived} if derived else {})
    return CardJob(bundle, case, trial, tuple(suites), (request,), source=source)


# -- measuring ---------------------------------------------------------------------------------------------------

def _candidates(pre: dict[str, Any], post: dict[str, Any]) -> list[dict[str, Any]]:
    """Every scored candidate of a suite's probes, pre and post side by side (log-prob summed over the answer's
    tokens; ``p_*`` = exp of the mean token log-prob, the probability PEAK and ROME compare; ``top1_*``: every token
    the argmax, None where the suite's probe does not record it, as a plug-in suite's need not)."""
    out = []
    for a, b in zip(pre.get("prompts", []), post.get("prompts", []), strict=True):
        for x, y in zip(a.get("candidates", []), b.get("candidates", []), strict=True):
            n = int(x["n_tokens"])
            out.append({"role": a["role"], "prompt": a["prompt"], "text": x["text"], "kind": x["kind"],
                        "n_tokens": n, "pre": float(x["logprob_sum"]), "post": float(y["logprob_sum"]),
                        "p_pre": math.exp(float(x["logprob_sum"]) / n), "p_post": math.exp(float(y["logprob_sum"]) / n),
                        "top1_pre": _top1(x), "top1_post": _top1(y)})
    return out


def _top1(candidate: dict[str, Any]) -> bool | None:
    flags = candidate.get("token_is_argmax")
    return None if flags is None else all(flags)


def _answers(pre: dict[str, Any], post: dict[str, Any]) -> list[dict[str, Any]]:
    """The answers a suite's probes hold (the wild suite's generated answers), pre and post side by side."""
    return [{"role": a["role"], "prompt": a["prompt"], "gold": list(a.get("gold", [])), "pre": a["answer"],
             "post": b["answer"]}
            for a, b in zip(pre.get("prompts", []), post.get("prompts", []), strict=True) if "answer" in a]


_WORD = re.compile(r"[\w']+")
_STOP = frozenset({"the", "of", "and", "in", "on", "at", "to", "for", "a", "an", "is", "was", "by", "from", "with",
                   "de", "la", "le", "der", "von", "van"})


def words(text: str) -> set[str]:
    """Lower-case words of ``text`` (3+ characters, a few stop words dropped): what 'shares a word' compares."""
    return {w for w in (m.lower() for m in _WORD.findall(text)) if len(w) >= 3 and w not in _STOP}


def _collateral(suite: CollateralSuite, engine: ScoringEngine, case: Case, requests: Sequence[EditRequest],
                pre_scan: tuple[list[float], list[bool]], post_scan: tuple[list[float], list[bool]],
                top: int) -> dict[str, Any]:
    """The scan's facts before and after: flipped ones, the largest log-prob drops, and both grouped."""
    known = suite.known(engine)
    excluded = set(suite.excluded(engine, case))
    subject_words = set().union(*(words(r.subject) for r in requests))
    object_words = set().union(*(words(r.target_new) | words(r.target_true or "") for r in requests))
    facts = []
    (lp_pre, top1_pre), (lp_post, top1_post) = pre_scan, post_scan
    for i, (fact, a, b, top_pre, top_post) in enumerate(zip(known.facts, lp_pre, lp_post, top1_pre, top1_post,
                                                              strict=True)):
        if i in excluded:
            continue
        fact_words = words(fact.prompt) | words(fact.answer)
        facts.append({"index": i, "prompt": fact.prompt, "answer": fact.answer, "relation": fact.relation,
                      "source": fact.source, "pre": a, "post": b, "shift": b - a,
                      "top1_pre": top_pre, "top1_post": top_post, "flipped": top_pre and not top_post,
                      "shares_subject": sorted(fact_words & subject_words),
                      "shares_object": sorted(fact_words & object_words)})

    def group(key: Callable[[dict], str]) -> list[dict[str, Any]]:
        groups: dict[str, list[dict]] = {}
        for f in facts:
            groups.setdefault(key(f), []).append(f)
        rows = [{"group": k, "n": len(v), "flipped": sum(f["flipped"] for f in v),
                 "mean_shift": float(np.mean([f["shift"] for f in v])),
                 "min_shift": float(min(f["shift"] for f in v))} for k, v in groups.items()]
        return sorted(rows, key=lambda r: (-r["flipped"], r["mean_shift"]))

    def overlap(f: dict) -> str:
        if f["shares_subject"] and f["shares_object"]:
            return "shares subject and object words"
        if f["shares_subject"]:
            return "shares subject words"
        return "shares object words" if f["shares_object"] else "shares no word"

    flipped = [f for f in facts if f["flipped"]]
    return {
        "n": len(known.facts), "counted": sum(f["top1_pre"] for f in facts), "excluded": sorted(excluded),
        "flipped": len(flipped), "sources": list(suite.sources), "scanned": known.scanned,
        "mean_shift": float(np.mean([f["shift"] for f in facts])) if facts else float("nan"),
        "flipped_facts": sorted(flipped, key=lambda f: f["shift"]),
        "largest_drops": sorted(facts, key=lambda f: f["shift"])[:top],
        "by_relation": group(lambda f: f["relation"]),
        "by_overlap": group(overlap),
        "shifts": [round(f["shift"], 4) for f in facts],
    }


def _layer_of(name: str) -> int | None:
    found = re.search(r"\.(\d+)\.", name)
    return int(found.group(1)) if found else None


def delta_stats(patch: Any, bundle: Bundle, *, n_singular: int = 12) -> list[dict[str, Any]]:
    """ΔW per edited parameter (call with the model restored, so the parameters hold W): Frobenius norms of ΔW and
    W and their ratio, ΔW's numerical rank (at the precision ΔW is stored in) and leading singular values, and its
    largest singular value against W's (PRUNE compares the two)."""
    params = dict(bundle.model.named_parameters())
    out = []
    for name, delta in getattr(patch, "deltas", {}).items():  # a memory or context edit writes no weight
        d = delta.detach().to("cpu", torch.float64)
        w = params[name].detach().to("cpu", torch.float64)
        entry: dict[str, Any] = {"name": name, "layer": _layer_of(name), "shape": list(d.shape),
                                 "norm": float(d.norm()), "w_norm": float(w.norm()),
                                 "relative": float(d.norm() / w.norm()) if float(w.norm()) else float("nan"),
                                 "nonzero": int((d != 0).sum()), "numel": d.numel()}
        if d.dim() == 2:
            s = torch.linalg.svdvals(d)
            sw = torch.linalg.svdvals(w)
            # rank at the tolerance of ΔW's own precision (a float32 rank-one update has ~1e-8 noise singular values)
            rtol = max(d.shape) * torch.finfo(delta.dtype).eps
            entry |= {"rank": int(torch.linalg.matrix_rank(d, rtol=rtol)),
                      "singular": [float(x) for x in s[:n_singular]],
                      "spectral": float(s[0]), "w_spectral": float(sw[0]),
                      "spectral_relative": float(s[0] / sw[0]) if float(sw[0]) else float("nan")}
        out.append(entry)
    return out


def _trace(engine: ScoringEngine, request: EditRequest, answer: str | None, samples: int, progress: bool,
           ) -> dict[str, Any]:
    from editscope.locate import locate

    result = locate(engine, "causal_trace", request.prompt, request.subject, answer, progress=progress,
                    samples=samples)
    out = result.to_dict()
    out.pop("layer_scores", None)  # the neuron sums of a trace: not what the card shows
    return out


class _Steps:
    """The card's progress lines (``card [k/n] ...``) and the seconds each stage took."""

    def __init__(self, say: Log, steps: int) -> None:
        self.say = say
        self.steps = steps
        self.timing: dict[str, float] = {}
        self.clock = time.perf_counter()

    def step(self, k: int, what: str) -> None:
        self.say(f"card [{k}/{self.steps}] {what}")

    def lap(self, key: str) -> None:
        now = time.perf_counter()
        self.timing[key] = now - self.clock
        self.clock = now


@dataclass
class _Measured:
    """One side of the edit: the suites' probes of the case, the collateral scan and the generations."""

    probes: Any
    scan: Any
    text: list[str]


def _measure(job: CardJob, engine: ScoringEngine, collateral: CollateralSuite | None, gen_prompts: list[str],
             generate_tokens: int, *stage: str) -> _Measured:
    """Probe the case (``stage``: "pre" before the edit), scan the known facts and generate, on the model as it is."""
    probes = job.trial.probe(engine, [job.case], *stage).of(0)
    scan = collateral.scan(engine) if collateral is not None else ([], [])
    text = engine.generate(gen_prompts, max_new_tokens=generate_tokens) if generate_tokens else []
    return _Measured(probes, scan, text)


def _card_engine(job: CardJob) -> ScoringEngine:
    """The engine of an unedited model that wraps prompts as the run did."""
    if job.bundle.applied:
        raise EditscopeError(f"card: the model already holds {len(job.bundle.applied)} patch(es); a card starts from "
                             "the unedited model")
    engine, trial = ScoringEngine(job.bundle, chat_template=job.chat_template), job.trial
    if engine.prompt_format != trial.prompt_format:  # the run's rows were measured on the prompts as it wrapped them
        raise EditscopeError(f"card: the run's prompt format {trial.prompt_format} is not what this model's "
                             f"tokenizer gives ({engine.prompt_format})")
    return engine


def _card_body(job: CardJob, pre: _Measured, post: _Measured, metrics: dict[str, Any], gen_prompts: list[str],
               patch: Any) -> dict[str, Any]:
    """The card's sections every card has: model, case, method, suites, generations and ΔW."""
    bundle, case, trial, method, suites = job.bundle, job.case, job.trial, job.method, job.trial.suites
    return {
        "format": FORMAT,
        "model": {"name": bundle.name, "fingerprint": bundle.fingerprint, "n_layers": bundle.n_layers},
        "case": {"dataset": trial.dataset, "case_id": case.case_id, "requests": request_dicts(job.requests),
                 "paraphrases": list(case.paraphrase_prompts), "neighborhood": [list(x) for x in case.neighborhood]},
        "method": {"label": method.label, "editor": method.editor.name, "display": method.display,
                   "hparams": method.hp.to_dict(), "conventions": method.hp.protocol(),
                   "plugins": [p.to_dict() for p in method.plugins], "runtime": trial.runtime.settings.recorded()},
        "source": job.source,
        "suites": {name: {"run_suite": name in job.run_suites, "protocol": protocol[name],
                          "declared": specs_to_json(s.declarations.specs), "metrics": metrics[name],
                          "candidates": _candidates(pre.probes[name], post.probes[name]),
                          "answers": _answers(pre.probes[name], post.probes[name])}
                   for protocol in [trial.protocol()] for name, s in suites.items()},
        "sections": sections_of(suites),
        "generation": [{"prompt": p, "pre": a, "post": b} for p, a, b in zip(gen_prompts, pre.text, post.text,
                                                                              strict=True)],
        "delta": delta_stats(patch, bundle),
        "edit_info": {k: v for k, v in patch.info.items() if isinstance(v, bool | int | float | str)},
    }


def _evk_curves(suites: Mapping[str, Suite], label: str, metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The EVK suite's stability curves over σ of this edit, or None without an EVK suite."""
    evk = next((name for name, s in suites.items() if isinstance(s, EvkSuite)), None)
    if evk is None:
        return None
    s = suites[evk]
    curves = s.stability_by_sigma([{"method": label, "metrics": {evk: metrics[evk]}}], [label])
    return {"suite": evk, "sigma": s.sigma, "curves": {
        panel: [[p[0], p[1]] for p in points] for panel, points in curves.get(label, {}).items()}}


def _statistics_first(job: CardJob, method: Any, say: Log, progress: bool) -> None:
    """The layer statistics the editor reads, computed (or read from the disk cache) before the edit is timed: the
    card's "edit" time is the edit's, not the first run's statistics pass."""
    layers = method.editor.stats_layers(method.hp)
    if not layers:
        return
    from editscope.stats import second_moments

    say(f"card: layer statistics for layers {sorted(layers)} (cached on disk after the first time)")
    second_moments(job.bundle, sorted(layers), token_budget=method.editor.stats_tokens(method.hp), progress=progress,
                   stats_dtype=method.editor.stats_dtype(method.hp))


def compute_card(job: CardJob, *, generate_tokens: int = 20, trace: bool = False, trace_samples: int = 10,
                 top: int = 25, progress: bool = True, log: Log | None = None) -> dict[str, Any]:
    """Measure ``job``'s edit (see the module docstring); the card as a JSON-ready dict. The model is restored on
    return, also on error."""
    say = log or ((lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None))
    request, trial, method = job.requests[0], job.trial, job.method
    engine = _card_engine(job)
    suites = trial.suites
    steps = _Steps(say, 6 if trace else 4)
    gen_prompts = list(dict.fromkeys([request.text, *job.case.paraphrase_prompts]))[:4] if generate_tokens else []
    steps.step(1, f"the collateral probe set and pre-edit probes of {', '.join(suites)}")
    collateral = next((s for s in suites.values() if isinstance(s, CollateralSuite)), None)
    if collateral is not None:
        collateral.known(engine, progress=progress)  # chosen (once per model) before the timed probes
    pre = _measure(job, engine, collateral, gen_prompts, generate_tokens, "pre")
    steps.lap("pre")
    traces: dict[str, Any] = {"pre": None, "post": None}
    if trace:
        steps.step(2, "causal trace of the true answer before the edit")
        traces["pre"] = _trace(engine, request, request.target_true, trace_samples, progress)
        steps.lap("trace_pre")
    steps.step(3 if trace else 2, f"edit with {method.label}")
    _statistics_first(job, method, say, progress)  # cached on disk; not part of the edit's time
    steps.lap("statistics")
    with trial.edited(job.bundle, job.requests, engine=engine, group=job.group) as patch:
        steps.lap("edit")
        steps.step(4 if trace else 3, "post-edit probes, generations and the collateral scan")
        post = _measure(job, engine, collateral, gen_prompts, generate_tokens)
        steps.lap("post")
        if trace:
            steps.step(5, "causal trace of the new target after the edit")
            traces["post"] = _trace(engine, request, request.target_new, trace_samples, progress)
            steps.lap("trace_post")
    steps.step(steps.steps, "ΔW and the page")
    metrics = trial.metrics(job.case, pre.probes, post.probes)
    card = _card_body(job, pre, post, metrics, gen_prompts, patch)
    evk_curves = _evk_curves(suites, method.label, metrics)
    if evk_curves is not None:
        card["evk_curves"] = evk_curves
    if collateral is not None:
        card["collateral_scan"] = _collateral(collateral, engine, job.case, job.requests, pre.scan, post.scan, top)
    if trace:
        card["trace"] = traces
    if job.row is not None:
        card["run_row"] = {"metrics": job.row.get("metrics", {}), "edit_seconds": job.row.get("edit_seconds")}
    steps.lap("page")
    card["timing"] = steps.timing
    return card


__all__ = ["FORMAT", "CardJob", "Fact", "compute_card", "delta_stats", "job_from_request", "job_from_run",
           "not_replayable", "sections_of", "words"]
