"""``editscope edit``: apply one edit, print log-probs before and after, optionally save the patch."""

from __future__ import annotations

import argparse
import json
import sys
import time

from editscope.commands._device import add_device_arguments
from editscope.commands._runtime import add_runtime_arguments, runtime_settings
from editscope.progress import StatusLine, listening

HELP = "edit one fact and show log-probs before/after"


def register(sub: argparse._SubParsersAction) -> None:
    from editscope.edit.registry import EDITORS

    parser = sub.add_parser(
        "edit",
        help=HELP,
        description="Edit one fact with an editing method and print the log-probability (natural log, summed "
        "over the answer's tokens) of the new target and of the true target on the edit prompt and each "
        "--check prompt, before and after the edit. The model is not kept edited: save the patch with "
        "--save-patch and use `editscope patch apply` to write an edited model folder.",
    )
    parser.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    parser.add_argument("--method", default="rome", choices=sorted(EDITORS), help="editing method")
    parser.add_argument("--prompt", required=True, help="template with {} for the subject, e.g. '{} is a citizen of'")
    parser.add_argument("--subject", required=True)
    parser.add_argument("--target", required=True, help="the new answer")
    parser.add_argument("--target-true", default=None, help="the current (true) answer, for comparison")
    parser.add_argument("--check", nargs="*", default=[], metavar="PROMPT",
                        help="more prompts to score (a {} is filled with the subject)")
    parser.add_argument("--hparams", default=None, help="hparams YAML (default configs/hparams/METHOD/MODEL.yaml)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE", help="override hparams")
    parser.add_argument("--plugin", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
                        help="attach a loss-term plug-in with its hparams (repeatable; optimising methods only)")
    parser.add_argument("--plugin-module", action="append", default=[], metavar="MODULE",
                        help="import a Python module that registers plug-ins (editscope.edit.plugins.register_plugin)")
    parser.add_argument("--correct", nargs="+", default=[], metavar="ANSWER",
                        help="other correct answers of the question the edit should keep (read by plug-ins such as "
                        "APP; their log-probs are shown before/after)")
    parser.add_argument("--hard-false", nargs="+", default=[], metavar="ANSWER",
                        help="hard false answers the edit should not raise (read by plug-ins such as APP; shown "
                        "before/after)")
    parser.add_argument("--save-patch", default=None, metavar="FILE", help="write the patch (safetensors)")
    parser.add_argument("--generate", type=int, default=0, metavar="N",
                        help="also print N greedy tokens after the edit prompt (and each --check prompt) before and "
                        "after the edit")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--chat-template", action="store_true",
                        help="show every prompt (the edit prompt, with ROME/MEMIT's context prefixes inside the turn, "
                        "and each --check prompt) as a user turn of the tokenizer's chat template; answers start the "
                        "assistant's turn (instruct models)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress lines on stderr (model load, statistics, the editor's steps)")
    add_device_arguments(parser)
    add_runtime_arguments(parser)
    parser.set_defaults(func=run)


def _scores(engine, prompt: str, target: str, target_true: str | None) -> dict:
    pairs = [(prompt, target)] + ([(prompt, target_true)] if target_true else [])
    scores = engine.score(pairs)
    out = {"target": scores[0].sum}
    if target_true:
        out["target_true"] = scores[1].sum
    return out


def _strict_json(result: dict, where: str = "edit --json") -> str:
    """``result`` as strict JSON; a NaN or infinite number is an error naming where it is (never printed)."""
    from editscope.errors import EditscopeError
    from editscope.finite import non_finite

    found = [f"{path}={value}" for path, value in non_finite(result)]
    if found:
        raise EditscopeError(f"{where}: non-finite result ({', '.join(found[:4])}); the edit or the model "
                             "broke the scores, so nothing is printed and no patch is written")
    return json.dumps(result, indent=1, allow_nan=False)


def run(args: argparse.Namespace) -> int:
    from editscope.data.records import EditRequest
    from editscope.edit import get_editor
    from editscope.edit.plugins import import_plugin_modules, parse_plugin_arg
    from editscope.errors import EditscopeError

    editor = get_editor(args.method)
    if args.save_patch:  # a path that cannot take the patch (a device, a folder) fails before the edit runs
        from editscope.atomic import write_target

        write_target(args.save_patch)
    import_plugin_modules(args.plugin_module)
    plugins = editor.attach([parse_plugin_arg(text) for text in args.plugin], "--plugin")
    try:
        request = EditRequest(args.prompt, args.subject, args.target, args.target_true,
                              correct_answers=tuple(args.correct), hard_false=tuple(args.hard_false))
    except ValueError as exc:
        raise EditscopeError(str(exc)) from exc
    status = None if args.no_progress else StatusLine("edit: ")
    with listening(status):
        return _edit(args, editor, plugins, request, status)


def _measure(engine, prompts: list[str], args: argparse.Namespace, request, answers: list[tuple[str, str]]):
    """What is shown before and after the edit: the targets' scores on each prompt, the answers' scores on the
    edit prompt and (``--generate N``) N greedy tokens after each prompt."""
    from editscope.errors import EditscopeError

    scores = [_scores(engine, p, args.target, args.target_true) for p in prompts]
    answer_scores = engine.score([(request.text, a) for a, _ in answers])
    if args.generate < 0:
        raise EditscopeError(f"--generate must be >= 0, got {args.generate}")
    texts = engine.generate(prompts, max_new_tokens=args.generate) if args.generate else []
    return scores, answer_scores, texts


LOGPROB_UNIT = "log-probability of the answer after the prompt: natural log, summed over the answer's tokens"


def _result(args: argparse.Namespace, label: str, runtime, plugins, bundle, engine, request, prompts: list[str],
            answers: list[tuple[str, str]], pre, post, seconds: float) -> dict:
    """The edit's JSON object; ``pre`` and ``post`` are :func:`_measure`'s results."""
    (pre_scores, pre_answers, pre_text), (post_scores, post_answers, post_text) = pre, post
    result = {
        "method": args.method,
        "label": label,
        "runtime": runtime.settings.recorded(),
        "plugins": [p.to_dict() for p in plugins],
        "model": bundle.name,
        "prompt": request.text,
        "pre": pre_scores[0],
        "post": post_scores[0],
        "checks": [{"prompt": p, "pre": a, "post": b}
                   for p, a, b in zip(prompts[1:], pre_scores[1:], post_scores[1:], strict=True)],
        "answers": [{"text": a, "kind": kind, "n_tokens": x.n_tokens, "pre": x.sum, "post": y.sum}
                    for (a, kind), x, y in zip(answers, pre_answers, post_answers, strict=True)],
        "seconds": seconds,
        "patch": args.save_patch,
        "units": {"pre": LOGPROB_UNIT, "post": LOGPROB_UNIT, "answers": LOGPROB_UNIT, "checks": LOGPROB_UNIT,
                  "seconds": "wall-clock seconds of the edit (with the layer statistics the first time they are "
                             "computed)"},
    }
    if engine.prompt_format:  # prompts were wrapped in the chat template
        result["prompt_format"] = engine.prompt_format
    if args.generate:  # greedy continuations, before and after
        result["generation"] = [{"prompt": p, "pre": a, "post": b}
                                for p, a, b in zip(prompts, pre_text, post_text, strict=True)]
    return result


def _print_table(args: argparse.Namespace, result: dict, prompts: list[str], pre_scores: list[dict],
                 post_scores: list[dict]) -> None:
    """The result as a table of log-probs before and after, then the generations."""
    print(f"{result['label']} on {result['model']}: {result['prompt']!r} -> {args.target!r} "
          f"({result['seconds']:.1f} s)")
    print(f"{'prompt':<50}  {'answer':<16}  {'pre':>9}  {'post':>9}   (log P, natural log, summed over the answer)")
    for prompt, a, b in zip(prompts, pre_scores, post_scores, strict=True):
        for key, answer in (("target", args.target), ("target_true", args.target_true)):
            if key in a:
                print(f"{prompt[:50]:<50}  {answer[:16]:<16}  {a[key]:>9.3f}  {b[key]:>9.3f}")
    for row in result["answers"]:
        label = f"{row['text']} ({row['kind']})"
        print(f"{result['prompt'][:50]:<50}  {label[:16]:<16}  {row['pre']:>9.3f}  {row['post']:>9.3f}")
    for row in result.get("generation", []):
        print(f"\n{row['prompt']}\n  before: {row['pre']!r}\n  after:  {row['post']!r}")
    if args.save_patch:
        print(f"patch saved to {args.save_patch}")


def _edit(args: argparse.Namespace, editor, plugins, request, status: StatusLine | None) -> int:
    from editscope.edit import parse_overrides
    from editscope.edit.hparams import noting_derived
    from editscope.edit.quick_check import QuickCheck
    from editscope.edit.runtime import EditRuntime
    from editscope.lm import load
    from editscope.lm.engine import ScoringEngine
    from editscope.run.trial import Method, Trial

    def say(message: str) -> None:
        if status is not None:
            status.close()
            print(f"edit: {message}", file=sys.stderr, flush=True)

    say(f"loading {args.model}")
    bundle = load(args.model, device=args.device, dtype=args.dtype, progress=say)
    editor.check_model(bundle)
    hp, derived = noting_derived(lambda: editor.load_hparams(bundle, args.hparams, parse_overrides(args.set)))
    check = QuickCheck() if derived else None
    engine = ScoringEngine(bundle, chat_template=args.chat_template)
    runtime = EditRuntime.from_settings(runtime_settings(args), where="--forward/--vstar-batch")
    prompts = [request.text] + [p.replace("{}", args.subject) for p in args.check]
    say(f"scoring {len(prompts)} prompt(s) before the edit")
    answers = [(a, "correct") for a in args.correct] + [(a, "hard_false") for a in args.hard_false]
    pre = _measure(engine, prompts, args, request, answers)
    if check is not None:
        say("derived hparams: checking known facts and neutral generations before the edit")
        check.before(engine)
    say(f"editing with {editor.display(plugins)}")
    trial = Trial("cli", {}, Method(args.method, editor, hp, tuple(plugins)), runtime)
    t0 = time.perf_counter()
    with trial.edited(bundle, [request], engine=engine) as patch:  # undone (and checked) at the end of the block
        seconds = time.perf_counter() - t0
        say(f"edited in {seconds:.1f} s; scoring after the edit")
        post = _measure(engine, prompts, args, request, answers)
        if check is not None:
            check.after(engine)
    result = _result(args, editor.display(plugins), runtime, plugins, bundle, engine, request, prompts, answers,
                     pre, post, seconds)
    if check is not None:
        result["quick_check"] = check.to_dict()
        print(f"edit: {check.line(args.method, args.model)}", file=sys.stderr, flush=True)
    if status is not None:
        status.close()
    # fails (before saving anything) on NaN/inf, also when the result is printed as a table
    text = _strict_json(result, "edit --json" if args.json else "edit")
    if args.save_patch:
        patch.save(args.save_patch)
    if args.json:
        print(text)
    else:
        _print_table(args, result, prompts, pre[0], post[0])
    return 0
