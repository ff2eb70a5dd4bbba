"""``editscope tune``'s driver: candidates -> successive halving through the ordinary runner -> the choice ->
an hparams YAML with a ``provenance:`` block and a report page.

Layout of the output directory (everything resumable: a rerun skips what is done)::

    OUT/tune.json              the search's settings, candidates and validation slice (a rerun must match them)
    OUT/state.json             wall seconds spent so far, rung results (rewritten atomically)
                               (both sealed with a content digest, checked on a rerun: :mod:`editscope.integrity`)
    OUT/layer_curve.jsonl      traced facts of the layer curve (one line per fact; resumed)
    OUT/candidates/<id>/       one ordinary run directory per candidate (run.json, results.jsonl, summary.*);
                               with ``sequential``, one per candidate and rung: <id>/chain-<N> (a chain of N edits)
    OUT/reference/             the editor alone (base hparams, no plug-ins) on the same cases, when the objective's
                               guard compares with it (PEAK: efficacy); an ordinary run directory too
    OUT/tuned.yaml             the chosen hparams + provenance
    OUT/report.md, search.png  the search curve and every candidate's scores
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from editscope.atomic import atomic_write_text
from editscope.errors import EditscopeError
from editscope.finite import nulled
from editscope.integrity import dumps_sealed, read_json, trusting, unverified
from editscope.tune.search import (
    OBJECTIVES,
    CandidateScore,
    HalvingResult,
    StopSearch,
    Unmeasured,
    rung_sizes,
    score_rows,
    select,
    sequential_objective,
    successive_halving,
)
from editscope.tune.space import Candidate, candidates, knob_grids, layer_candidates
from editscope.tune.validation import validation_slice

TUNE_JSON, STATE_JSON, CURVE_JSONL, TUNED_YAML, REPORT_MD, SEARCH_PNG = (
    "tune.json", "state.json", "layer_curve.jsonl", "tuned.yaml", "report.md", "search.png")
SCAN_FACTOR = 25
"""The layer curve looks for its known facts among at most this many times ``trace_facts`` pool records."""
#: ``--dataset`` choice -> (the registered dataset its validation records come from, its key in OBJECTIVES)
TARGETS: dict[str, tuple[str, str]] = {"counterfact": ("counterfact", "counterfact"), "zsre": ("zsre", "zsre"),
                                       "peak-cf": ("peak-cf", "peak"), "counterfact-evk": ("counterfact", "evk")}
REFERENCE_DIR = "reference"


@dataclass
class TuneSettings:
    """What ``editscope tune`` was asked (the settings that change a number are in :meth:`digest`)."""

    model: str
    method: str
    out: str
    budget_minutes: float = 30.0
    plugins: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    hparams: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    knobs: list[str] | None = None
    grid: dict[str, tuple] = field(default_factory=dict)
    dataset: str = "counterfact"
    first: int = 8
    eta: int = 3
    max_cases: int = 24
    trace_facts: int = 16
    trace_samples: int = 10
    neighbourhood: int = 1
    seed: int = 0
    runtime: dict[str, Any] = field(default_factory=dict)
    #: 0: single edits (each case edited alone, from the unedited model). N > 0: sequential editing -- on a rung of
    #: n cases each candidate edits the n cases as one chain in batches of N (the editor's state carried through),
    #: scored after the last batch on every edited case, with KnownFacts in the objective (sequential_objective)
    sequential: int = 0
    #: None: the validation slice starts at the first run of records no shipped config reports on; N: at record N
    #: (the provenance counts the records of it that shipped configs report on)
    validation_offset: int | None = None

    def digest(self) -> str:
        data = asdict(self)
        for key in ("out", "budget_minutes"):  # where and how long: a rerun may raise the budget
            data.pop(key)
        if data["validation_offset"] is None:  # the default: tunes begun before the option keep their digest
            data.pop("validation_offset")
        return hashlib.blake2b(json.dumps(data, sort_keys=True, default=list).encode(), digest_size=10).hexdigest()


@dataclass
class TuneResult:
    out: Path
    chosen: Candidate | None
    yaml_path: Path | None
    halving: HalvingResult
    wall_seconds: float
    evaluated: int  # candidate evaluations that computed rows in this session
    reference: dict[int, CandidateScore] = field(default_factory=dict)  # the editor alone per rung (cases -> score)


def _sealed(data: dict[str, Any]) -> str:
    """``data`` as JSON with its content digest (:mod:`editscope.integrity`), so a rerun refuses an altered file."""
    return dumps_sealed(json.loads(json.dumps(nulled(data)[0], default=list, allow_nan=False)), indent=1)


class Tuner:
    """One search (see the module docstring). ``bundle`` reuses a loaded model; ``log`` receives progress lines."""

    def __init__(self, settings: TuneSettings, *, bundle: Any = None, progress: bool = True,
                 log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 trust_unverified: bool = False) -> None:
        if settings.dataset not in TARGETS:
            raise EditscopeError(f"--dataset {settings.dataset!r}: tune scores {', '.join(TARGETS)}")
        self.s = settings
        self.out = Path(settings.out)
        self.bundle = bundle
        self.progress = progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.clock = clock
        self.data_name, objective = TARGETS[settings.dataset]
        self.objective = OBJECTIVES[objective]
        if settings.sequential:
            try:
                self.objective = sequential_objective(self.objective)
            except ValueError as exc:
                raise EditscopeError(f"--sequential with --dataset {settings.dataset}: {exc}") from None
        self.evaluated = 0
        self.reference: dict[int, CandidateScore] = {}
        #: accept tune.json / state.json written without a content digest (recorded in the provenance)
        self.trust_unverified = trust_unverified
        from editscope.run.trial import PreProbeCache

        #: the unedited model's probes of a rung's cases, computed once for every candidate (and the reference)
        self.pre_probes = PreProbeCache()

    # -- set-up ---------------------------------------------------------------------------------------------
    def _load(self) -> None:
        from editscope.edit.registry import get_editor
        from editscope.lm import load

        self.editor = get_editor(self.s.method)
        self.plugins = self.editor.attach(self.s.plugins, "--plugin")
        if self.bundle is None:
            self.log(f"loading model {self.s.model}")
            self.bundle = load(self.s.model, progress=self.log)
        self.editor.check_model(self.bundle)
        self.base = self.editor.load_hparams(self.bundle, self.s.hparams, self.s.overrides or None)
        from editscope.run.suites import make_suite

        self.specs = tuple(spec for suite in self.objective.suites for spec in make_suite(suite, {}).declarations.specs)

    def _layer_curve(self) -> tuple[list[float] | None, dict[str, Any]]:
        """The MLP indirect effect per layer over ``trace_facts`` facts the model knows, drawn from the general
        suite's fact pool (records no run edits), resumed from ``layer_curve.jsonl``."""
        from functools import partial

        from editscope.data import load_cases
        from editscope.jsonl import append_record, read_records
        from editscope.lm.engine import ScoringEngine
        from editscope.locate.layers import layer_curve
        from editscope.suites.general import GeneralAbilitySuite

        pool = GeneralAbilitySuite()
        cases = load_cases(pool.fact_dataset)[-pool.fact_pool:]
        facts = [(c.request.prompt, c.request.subject, c.request.target_true) for c in cases
                 if c.request.target_true]
        path = self.out / CURVE_JSONL
        done = read_records(path, repair=True) if path.is_file() else []
        self.log(f"layer curve: MLP indirect effect over {self.s.trace_facts} known facts ({len(done)} traced before)")
        facts = facts[: self.s.trace_facts * SCAN_FACTOR]  # a model that knows few facts is not scanned for long
        curve = layer_curve(ScoringEngine(self.bundle), facts, samples=self.s.trace_samples, seed=self.s.seed,
                            limit=self.s.trace_facts, done=done, on_fact=partial(append_record, path),
                            progress=self.progress)
        info = {"facts": curve.n_facts, "source": f"{pool.fact_dataset}, last {pool.fact_pool} records (the general "
                f"suite's known-fact pool), known facts only", "window": curve.window, "samples": self.s.trace_samples,
                "effect": [round(float(x), 6) for x in curve.effect]}
        if curve.n_facts == 0:
            self.log("layer curve: the model knows none of the facts; candidate layers come from the published depth")
            return None, info
        return [float(x) for x in curve.effect], info

    def _space(self) -> tuple[dict[str, tuple], list[Candidate], dict[str, Any]]:
        hp_tunable = self.base.tunable()
        plugin_tunable = {p.name: p.hparams.tunable() for p in self.plugins}
        needs_layers = ("layers" in hp_tunable and "layers" not in self.s.grid
                        and (self.s.knobs is None and not self.plugins or "layers" in (self.s.knobs or [])))
        # an unknown knob, or nothing to search, fails here, before the layer curve is traced
        if not knob_grids(hp_tunable, plugin_tunable, knobs=self.s.knobs, grid=self.s.grid,
                          layers=[list(self.base.layers)], tune_editor=not self.plugins):
            declared = [*hp_tunable, *(f"{n}.{k}" for n, t in plugin_tunable.items() for k in t)]
            raise EditscopeError(f"{self.editor.display(self.plugins)}: nothing to search (declared knobs: "
                                 f"{', '.join(declared) or 'none'}; name editor knobs with --knobs)")
        layers, why = None, {}
        if needs_layers:
            curve, info = self._layer_curve()
            layers, why = layer_candidates(self.s.method, self.bundle.arch.family, self.bundle.n_layers, curve,
                                           list(self.base.layers), self.s.neighbourhood)
            why["curve"] = info
        grids = knob_grids(hp_tunable, plugin_tunable, knobs=self.s.knobs, grid=self.s.grid, layers=layers,
                           tune_editor=not self.plugins)
        return grids, candidates(grids), why

    def _check_settings(self, grids: dict[str, tuple], cands: list[Candidate], slice_: dict) -> None:
        """Write ``tune.json`` or, on a rerun, refuse one of other settings."""
        meta = {"format": "editscope-tune-1", "digest": self.s.digest(), "settings": asdict(self.s),
                "model_fingerprint": self.bundle.fingerprint, "grids": {k: list(v) for k, v in grids.items()},
                "candidates": {c.id: c.to_dict() for c in cands}, "validation": slice_}
        path = self.out / TUNE_JSON
        if path.is_file():
            old = read_json(path, what="tune settings", hint="delete it to write it again from these settings (the "
                            "candidates' runs check their own configs)")
            if old.get("digest") != meta["digest"] or old.get("model_fingerprint") != meta["model_fingerprint"]:
                raise EditscopeError(f"{self.out} holds a tune of other settings or another model; use another "
                                     "--out or the same settings")
            if old.get("candidates") != meta["candidates"]:
                raise EditscopeError(f"{self.out} holds a tune with other candidates (the layer curve or the "
                                     "declared grids changed); use another --out")
        atomic_write_text(path, _sealed(meta))

    def _prepare(self, cands: list[Candidate]) -> float:
        """Run the editor's declared preparation (MEND: training to every candidate's ``steps``) for the
        hparams of every candidate, before the search; returns the seconds it took."""
        if self.editor.prepare is None:
            return 0.0
        t0 = self.clock()
        hparams = [self.editor.hparams_class.from_dict({**self.base.to_dict(), **dict(c.hparams)},
                                                       f"<tune candidate {c.id}>") for c in cands]
        self.editor.prepare(self.bundle, hparams, self.log, progress=self.progress)
        seconds = self.clock() - t0
        self.log(f"{self.editor.display(self.plugins)}: prepared in {seconds:.0f} s (not counted in the budget)")
        return seconds

    # -- evaluation -----------------------------------------------------------------------------------------
    def _config(self, cand: Candidate | None, slice_: dict, n: int) -> Any:
        """The run config of a candidate, or (``cand`` None) of the reference: the editor alone, base hparams and
        fixed overrides, no plug-ins. Single edits: one config for every rung (a rung runs its first ``n`` cases);
        sequential: a chain over the first ``n`` cases, probed once after its last batch."""
        from editscope.run.config import parse_config

        plugins = []
        for p in self.plugins if cand is not None else ():
            values = {k: v for k, v in p.to_dict().items() if k != "name"}
            values.update(dict(dict(cand.plugins).get(p.name, ())))
            plugins.append({"name": p.name, **values})
        searched = dict(cand.hparams) if cand is not None else {}
        label = cand.id if cand is not None else REFERENCE_DIR
        method = {"name": self.s.method, "label": label, "overrides": {**self.s.overrides, **searched}}
        if self.s.hparams:
            method["hparams"] = str(Path(self.s.hparams).resolve())
        if plugins:
            method["plugins"] = plugins
        mode: Any = "single"
        limit = slice_["limit"]
        if self.s.sequential:
            rounds = -(-n // self.s.sequential)
            mode = {"sequential_batches": {"batch": self.s.sequential, "rounds": rounds, "checkpoints": rounds}}
            limit = n
        data = {"model": self.s.model, "seed": self.s.seed, "output": str(self._dir(cand, n)),
                "mode": mode, "methods": [method],
                "dataset": slice_["dataset"], "slice": {"offset": slice_["offset"], "limit": limit},
                "suites": list(self.objective.suites)}
        if self.s.runtime:
            data["runtime"] = dict(self.s.runtime)
        return parse_config(data, where=f"<tune {'candidate ' + cand.id if cand is not None else 'reference'}>")

    def _dir(self, cand: Candidate | None, n: int) -> Path:
        base = self.out / "candidates" / cand.id if cand is not None else self.out / REFERENCE_DIR
        return base / f"chain-{n}" if self.s.sequential else base

    def _rows(self, cand: Candidate | None, n: int) -> list[dict[str, Any]]:
        """The rows of the first ``n`` cases (sequential: the chain's final probe, after its last batch)."""
        from editscope.run.store import RESULTS, read_results

        path = self._dir(cand, n) / RESULTS
        rows = read_results(path) if path.is_file() else []
        return sorted((r for r in rows if r["index"] < n and not r.get("checkpoint")), key=lambda r: r["index"])

    def _metrics(self, cand: Candidate | None, n: int, slice_: dict,
                 spent: Callable[[], float]) -> list[dict[str, Any]]:
        """The suite's metrics of the first ``n`` validation cases of a candidate (None: the reference), computing
        the missing rows (only while budget is left)."""
        rows = self._rows(cand, n)
        if len(rows) < n:
            if spent() >= self.s.budget_minutes * 60:
                self.log(f"budget of {self.s.budget_minutes:g} min spent ({spent() / 60:.1f} min): stopping; rerun "
                         "with a larger --budget to go on")
                raise StopSearch
            from editscope.run.runner import Runner

            Runner(self._config(cand, slice_, n), limit=None if self.s.sequential else n, bundle=self.bundle,
                   progress=self.progress, log=lambda _m: None, pre_probes=self.pre_probes).run()
            if cand is not None:
                self.evaluated += 1
            rows = self._rows(cand, n)
        return [{k: v for suite in self.objective.suites for k, v in r["metrics"][suite].items()} for r in rows]

    def _reference(self, n: int, slice_: dict, spent: Callable[[], float]) -> list[dict[str, Any]] | None:
        """The reference run's metrics on the first ``n`` cases when the guard compares with the editor alone
        (scored and logged once per rung), else None."""
        if self.objective.guard_reference != "editor_alone":
            return None
        metrics = self._metrics(None, n, slice_, spent)
        if n not in self.reference:
            self.reference[n] = ref = score_rows(metrics, self.objective, self.specs, reference=metrics)
            self.log(f"[{n} cases] reference ({self.editor.display([])} alone): {self._line(ref)}")
        return metrics

    def _evaluate(self, cand: Candidate, n: int, slice_: dict, spent: Callable[[], float]) -> CandidateScore:
        reference = self._reference(n, slice_, spent)
        try:
            return score_rows(self._metrics(cand, n, slice_, spent), self.objective, self.specs, reference=reference)
        except Unmeasured as exc:
            raise EditscopeError(f"{self.bundle.name}: {exc}") from None

    def _line(self, s: CandidateScore) -> str:
        """One candidate's numbers for the log: the score with its CI, then each reported metric's mean."""
        per = "  ".join(f"{k} {100 * m:.1f}" for k, (m, _lo, _hi) in s.metrics.items())
        return (f"{self.objective.score} {100 * s.score:.1f} [{100 * s.score_lo:.1f}, {100 * s.score_hi:.1f}]  "
                f"{per}")

    # -- the search -----------------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        from editscope.run.store import run_lock

        self.out.mkdir(parents=True, exist_ok=True)
        with run_lock(self.out), trusting(self.trust_unverified):
            return self._run()

    def _state(self, path: Path) -> dict[str, Any]:
        """``state.json`` (checked; {} when there is none yet)."""
        if not path.is_file():
            return {}
        state = read_json(path, what="tune state", hint="delete it to count the budget from zero (the candidates' rows "
                          "are kept)")
        wall = state.get("wall_seconds", 0.0)
        if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not 0 <= wall < float("inf"):
            raise EditscopeError(f"{path}: field 'wall_seconds': expected a number >= 0, got {wall!r:.40}; delete "
                                 "it to count the budget from zero")
        return state

    def _run(self) -> TuneResult:
        self._load()
        state_path = self.out / STATE_JSON
        state = self._state(state_path)
        before = float(state.get("wall_seconds", 0.0))
        t0 = self.clock()

        def spent() -> float:
            return before + self.clock() - t0

        slice_ = validation_slice(self.data_name, self.s.max_cases, offset=self.s.validation_offset)
        grids, cands, layer_why = self._space()
        self._check_settings(grids, cands, slice_)
        t0 += self._prepare(cands)  # cached training the candidates need: not the search's budget
        by_id = {c.id: c for c in cands}
        sizes = rung_sizes(self.s.first, self.s.eta, len(cands), self.s.max_cases)
        if self.s.sequential:
            self.log(f"sequential: each candidate edits a rung's cases as one chain in batches of "
                     f"{self.s.sequential}, probed after the last batch")
        self.log(f"tune {self.editor.display(self.plugins)} on {self.bundle.name}: {len(cands)} candidates over "
                 f"{', '.join(f'{k} {list(v)}' for k, v in grids.items())}")
        self.log(f"validation: {slice_['dataset']} records {slice_['offset']}..{slice_['offset'] + slice_['limit'] - 1}"
                 f" ({self._validation_note(slice_)}); rungs of {sizes} cases, keep 1/{self.s.eta}")
        self.log(f"objective: {self.objective.describe()}")
        rung_no = {n: i for i, n in enumerate(sizes)}

        def evaluate(cid: str, n: int) -> CandidateScore:
            score = self._evaluate(by_id[cid], n, slice_, spent)
            g = self.objective.guard
            self.log(f"[rung {rung_no[n] + 1}/{len(sizes)}, {n} cases] {cid} {by_id[cid].label()}: "
                     f"{self._line(score)}  ({g} {self.objective.reference_label} {100 * score.guard_ref:.1f}, floor "
                     f"{100 * score.guard_floor:.1f}) {'ok' if score.local else f'REFUSED ({g} guard)'}"
                     f"  [{spent() / 60:.1f} of {self.s.budget_minutes:g} min]")
            self._save_state(state_path, spent(), None)
            return score

        result = successive_halving([c.id for c in cands], sizes, self.s.eta, evaluate)
        wall = spent()
        chosen_id = select(result.rungs[-1][1]) if result.rungs else None
        chosen = by_id[chosen_id] if chosen_id else None
        self._save_state(state_path, wall, result)
        yaml_path = None
        if chosen is not None:
            yaml_path = self._write_yaml(chosen, result, slice_, grids, layer_why, wall, sizes)
        from editscope.tune.page import write_page

        write_page(self.out, result, by_id, chosen_id, self.objective, sizes, wall, self.s, self.reference)
        return TuneResult(self.out, chosen, yaml_path, result, wall, self.evaluated, dict(self.reference))

    @staticmethod
    def _validation_note(slice_: dict) -> str:
        if not slice_["overlap"]:
            return f"{slice_['chosen']}: no shipped config reports on them"
        shared = ", ".join(f"{e['records']} by {e['by']}" for e in slice_["overlap"])
        return f"{slice_['chosen']}; reported on by shipped configs: {shared}"

    def _save_state(self, path: Path, wall: float, result: HalvingResult | None) -> None:
        data: dict[str, Any] = {"wall_seconds": wall, "updated": datetime.now(UTC).isoformat(timespec="seconds")}
        if result is not None:
            data["complete"] = result.complete
            data["rungs"] = [{"cases": n, "scores": {cid: s.to_dict() for cid, s in scores.items()}}
                             for n, scores in result.rungs]
        if self.reference:
            data["reference"] = {str(n): s.to_dict() for n, s in sorted(self.reference.items())}
        atomic_write_text(path, _sealed(data))

    def _write_yaml(self, chosen: Candidate, result: HalvingResult, slice_: dict, grids: dict[str, tuple],
                    layer_why: dict, wall: float, sizes: list[int]) -> Path:
        import editscope

        values = self.editor.hparams_class.from_dict({**self.base.to_dict(), **dict(chosen.hparams)},
                                                     "<tuned hparams>").to_dict()
        plugins = []
        for p in self.plugins:
            plugins.append({"name": p.name, **{k: v for k, v in p.to_dict().items() if k != "name"},
                            **dict(dict(chosen.plugins).get(p.name, ()))})
        scores: dict[str, list[dict[str, Any]]] = {}
        for _n, rung in result.rungs:
            for cid, s in rung.items():
                scores.setdefault(cid, []).append(s.to_dict())
        by_id = {c.id: c for c in candidates(grids)}
        provenance = {
            "tool": "editscope tune",
            "editscope_version": editscope.__version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "model": {"name": self.bundle.name, "fingerprint": self.bundle.fingerprint,
                      "n_layers": self.bundle.n_layers, "family": self.bundle.arch.family},
            "method": self.s.method,
            "base_hparams": self.s.hparams or "shipped (or derived) hparams of the model",
            "overrides": self.s.overrides,
            "plugins": plugins,
            "validation": {k: slice_[k] for k in ("dataset", "offset", "limit", "records", "chosen")} | {
                "reserved_by_shipped_configs": slice_["reserved"],
                "reported_on_by_shipped_configs": slice_["overlap"]},
            "objective": self.objective.to_dict(),
            "reference": self._reference_provenance(),
            "search": {"grids": {k: list(v) for k, v in grids.items()}, "rungs": sizes, "eta": self.s.eta,
                       "complete": result.complete, "seed": self.s.seed, "runtime": self.s.runtime,
                       "editing": (f"sequential: each rung's cases as one chain in batches of {self.s.sequential}"
                                   if self.s.sequential else "single edits")},
            "layers": layer_why or None,
            "chosen": {"id": chosen.id, "label": chosen.label(), **chosen.to_dict()},
            "candidates": [{"id": cid, "label": by_id[cid].label(), "scores": rows} for cid, rows in scores.items()],
            "wall_seconds": round(wall, 1),
        } | ({"unverified_files": unverified()} if unverified() else {})
        head = (f"# {self.editor.display(self.plugins)} on {self.bundle.name}, chosen by editscope tune "
                f"({chosen.label()}).\n# Where these values came from: the provenance block below (DESIGN rule 13).\n")
        text = head + yaml.safe_dump(nulled(values)[0], sort_keys=False, default_flow_style=None, width=120) + \
            yaml.safe_dump({"provenance": nulled(provenance)[0]}, sort_keys=False, width=120)
        return atomic_write_text(self.out / TUNED_YAML, text)

    def _reference_provenance(self) -> dict[str, Any]:
        """What the guard compared with: the unedited model (the rows' ``_pre`` values, in every candidate's
        scores as ``guard_ref``), or the editor-alone run with its scores per rung."""
        if self.objective.guard_reference != "editor_alone":
            return {"kind": "unedited", "what": f"the unedited model's {self.objective.guard}_pre on each candidate's "
                    "cases (guard_ref in each candidate's scores)"}
        return {"kind": "editor_alone", "run": f"{REFERENCE_DIR}/", "method": self.s.method,
                "overrides": self.s.overrides, "plugins": [],
                "scores": [{"cases": n, **s.to_dict()} for n, s in sorted(self.reference.items())]}


__all__ = ["TuneResult", "TuneSettings", "Tuner"]
