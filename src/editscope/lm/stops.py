"""Where a generated answer ends: the wild protocol's stop strings read as text (no model, no torch), so the suites
and reports that name these rules load no model library. :mod:`editscope.lm.decode` stops decoding by them and
:func:`editscope.lm.engine.cut_at_stop` cuts the answer by them."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: where an answer starts for its stop strings (:func:`answer_start`): ``stop`` (the reference's ``stop_strings``: a
#: newline the model opens with ends the answer, ``""``), ``skip`` (after leading whitespace), ``lead_in`` (also after
#: a first line that ends with a colon, "The answer is:")
BLANK_STARTS = ("stop", "skip", "lead_in")

#: what a full stop in the stop strings ends: ``any`` (every ".", the reference's ``stop_strings``) or ``sentence``
#: (a "." that ends a sentence, :func:`sentence_end`)
FULL_STOPS = ("any", "sentence")

#: words a full stop follows without ending the sentence: titles and abbreviations inside names ("Dr. Rajendra
#: Prasad", "St. Moritz", "No. 5"); single letters (initials, "U.S.") are caught apart
ABBREVIATIONS = frozenset({"Mr", "Mrs", "Ms", "Dr", "Prof", "St", "Mt", "Ft", "Jr", "Sr", "No", "vs", "Gen", "Col",
                           "Lt", "Sgt", "Capt", "Rev", "Hon", "Gov", "Sen", "Rep", "ca"})
_INITIAL = re.compile(r"(?:^|\W)[A-Za-z]\.*$")  # a single letter (its own word) before the stop: "C." "U.S."
_LAST_WORD = re.compile(r"(\w+)\.*$")


def sentence_end(text: str, *, final: bool) -> int | None:
    """The index of the first "." of ``text`` that ends a sentence: followed by whitespace (or, ``final``, by the
    end of the text) and not after an initial or an :data:`ABBREVIATIONS` word, so "Robert C. Newton", "U.S. Army",
    "3.5 million", "doi.org" and "Dr. Who" run on ("Knee... And" ends at the ellipsis's first dot); None when there
    is none. A "." that ends a text still being
    decoded (not ``final``) is undecided: None, and the next token says."""
    for found in re.finditer(r"\.", text):
        i = found.start()
        after = text[i + 1:i + 2]
        if not after and not final:
            return None
        if after and not after.isspace():
            continue
        before = text[:i]
        word = _LAST_WORD.search(before)
        if _INITIAL.search(before) or (word is not None and word.group(1) in ABBREVIATIONS):
            continue
        return len(before.rstrip("."))  # an ellipsis ends where its first dot stands
    return None


def first_stop(text: str, stop: Sequence[str], *, full_stop: str = "any", final: bool = True) -> int | None:
    """Where ``text`` ends by the stop strings: the least index of any of ``stop`` in it, the "." among them read
    by ``full_stop`` (:data:`FULL_STOPS`); None when none occurs. ``final``: no more text will follow (decoding
    ended), which decides a "." at the very end under ``sentence``."""
    sentence = full_stop == "sentence" and "." in stop
    ends = [text.find(s) for s in stop if not (sentence and s == ".")]
    if sentence:
        i = sentence_end(text, final=final)
        ends.append(-1 if i is None else i)
    ends = [i for i in ends if i >= 0]
    return min(ends) if ends else None


def answer_start(text: str, blank_start: str = "stop") -> int:
    """Where the answer in ``text`` starts, the stop strings counting from there (:data:`BLANK_STARTS`): ``stop``
    at its first character; ``skip`` at its first non-whitespace one; ``lead_in`` there too, or, when its first
    line ends with a colon (``"The answer is:\\nFrance"``), at the first non-whitespace character after that line."""
    if blank_start == "stop":
        return 0
    start = len(text) - len(text.lstrip())
    line_end = text.find("\n", start)
    if blank_start == "lead_in" and line_end >= 0 and text[start:line_end].rstrip().endswith(":"):
        rest = text[line_end:]
        start = line_end + len(rest) - len(rest.lstrip())
    return start


__all__ = ["ABBREVIATIONS", "BLANK_STARTS", "FULL_STOPS", "answer_start", "first_stop", "sentence_end"]
