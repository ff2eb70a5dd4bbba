"""Reading published JSON datasets and checking their records; shared by every loader.

Every problem is a :class:`~editscope.errors.DataError` whose message reads
``file:record N: field X: what is wrong``. ``N`` is the 0-based index of the record in the file's top-level
list (0-based line number for JSON Lines). ``X`` is the field as published, with a path for nested values:
``requested_rewrite.target_new.str``, ``answers[2]``, ``neighborhood_prompts[3][1]``.

The problem texts are fixed, so scripts and tests can match them:

===================================  ================================================================
case                                 problem text
===================================  ================================================================
field absent                         ``missing`` (``missing (also accepted: 'x')`` for spelling variants)
string expected                      ``expected a non-empty string, got <type>`` (``got an empty
                                     string`` / ``got a blank string`` for ``""`` / whitespace only)
list expected                        ``expected a list of <items>, got <type>``; ``expected a non-empty
                                     list, got an empty list`` where at least one element is required
pair expected                        ``expected a [prompt, answer] pair, got list of 3``
object expected                      ``expected an object, got <type>``
unencodable text                     ``contains a lone surrogate U+D800 at character 12 (not valid text)``,
                                     ``contains the control character U+0000 at character 3``
template                             ``expected a template with exactly one '{}', got '...'``
subject not in sentence              ``the subject 'X' does not occur in '...'``
case id                              ``expected an int or a non-empty string, got <type>``;
                                     ``duplicate case id '7' (first at record 2)``
file is not JSON                     ``invalid JSON: <reason>: line L column C (char P)`` (no record);
                                     ``invalid JSON: nested too deeply`` / ``invalid JSON: <int limit>``
top level is not a list              ``expected a list of records at the top level, got <type>``
===================================  ================================================================

``<type>`` is the JSON name of the value's type: string, int, float, bool, null, list, object.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from editscope.data.records import Case, EditRequest
from editscope.errors import DataError, EditscopeError

log = logging.getLogger(__name__)

_TYPE_NAMES: dict[type, str] = {
    str: "string",
    int: "int",
    float: "float",
    bool: "bool",
    type(None): "null",
    list: "list",
    dict: "object",
}


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type (``string``, ``int``, ``list``, ``object``, ...)."""
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def read_json_text(path: Path) -> str:
    """The text of ``path`` (UTF-8); a missing file is an EditscopeError, bad encoding a DataError."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EditscopeError(f"dataset file not found: {path}") from None
    except IsADirectoryError:
        raise EditscopeError(f"dataset path is a directory, not a file: {path}") from None
    except UnicodeDecodeError as err:
        raise DataError(str(path), None, None, f"not UTF-8 text (byte {err.start})") from None


def json_error(err: json.JSONDecodeError) -> str:
    """The problem text for a JSON syntax error, with its position."""
    return f"invalid JSON: {err}"  # e.g. "Expecting ',' delimiter: line 3 column 5 (char 120)"


def read_json_list(path: Path) -> list[Any]:
    """The top-level list of a JSON file, parsed with :mod:`json` only.

    Raises DataError (record None) for invalid or truncated JSON (with the error position), for a top level
    that is not a list, and for an empty list.
    """
    file = str(path)
    try:
        data = json.loads(read_json_text(path))
    except json.JSONDecodeError as err:
        raise DataError(file, None, None, json_error(err)) from None
    except RecursionError:
        raise DataError(file, None, None, "invalid JSON: nested too deeply") from None
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        raise DataError(file, None, None, f"invalid JSON: {err}") from None
    if not isinstance(data, list):
        raise DataError(file, None, None, f"expected a list of records at the top level, got {type_name(data)}")
    if not data:
        raise DataError(file, None, None, "the file holds no records (an empty list)")
    return data


def string_problem(value: Any) -> str | None:
    """Why ``value`` is not a non-empty string, or None when it is one."""
    if not isinstance(value, str):
        return f"expected a non-empty string, got {type_name(value)}"
    if not value:
        return "expected a non-empty string, got an empty string"
    if not value.strip():
        return "expected a non-empty string, got a blank string"
    return text_problem(value)


#: A lone surrogate, or a C0 control character a tokenizer may drop or reject (tab, newline and carriage return are
#: ordinary text): one compiled search per string, as every field of every record is checked on load
_NOT_TEXT = re.compile("[\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be tokenized as text (a lone surrogate from a bad ``\\ud83d`` escape, which no
    tokenizer can encode, or a C0 control character), or None."""
    found = _NOT_TEXT.search(value)
    if found is None:
        return None
    i, ch = found.start(), found.group()
    if "\ud800" <= ch <= "\udfff":
        return f"contains a lone surrogate U+{ord(ch):04X} at character {i} (not valid text)"
    return f"contains the control character U+{ord(ch):04X} at character {i}"


class Fields:
    """The fields of one record (or of an object nested in it) with checks that name file, record, field.

    Getters return the value when it has the expected shape and raise DataError otherwise. ``answer``
    getters strip surrounding whitespace (the scoring engine adds the boundary space itself); prompts and
    subjects are returned exactly as published.
    """

    def __init__(self, value: Any, file: str, record: int, prefix: str = "") -> None:
        if not isinstance(value, dict):
            raise DataError(file, record, prefix or None, f"expected an object, got {type_name(value)}")
        self.data: dict[str, Any] = value
        self.file = file
        self.record = record
        self.prefix = prefix

    # -- plumbing ---------------------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """The published name of ``key`` inside this object, e.g. ``requested_rewrite.subject``."""
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, field: str | None, problem: str) -> DataError:
        """A DataError at ``field`` (a full path, see :meth:`path`) of this record."""
        return DataError(self.file, self.record, field, problem)

    def has(self, key: str) -> bool:
        """Whether the object holds ``key``."""
        return key in self.data

    def raw(self, key: str) -> Any:
        """The value of a required field, unchecked."""
        if key not in self.data:
            raise self.error(self.path(key), "missing")
        return self.data[key]

    def pick(self, *names: str) -> str:
        """Which of several accepted spellings of one field the object uses (first = as published).

        Exactly one must be present: none is ``missing``, two are a conflict.
        """
        present = [n for n in names if n in self.data]
        if not present:
            also = ", ".join(repr(n) for n in names[1:])
            raise self.error(self.path(names[0]), f"missing (also accepted: {also})" if also else "missing")
        if len(present) > 1:
            given = " and ".join(repr(n) for n in present)
            raise self.error(self.path(present[0]), f"both {given} are given; keep one")
        return present[0]

    # -- scalars ----------------------------------------------------------------------------------------
    def string(self, key: str) -> str:
        """A required non-empty string, as published."""
        value = self.raw(key)
        problem = string_problem(value)
        if problem:
            raise self.error(self.path(key), problem)
        return value

    def answer(self, key: str) -> str:
        """A required non-empty answer string, surrounding whitespace stripped."""
        return self.string(key).strip()

    def optional_string(self, key: str) -> str | None:
        """A non-empty string if the field is present (and not null), else None."""
        if self.data.get(key) is None:
            return None
        return self.string(key)

    def template(self, key: str) -> str:
        """A required prompt template holding exactly one ``{}``."""
        value = self.string(key)
        if value.count("{}") != 1:
            raise self.error(self.path(key), f"expected a template with exactly one '{{}}', got {value!r}")
        return value

    def template_from_sentence(self, key: str, subject: str) -> str:
        """The template made from sentence field ``key`` by putting ``{}`` where ``subject`` occurs.

        The first occurrence is replaced (exact, case-sensitive match); a sentence without the subject is
        an error, as is one that already holds ``{}``.
        """
        sentence = self.string(key)
        start = sentence.find(subject)
        if start < 0:
            raise self.error(self.path(key), f"the subject {subject!r} does not occur in {sentence!r}")
        if "{}" in sentence:
            raise self.error(self.path(key), f"already holds '{{}}', cannot make a template of {sentence!r}")
        return sentence[:start] + "{}" + sentence[start + len(subject) :]

    def case_id(self, key: str = "case_id", *, default_to_index: bool = False) -> str:
        """A case id: an int or a non-empty string, returned as a string. Required, unless ``default_to_index``:
        then a record without the key is numbered by its position in the file (a user's own file)."""
        if default_to_index and not self.has(key):
            return str(self.record)
        value = self.raw(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and value.strip():
            return value
        raise self.error(self.path(key), f"expected an int or a non-empty string, got {type_name(value)}")

    # -- containers -------------------------------------------------------------------------------------
    def _list(self, key: str, what: str, nonempty: bool) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.error(self.path(key), f"expected a list of {what}, got {type_name(value)}")
        if nonempty and not value:
            raise self.error(self.path(key), "expected a non-empty list, got an empty list")
        return value

    def strings(self, key: str, *, nonempty: bool = True) -> list[str]:
        """A required list of non-empty strings, as published (non-empty list unless ``nonempty=False``)."""
        values = self._list(key, "strings", nonempty)
        for i, value in enumerate(values):
            problem = string_problem(value)
            if problem:
                raise self.error(f"{self.path(key)}[{i}]", problem)
        return list(values)

    def answers(self, key: str, *, nonempty: bool = True) -> list[str]:
        """Like :meth:`strings`, with each answer's surrounding whitespace stripped."""
        return [s.strip() for s in self.strings(key, nonempty=nonempty)]

    def optional_strings(self, key: str) -> list[str]:
        """A list of non-empty strings if the field is present (may be empty), else ``[]``."""
        if self.data.get(key) is None:
            return []
        return self.strings(key, nonempty=False)

    def pairs(self, key: str, *, nonempty: bool = True) -> list[tuple[str, str]]:
        """A list of ``[prompt, answer]`` pairs; the answer is stripped, the prompt kept as published."""
        values = self._list(key, "[prompt, answer] pairs", nonempty)
        out: list[tuple[str, str]] = []
        for i, value in enumerate(values):
            where = f"{self.path(key)}[{i}]"
            if not isinstance(value, list) or len(value) != 2:
                got = f"list of {len(value)}" if isinstance(value, list) else type_name(value)
                raise self.error(where, f"expected a [prompt, answer] pair, got {got}")
            for j, part in enumerate(value):
                problem = string_problem(part)
                if problem:
                    raise self.error(f"{where}[{j}]", problem)
            out.append((value[0], value[1].strip()))
        return out

    def obj(self, key: str) -> Fields:
        """A required nested object."""
        return Fields(self.raw(key), self.file, self.record, self.path(key))

    def objects(self, key: str, *, nonempty: bool = True) -> list[Fields]:
        """A required list of objects."""
        values = self._list(key, "objects", nonempty)
        return [Fields(v, self.file, self.record, f"{self.path(key)}[{i}]") for i, v in enumerate(values)]

    def rome_rewrite(self) -> EditRequest:
        """This object read as a ROME-style ``requested_rewrite``.

        Holds ``prompt`` (template with ``{}``), ``subject``, ``target_new.str`` and ``target_true.str``.
        """
        prompt = self.template("prompt")
        subject = self.string("subject")
        target_new = self.obj("target_new").answer("str")
        target_true = self.obj("target_true").answer("str")
        return EditRequest(prompt=prompt, subject=subject, target_new=target_new, target_true=target_true)


ParseOne = Callable[[Fields, str], Case]
"""Reads one record (its Fields and the cases' ``source``) into a Case, raising DataError when malformed."""


def build_cases(
    records: list[Any],
    *,
    file: str,
    source: str,
    parse_one: ParseOne,
    known_invalid: Collection[int] = (),
    id_field: str = "case_id",
) -> list[Case]:
    """Every record parsed and validated into a Case, in file order; the first problem raises DataError.

    Records whose index is in ``known_invalid`` are dropped *if* they fail validation (a known defect of a
    published file); valid ones are kept. Case ids must be unique over the whole file.
    """
    cases: list[Case] = []
    first_seen: dict[str, int] = {}
    for index, raw in enumerate(records):
        try:
            case = parse_one(Fields(raw, file, index), source)
        except ValueError as err:  # DataError is a ValueError; any other is a record check we did not anticipate
            problem = err if isinstance(err, DataError) else DataError(file, index, None, str(err))
            if index not in known_invalid:
                raise problem from None
            log.info("dropped a known-invalid record: %s", problem)
            continue
        if case.case_id in first_seen:
            first = first_seen[case.case_id]
            raise DataError(file, index, id_field, f"duplicate case id {case.case_id!r} (first at record {first})")
        first_seen[case.case_id] = index
        cases.append(case)
    return cases


@dataclass(frozen=True)
class Format:
    """A published dataset format: how to recognise a record of it and how to read a whole file of it.

    ``detect`` looks at the first record (a dict) and says whether it is in this format; ``parse`` turns the
    file's top-level list into validated Cases (see :func:`build_cases` for ``known_invalid``).
    """

    name: str
    description: str
    detect: Callable[[Mapping[str, Any]], bool]
    parse: Callable[..., list[Case]]


def first_record(records: list[Any], file: str) -> Mapping[str, Any]:
    """The first record of a non-empty list, which must be an object (format detection reads its keys)."""
    first = records[0]
    if not isinstance(first, dict):
        raise DataError(file, 0, None, f"expected an object, got {type_name(first)}")
    return first
