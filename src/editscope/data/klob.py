"""KLoB-u loader: sentences of random words, each ending in the blank ``" _"`` (KLoB paper, Sec. 3).

The published ``KLoB-u.jsonl`` holds one JSON *string* per line, e.g.
``"pumice preministry matureness achropsia petticoatery cephalocentesis _"``. KLoB-u serves as the
non-factual inputs of the RSD metric in knowledge locating. Each line becomes a :class:`KlobSentence`.

Validation: every non-blank line must be valid JSON holding a non-empty string that ends with ``"_"``
(the blank where an answer would go). Errors read ``file:record N: what is wrong`` where ``N`` is the
0-based line number; blank lines are skipped (they keep their number, so record numbers stay line
numbers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from editscope.data._common import json_error, read_json_text, string_problem, type_name
from editscope.errors import DataError
from editscope.paths import data_file

KLOB_U_FILE = "klob/KLoB-u.jsonl"
"""The shared KLoB-u file, relative to :func:`editscope.paths.data_dir`."""


@dataclass(frozen=True)
class KlobSentence:
    """One KLoB sentence: its 0-based line ``index`` in the file and its ``text`` as published."""

    index: int
    text: str

    @property
    def prompt(self) -> str:
        """The text before the final blank ``_`` (trailing whitespace removed): what a causal LM reads."""
        return self.text[: self.text.rindex("_")].rstrip()


def load_klob_u(path: str | Path | None = None, *, limit: int | None = None, offset: int = 0) -> list[KlobSentence]:
    """The sentences of a KLoB-u JSON Lines file (default: the shared one), every line validated first.

    ``offset``/``limit`` select a slice of the sentences after the whole file has been validated.
    """
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"offset and limit must be >= 0, got offset={offset}, limit={limit}")
    file_path = data_file(KLOB_U_FILE) if path is None else Path(path)
    file = str(file_path)
    sentences: list[KlobSentence] = []
    # split on "\n" only: str.splitlines would also split inside strings holding U+2028 and friends
    for index, line in enumerate(read_json_text(file_path).split("\n")):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(file, index, None, json_error(err)) from None
        except (ValueError, RecursionError) as err:  # huge integers, deep nesting
            raise DataError(file, index, None, f"invalid JSON: {err or 'nested too deeply'}") from None
        if not isinstance(value, str):
            raise DataError(file, index, None, f"expected a JSON string, got {type_name(value)}")
        problem = string_problem(value)
        if problem:
            raise DataError(file, index, None, problem)
        if not value.rstrip().endswith("_"):
            raise DataError(file, index, None, f"expected a sentence ending in the blank '_', got {value!r}")
        sentences.append(KlobSentence(index=index, text=value))
    if not sentences:
        raise DataError(file, None, None, "the file holds no sentences")
    end = None if limit is None else offset + limit
    return sentences[offset:end]
