"""The whole CounterFact stream available here, for lifelong editing at the field's scale (NAS, UltraEdit).

Both EasyEdit CounterFact files, ``counterfact/counterfact-edit.json`` then ``counterfact/counterfact-train.json``
(10,000 records each, case ids disjoint), read in file order and de-duplicated by the filled prompt (the edited
sentence, :attr:`EditRequest.text`): **the first occurrence is kept**, every later record with the same prompt is
dropped. 108 prompts occur in both files (the train file's copy is dropped) and some repeat within a file (CounterFact
writes a few facts twice, sometimes with another ``target_new``): 268 records in all, leaving 19,732. Editing one
prompt twice in a stream would make the earlier edit "fail" retention by design, and a prompt that is both edited and
probed as a known fact would break the general suite's rule that its facts are never edited.

The last :data:`HELD_OUT` de-duplicated records (the tail of the train file) are *held out* of the stream:

* ``counterfact-stream``: the first 19,732 − :data:`HELD_OUT` = 17,732 records, the edit stream;
* ``counterfact-stream-heldout``: the last :data:`HELD_OUT`, never edited by a run of the stream; the ``general``
  suite draws its known-fact probe set from them (``fact_dataset: counterfact-stream-heldout``), so no fact of that
  set is ever edited: its prompts occur nowhere in the stream (de-duplication kept only first occurrences).

Case ids are the published ones (unique over both files); ``source`` is the registered name.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from editscope.data.counterfact import load_counterfact
from editscope.data.records import Case
from editscope.paths import data_file

FILES: tuple[str, ...] = ("counterfact/counterfact-edit.json", "counterfact/counterfact-train.json")
"""The stream's files, in the order they are read."""

HELD_OUT = 2000
"""Records at the end of the de-duplicated stream kept out of it (the general suite's known-fact pool)."""

STREAM = "counterfact-stream"
HELDOUT = "counterfact-stream-heldout"


def dedupe_first(cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """``(kept, dropped)``: every case whose filled prompt occurred in an earlier case is dropped (first kept)."""
    seen: set[str] = set()
    kept, dropped = [], []
    for case in cases:
        texts = [r.text for r in case.requests]
        if any(t in seen for t in texts):
            dropped.append(case)
            continue
        seen.update(texts)
        kept.append(case)
    return kept, dropped


@lru_cache(maxsize=2)
def _stream(files: tuple[str, ...]) -> tuple[tuple[Case, ...], int]:
    cases: list[Case] = []
    for name in files:
        cases += load_counterfact(data_file(name), source=STREAM)
    kept, dropped = dedupe_first(cases)
    return tuple(kept), len(dropped)


def stream_cases() -> list[Case]:
    """The edit stream (``counterfact-stream``): the de-duplicated records but the last :data:`HELD_OUT`."""
    kept, _ = _stream(FILES)
    return [replace(case) for case in kept[:-HELD_OUT]]  # copies: the cached cases stay as read


def heldout_cases() -> list[Case]:
    """The held-out tail (``counterfact-stream-heldout``), with that name as ``source``."""
    kept, _ = _stream(FILES)
    return [replace(case, source=HELDOUT) for case in kept[-HELD_OUT:]]


def dropped_count() -> int:
    """How many records de-duplication dropped (a later occurrence of an earlier prompt)."""
    return _stream(FILES)[1]


__all__ = ["FILES", "HELDOUT", "HELD_OUT", "STREAM", "dedupe_first", "dropped_count", "heldout_cases",
           "stream_cases"]
