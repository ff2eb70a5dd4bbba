"""What can be wrong with an lm-eval task, said in one line naming the file, the record and the field.

lm-evaluation-harness reports a broken task late and loosely: a task YAML it cannot read is skipped while it indexes
``include_path`` (the task is then "unknown"), a broken Jinja template, an empty data file, a document without
choices, a NaN answer or more few-shot examples than documents raise deep inside ``simple_evaluate``, and an answer
index past the last choice is not an error at all (the document just scores as wrong). :func:`broken_task_files`
finds the YAMLs lm-eval would skip; :func:`check_task` reads a task's YAML, its data files and the documents it
evaluates (``limit``), and raises :class:`TaskProblem` for the first problem: ``FILE: field 'doc_to_text': broken
Jinja template (...)``, ``DATA.jsonl:record 3: field 'doc_to_target': answer 7 is not a choice index (2 choices)``.
:func:`describe_failure` turns any exception lm-eval raised into one line, with the problem :func:`check_task` finds
when it finds one.

lm_eval (and jinja2, which it brings) are imported inside the functions: importing this module imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TEMPLATE_MARKS = ("{{", "{%")


class TaskProblem(ValueError):
    """A task whose YAML, data or documents lm-eval cannot evaluate (the message is one line)."""


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (lm-eval's messages span lines; ours never do)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def broken_task_files(include_path: str | Path) -> list[tuple[Path, str]]:
    """The task YAMLs under ``include_path`` that lm-eval's task index skips (a YAML syntax error, an include that
    cannot be read, neither ``task`` nor ``group`` nor ``class``), each with the reason in one line."""
    out = []
    for path in sorted(Path(include_path).glob("**/*.yaml")):
        try:
            _load_yaml(path)
        except Exception as exc:  # noqa: BLE001 -- whatever makes lm-eval skip the file is the reason to show
            out.append((path, one_line(exc)))
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    """A task YAML as lm-eval's index reads it (includes resolved, ``!function`` tags not imported)."""
    try:
        from lm_eval.tasks._index import TaskIndex
        from lm_eval.tasks._yaml_loader import load_yaml
    except ImportError:  # another lm-eval layout: read it as plain YAML, tags kept as text
        return _plain_yaml(path)
    cfg = load_yaml(path, resolve_func=False, recursive=True)
    TaskIndex._kind_of(cfg)  # noqa: SLF001 -- the check lm-eval's index makes before it keeps a file
    return cfg


def _plain_yaml(path: Path) -> dict[str, Any]:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, _suffix, node: loader.construct_scalar(node))
    cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 -- a SafeLoader subclass
    if not isinstance(cfg, dict) or not ({"task", "group", "class"} & set(cfg)):
        raise ValueError(f"not a task or group config (keys: {list(cfg) if isinstance(cfg, dict) else cfg!r})")
    return cfg


def names_in(path: Path) -> str:
    """The ``task:`` name written in a (possibly unreadable) YAML file, found as text; '' when none."""
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "task" and value.strip():
            return value.strip().strip("'\"")
    return ""


def task_file(manager: Any, task: str) -> tuple[Path | None, dict[str, Any]]:
    """The YAML that defines ``task`` in lm-eval's index and its config (None, {} for a task lm-eval builds in
    Python or a name it does not index)."""
    try:
        entry = manager.task_index.get(task)
    except AttributeError:  # an lm-eval without the index
        return None, {}
    if entry is None or entry.yaml_path is None:
        return None, {}
    path = Path(entry.yaml_path)
    try:
        return path, _load_yaml(path)
    except Exception:  # noqa: BLE001 -- unreadable now: the caller reports lm-eval's own error
        return path, dict(entry.cfg or {})


def _templates(cfg: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for key, value in cfg.items():
        if isinstance(value, str) and any(m in value for m in TEMPLATE_MARKS):
            yield f"{prefix}{key}", value
        elif isinstance(value, dict):
            yield from _templates(value, f"{prefix}{key}.")


def _data_files(cfg: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, str | list):
        files = {"": files}
    for split, value in (files or {}).items() if isinstance(files, dict) else ():
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, str) and "://" not in item:
                key = "dataset_kwargs.data_files" + (f".{split}" if split else "") + (
                    f"[{i}]" if isinstance(value, list) else "")
                yield key, Path(item)


def check_config(path: Path, cfg: dict[str, Any]) -> None:
    """The YAML's own problems: a Jinja template that does not compile, a local data file without documents."""
    import jinja2

    env = jinja2.Environment()  # noqa: S701 -- compiled to check the syntax, never rendered to HTML
    for key, template in _templates(cfg):
        try:
            env.parse(template)
        except jinja2.TemplateSyntaxError as exc:
            raise TaskProblem(f"{path}: field {key!r}: broken Jinja template ({exc.message})") from None
    for key, file in _data_files(cfg):
        if file.is_file() and not file.read_bytes().strip():
            raise TaskProblem(f"{path}: field {key!r}: the data file {file} holds no documents")


def check_task(manager: Any, task: str, *, limit: int | None = None, num_fewshot: int | None = None) -> None:
    """Raise :class:`TaskProblem` for the first problem of ``task`` (a task, or each task of a group or tag):
    its YAML (:func:`check_config`), then, once loaded, the documents it would evaluate (the first ``limit``): a
    multiple-choice document without choices or whose answer is not the index of one of them, and more few-shot
    examples than the documents they are drawn from."""
    path, cfg = task_file(manager, task)
    if path is not None:
        check_config(path, cfg)
    try:
        loaded = manager.load([task])["tasks"]
    except Exception as exc:  # noqa: BLE001 -- lm-eval cannot build it: its reason, in one line
        raise TaskProblem(f"{path or task}: the task does not load: {one_line(exc)}") from None
    for name, obj in loaded.items():
        if name != task:
            sub_path, sub_cfg = task_file(manager, name)
            if sub_path is not None:
                check_config(sub_path, sub_cfg)
        _check_docs(obj, task_file(manager, name)[0] or Path(name), limit, num_fewshot)


def _check_docs(task: Any, path: Path, limit: int | None, num_fewshot: int | None) -> None:
    docs = list(task.eval_docs)
    config = task.config
    files = [f for _key, f in _data_files({"dataset_kwargs": config.dataset_kwargs or {}})]
    where = str(files[0]) if len(files) == 1 else str(path)  # records are numbered as lm-eval's doc_id
    if not docs:
        raise TaskProblem(f"{where}: the task's evaluation split has no documents")
    if task.OUTPUT_TYPE == "multiple_choice":
        for i, doc in enumerate(docs[:limit]):
            choices = task.doc_to_choice(doc)
            if not choices:
                raise TaskProblem(f"{where}:record {i}: field 'doc_to_choice': no choices")
            target = task.doc_to_target(doc)
            for value in target if isinstance(target, list) else [target]:
                if isinstance(value, str) and value in choices:
                    continue
                ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                      and float(value).is_integer() and 0 <= int(value) < len(choices))
                if not ok:
                    raise TaskProblem(f"{where}:record {i}: field 'doc_to_target': answer {value!r} is not the "
                                      f"index of one of the {len(choices)} choices")
    n = config.num_fewshot if num_fewshot is None else num_fewshot
    if n:
        pool = list(task.fewshot_docs() or docs)  # lm-eval's rule: its few-shot split, training, validation or test
        same = pool[0] in docs if pool else False  # drawn from the evaluated split: the document itself is left out
        if n + same > len(pool):
            raise TaskProblem(f"{path}: field 'num_fewshot': {n} few-shot example(s), but the split they are drawn "
                              f"from holds {len(pool)} document(s)" + (", one of them the evaluated one" if same
                                                                      else ""))


def describe_failure(exc: BaseException, manager: Any, task: str, *, limit: int | None = None,
                     num_fewshot: int | None = None) -> str:
    """One line for an exception lm-eval raised evaluating ``task``: the problem :func:`check_task` finds (file,
    record, field) when it finds one, else the task's YAML and the exception's first line."""
    if isinstance(exc, TaskProblem):
        return str(exc)
    try:
        check_task(manager, task, limit=limit, num_fewshot=num_fewshot)
    except TaskProblem as problem:
        return str(problem)
    except Exception:  # noqa: BLE001,S110 -- the diagnosis is a courtesy; lm-eval's own error follows
        pass
    path, _cfg = task_file(manager, task)
    return f"{path or task}: {one_line(exc)}"


__all__ = ["TaskProblem", "broken_task_files", "check_config", "check_task", "describe_failure", "names_in",
           "one_line", "task_file"]
