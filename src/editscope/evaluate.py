"""One call that edits and returns metrics, with EasyEdit's argument names.

    from editscope import edit_and_evaluate
    result = edit_and_evaluate("smollm2-135m", "rome",
                               prompts=["Danielle Darrieux is a citizen of"], subject=["Danielle Darrieux"],
                               target_new=["Japan"], ground_truth=["France"],
                               rephrase_prompts=["Danielle Darrieux holds a passport of"],
                               locality_inputs={"neighborhood": {"prompt": ["Paris is the capital of"],
                                                                 "ground_truth": ["France"]}})
    result.metrics[0]["paper"]["ES"], result.metrics[0]["easyedit"]["Edit_Succ"]

Each request is edited on the model as given and evaluated before and after its edit (EasyEdit's
``editor.edit(...)`` with ``keep_original_weight=True``); ``keep=True`` edits them one after another instead,
each evaluated right after its own edit, and leaves every edit applied (``result.patches`` reverts them).

Two protocols, named apart (DESIGN rule 10): ``paper`` — CounterFact's ES/PS/NS as paper 002 defines them
(probability comparisons of target_new against ground_truth; needs ``ground_truth``), from
:class:`~editscope.suites.counterfact.CounterFactSuite`; ``easyedit`` — EasyEdit/KnowEdit's teacher-forced token
accuracy (Edit_Succ, Rephrase, Portability, Locality as unchanged-argmax share), from
:class:`~editscope.suites.portability.PortabilitySuite`; ``wild`` (unless ``wild=False``) — evaluation in the wild
(Mirage, ACL 2025): the answers the model generates, judged whole (Efficacy, Generalization, Locality), from
:class:`~editscope.suites.wild.WildSuite`. A prompt may hold ``{}`` where the subject goes, or be a
plain prompt containing the subject (its first occurrence is the subject's place).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from editscope.data.records import Case, EditRequest
from editscope.edit import EditRuntime, EditSession, Patch, get_editor
from editscope.edit.hparams import HParams
from editscope.edit.plugins import PluginLike
from editscope.errors import EditscopeError
from editscope.lm.loading import Bundle
from editscope.progress import StatusLine, listening, report
from editscope.run.blocks import Block
from editscope.run.chain import ChainHost, GroupChain
from editscope.run.plan import Lifelong, Single
from editscope.run.trial import Edits, Method, Trial
from editscope.suites.counterfact import CounterFactSuite
from editscope.suites.portability import PortabilitySuite
from editscope.suites.wild import WildSuite


@dataclass
class EditResult:
    """What :func:`edit_and_evaluate` returns: per request its metrics (``{"paper": {...}, "easyedit": {...}}``,
    each ``{"ES": post, "ES_pre": pre, ...}``), the patches (applied only with ``keep=True``) and the session."""

    metrics: list[dict[str, Any]]
    patches: list[Patch]
    session: EditSession
    protocols: dict[str, dict[str, str]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        """The mean of every metric over the requests, per protocol (a metric a request lacks, or whose value is
        undefined (None), is left out)."""
        out: dict[str, dict[str, float]] = {}
        for proto in ("paper", "easyedit", "wild"):
            names = sorted({k for m in self.metrics for k in m.get(proto, {})})
            values = {k: [m[proto][k] for m in self.metrics if m.get(proto, {}).get(k) is not None] for k in names}
            out[proto] = {k: sum(v) / len(v) for k, v in values.items() if v}
        return out


def _cases(prompts: list[Any], target_new: list[Any], subject: list[Any], ground_truth: str | Sequence[str] | None,
           rephrase_prompts: str | Sequence[str | Sequence[str]] | None,
           locality_inputs: Mapping[str, Mapping[str, Any]] | None,
           portability_inputs: Mapping[str, Mapping[str, Any]] | None) -> list[Case]:
    """One case per prompt; every other per-request argument must give one entry per prompt."""
    n = len(prompts)
    columns = {"target_new": target_new, "subject": subject}
    if ground_truth is not None:
        columns["ground_truth"] = _listed(ground_truth)
    if rephrase_prompts is not None:
        columns["rephrase_prompts"] = _listed(rephrase_prompts)
    for name, values in columns.items():
        if len(values) != n:
            raise EditscopeError(f"{name}: {len(values)} entries for {n} prompts")
    truths = columns.get("ground_truth", [None] * n)
    rephrases = columns.get("rephrase_prompts", [None] * n)
    return [_case(i, prompts[i], subject[i], target_new[i], truths[i], rephrases[i], locality_inputs,
                  portability_inputs) for i in range(n)]


def _bundle(model: str | Bundle) -> Bundle:
    """``model`` itself when loaded, else loaded from the registry or a folder."""
    if isinstance(model, Bundle):
        return model
    from editscope.lm import load

    return load(model, progress=report)


def _suites(paper: bool, wild: bool, wild_tokens: int) -> dict[str, Any]:
    """The protocols measured: EasyEdit's always, the paper's with a ground truth, the wild one unless off."""
    suites: dict[str, Any] = {"easyedit": PortabilitySuite()}
    if paper:
        suites["paper"] = CounterFactSuite()
    if wild:
        suites["wild"] = WildSuite(max_new_tokens=wild_tokens)
    return suites


class _Requests:
    """How an editor's error names the step: by the request's index (the API's words)."""

    def step_name(self, r: int, case_ids: Sequence[str]) -> str:
        return f"request {case_ids[0]}"


@dataclass(frozen=True)
class Alone(_Requests, Single):
    """``keep=False``: each request edited on the model as given (``mode: single``)."""


@dataclass(frozen=True)
class EachProbed(_Requests, Lifelong):
    """``keep=True``: the requests edited one after another, each on the model the earlier ones left and probed right
    after its own edit -- a lifelong chain of batch 1 whose checkpoint after every round probes only the case just
    written (``reprobe`` 0); its patches stay applied (``result.patches`` revert them) and no file is saved."""

    checkpoints: int | tuple[int, ...] = 1
    reprobe: int = 0
    sampled: bool = True
    chained = False
    resumable = False


def _each_request(trial: Trial, block: Block, engine: Any, bundle: Bundle, keep: bool
                  ) -> Iterator[tuple[Patch, Any]]:
    """Per request, its patch and its probes after its own edit, from the edit loop of every run mode
    (:class:`~editscope.run.chain.GroupChain`): ``keep`` one chain over all requests (:class:`EachProbed`), else
    each request a group of its own (``mode: single``), its edit undone once probed."""
    assert trial.method is not None
    editor, n = trial.method.editor, len(block.cases)
    host = ChainHost(Path("."), "")  # never written: neither mode is resumable, so no chain file is made
    report(f"request 1/{n}: editing")
    if keep:
        mode, members, log = EachProbed(rounds=n), list(range(n)), Edits(bundle)
        chain = GroupChain(trial, mode, block, 0, members, engine, log,
                           set(mode.units(members, lambda i: len(block.requests[i]), trial.reprobe_seed(0))), host)
        for r, _applied, _positions, probes in chain.rounds(editor.new_state):
            yield log.loose[r - 1], probes.of(0)
            report(f"request {r + 1}/{n}: editing")
        yield log.loose[-1], trial.probe(engine, [block.cases[-1]]).of(0)
        return
    for i, case in enumerate(block.cases):
        with trial.edits(bundle) as log:
            for _ in GroupChain(trial, Alone(), block, i, [i], engine, log, set(), host).rounds(editor.new_state):
                pass  # a single edit has no checkpoint
            post = trial.probe(engine, [case]).of(0)
        yield log.loose[0], post
        if i + 1 < n:
            report(f"request {i + 2}/{n}: editing")


def edit_and_evaluate(model: str | Bundle, method: str, *, prompts: str | Sequence[str],
                      target_new: str | Sequence[str], subject: str | Sequence[str],
                      ground_truth: str | Sequence[str] | None = None,
                      rephrase_prompts: str | Sequence[str | Sequence[str]] | None = None,
                      locality_inputs: Mapping[str, Mapping[str, Any]] | None = None,
                      portability_inputs: Mapping[str, Mapping[str, Any]] | None = None,
                      hparams: HParams | None = None, plugins: Sequence[PluginLike] = (),
                      runtime: EditRuntime | None = None, keep: bool = False, progress: bool = True,
                      wild: bool = True, wild_tokens: int = 50) -> EditResult:
    """Edit ``model`` (a registry name, a local HF folder or a loaded bundle) with ``method`` and measure every
    request before and after; see the module docstring. ``locality_inputs`` / ``portability_inputs`` are
    EasyEdit's ``{type: {"prompt": [...], "ground_truth": [...]}}``, one entry (a string or a list) per request.
    ``progress``: a status line on stderr (model load, each request's edit and its steps), at most one a second.
    ``wild``: also measure in the wild (the ``wild`` block: greedy answers of at most ``wild_tokens`` tokens judged
    whole, :mod:`editscope.suites.wild`), each request's answers before and after in ``row["wild_answers"]``."""
    prompts, target_new, subject = _listed(prompts), _listed(target_new), _listed(subject)
    cases = _cases(prompts, target_new, subject, ground_truth, rephrase_prompts, locality_inputs, portability_inputs)

    status = StatusLine("edit_and_evaluate: ") if progress else None
    with listening(status):
        bundle = _bundle(model)
        editor = get_editor(method)
        hp = hparams if hparams is not None else editor.load_hparams(bundle)
        session = EditSession(bundle, runtime=runtime)
        suites = _suites(ground_truth is not None, wild, wild_tokens)
        trial = Trial("edit_and_evaluate", suites, Method(method, editor, hp, tuple(plugins)), session.runtime)
        engine = session.engine
        pre = trial.probe(engine, cases, "pre")
        block = Block("edit_and_evaluate", cases, suites, [case.requests for case in cases])
        patches, metrics = [], []
        for i, (patch, post) in enumerate(_each_request(trial, block, engine, bundle, keep)):
            case = cases[i]
            patches.append(patch)
            metrics.append(_row(case, patch, trial.metrics(case, pre.of(i), post), pre.of(i), post, wild))
        if status is not None:
            status.close()
        return EditResult(metrics, patches, session, trial.protocol())


def _row(case: Case, patch: Patch, metrics: Mapping[str, Mapping[str, float | None]], pre: Mapping[str, Any],
         post: Mapping[str, Any], wild: bool) -> dict[str, Any]:
    """What a request's result holds: the request, the edit's seconds, each protocol's metrics (``X`` after the
    edit, ``X_pre`` before) and, measured in the wild, the answers before and after."""
    request = case.request
    row: dict[str, Any] = {"request": {"prompt": request.prompt, "subject": request.subject,
                                       "target_new": request.target_new, "ground_truth": request.target_true},
                           "edit_seconds": patch.info.get("seconds")}
    row |= {proto: _renamed(values) for proto, values in metrics.items()}
    if wild:
        row["wild_answers"] = [{"prompt": a["prompt"], "role": a["role"], "pre": a["answer"], "post": b["answer"]}
                               for a, b in zip(pre["wild"]["prompts"], post["wild"]["prompts"], strict=True)]
    return row


def _listed(value: Any) -> list:
    return [value] if isinstance(value, str) else list(value)


def _template(i: int, prompt: str, subject: str) -> str:
    """The prompt as a template with ``{}`` where the subject goes."""
    if "{}" in prompt:
        return prompt
    at = prompt.find(subject)
    if not subject or at < 0:
        raise EditscopeError(f"prompts[{i}]: the subject {subject!r} does not occur in {prompt!r} (give the prompt "
                             "with {} where the subject goes, or a prompt that contains the subject)")
    return prompt[:at] + "{}" + prompt[at + len(subject):]


def _pairs(i: int, inputs: Mapping[str, Mapping[str, Any]] | None, what: str) -> dict[str, list[list[str]]]:
    """EasyEdit's ``{type: {"prompt": [...], "ground_truth": [...]}}`` -> request i's ``{type: [[prompt, answer]]}``."""
    out: dict[str, list[list[str]]] = {}
    for kind, block in (inputs or {}).items():
        if not isinstance(block, Mapping) or "prompt" not in block or "ground_truth" not in block:
            raise EditscopeError(f"{what}[{kind!r}]: expected {{'prompt': [...], 'ground_truth': [...]}}")
        prompts, answers = _listed(block["prompt"]), _listed(block["ground_truth"])
        if i >= len(prompts) or i >= len(answers):
            raise EditscopeError(f"{what}[{kind!r}]: no entry {i} (one prompt and ground_truth per request)")
        ps, as_ = _listed(prompts[i]), _listed(answers[i])
        if len(as_) == 1 and len(ps) > 1:
            as_ = as_ * len(ps)
        if len(ps) != len(as_):
            raise EditscopeError(f"{what}[{kind!r}][{i}]: {len(ps)} prompts but {len(as_)} ground truths")
        out[kind] = [[p, a[0] if isinstance(a, list | tuple) else a] for p, a in zip(ps, as_, strict=True)]
    return out


def _case(i: int, prompt: str, subject: str, target_new: str, truth: str | None, rephrase: Any,
          locality: Mapping[str, Mapping[str, Any]] | None, portability: Mapping[str, Mapping[str, Any]] | None
          ) -> Case:
    try:
        request = EditRequest(_template(i, prompt, subject), subject, target_new, truth)
    except ValueError as exc:
        raise EditscopeError(f"request {i}: {exc}") from None
    local = _pairs(i, locality, "locality_inputs")
    return Case(case_id=str(i), source="edit_and_evaluate", requests=(request,),
                # a rephrase may be a template too: its {} is the subject
                paraphrase_prompts=[] if rephrase is None else [r.replace("{}", subject) for r in _listed(rephrase)],
                neighborhood=[(p, a) for items in local.values() for p, a in items],
                extra={"locality": local, "portability": _pairs(i, portability, "portability_inputs")})


def _renamed(row: Mapping[str, float | None]) -> dict[str, float | None]:
    """``X_post`` -> ``X`` (the value after the edit), ``X_pre`` kept; post-only metrics as they are."""
    return {k.removesuffix("_post"): v for k, v in row.items()}
