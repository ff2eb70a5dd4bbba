"""The reference text corpus: text files read in order (``.gz`` files decompressed), by default wikitext-2 (raw)
test then validation split, shipped with the package. The layer statistics (:mod:`editscope.stats`) read it as
paragraphs of tokens; the suites read it as passages (RS reference passages and TF-IDF, 1-to-N co-occurrence
counts).

Two readers, two keys, kept as they were when the two copies of this class were merged, because each is part
of stored results (changing one would change cached or recorded numbers):

* :meth:`Corpus.paragraphs` with :attr:`Corpus.digest` (BLAKE2b-96 of the files' text bytes, concatenated): the
  layer statistics' rule -- stripped non-empty lines not starting with ``=``; the digest keys the statistics
  cache and exported statistics files.
* :attr:`Corpus.passages` with :attr:`Corpus.sha256` (SHA-256 of each file's text bytes followed by a NUL): the
  suites' rule -- stripped non-empty lines that are not a wikitext heading (`` = Title = ``); the hash keys the
  co-occurrence and TF-IDF caches and is recorded in the suites' probes.

On wikitext-2 the two rules differ on two lines of the test split (`` = Qualified for the next round `` and
`` = National record ``: table remnants, not headings), which only the passages keep."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from editscope.errors import EditscopeError

#: The default corpus: wikitext-2 raw, test and validation splits (CC BY-SA 3.0; attribution in corpus/NOTICE),
#: shipped gzip-compressed as package data so that an installed editscope needs no data folder. The files hold the
#: same bytes as the shared data folder's ``corpus/`` copies, so the digests (cache keys) are the same.
DEFAULT_FILES = tuple(Path(__file__).resolve().parents[1] / "corpus" / f"wikitext-2-raw_wiki.{split}.raw.txt.gz"
                      for split in ("test", "valid"))


def read_bytes(path: Path) -> bytes:
    """A corpus file's text bytes (a ``.gz`` file decompressed)."""
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()

_HEADING = re.compile(r"^\s*=+ .* =+\s*$")


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise EditscopeError(f"{path}:line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None


def phrase_pattern(phrase: str) -> re.Pattern[str]:
    """Case-sensitive match of ``phrase`` at word boundaries (not inside a longer word)."""
    return re.compile(r"(?<!\w)" + re.escape(phrase) + r"(?!\w)")


class Corpus:
    """Text files read in order, loaded lazily: a missing file is an error when the corpus is first read (so a
    suite that never reads it works without the data); :meth:`from_files` checks at once. ``files`` empty or
    None: the default corpus. One object per user; nothing is shared between instances."""

    def __init__(self, files: Sequence[str | os.PathLike[str]] | None = None) -> None:
        self._files = [Path(f) for f in files] if files else None
        self._paths: tuple[Path, ...] | None = None
        self._digest: str | None = None
        self._sha256: str | None = None
        self._passages: list[str] | None = None

    @classmethod
    def from_files(cls, files: Sequence[str | os.PathLike[str]]) -> Corpus:
        """The corpus of ``files`` (at least one), checked to exist and hashed now."""
        if not files:
            raise EditscopeError("corpus: no files given")
        corpus = cls(files)
        _ = corpus.digest  # reads every file: a missing one fails here
        return corpus

    @classmethod
    def default(cls) -> Corpus:
        """wikitext-2 (raw) test and validation splits, shipped with the package (checked now)."""
        return cls.from_files(DEFAULT_FILES)

    @property
    def files(self) -> tuple[Path, ...]:
        """The text files, in reading order."""
        if self._paths is None:
            paths = tuple(self._files) if self._files else DEFAULT_FILES
            for path in paths:
                if not path.is_file():
                    raise EditscopeError(f"corpus file not found: {path}")
            self._paths = paths
        return self._paths

    @property
    def digest(self) -> str:
        """BLAKE2b (12-byte digest) of the files' text bytes, concatenated: the layer statistics' cache key."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=12)
            for path in self.files:
                h.update(read_bytes(path))
            self._digest = h.hexdigest()
        return self._digest

    @property
    def sha256(self) -> str:
        """SHA-256 over each file's text bytes followed by a NUL, in order: the suites' cache key."""
        if self._sha256 is None:
            h = hashlib.sha256()
            for path in self.files:
                h.update(read_bytes(path))
                h.update(b"\x00")
            self._sha256 = h.hexdigest()
        return self._sha256

    def check_text(self) -> None:
        """Every file decodes as UTF-8; else an error naming the file and line."""
        for path in self.files:
            _decode(path, read_bytes(path))

    def paragraphs(self) -> Iterator[str]:
        """The layer statistics' text, streamed: every stripped non-empty line not starting with ``=``."""
        for path in self.files:
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rb") as fh:  # bytes, decoded per line: an error can name the line
                for number, raw in enumerate(fh, 1):
                    try:
                        decoded = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise EditscopeError(f"{path}:line {number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                                             f"column {exc.start + 1})") from None
                    # a lone \r ends a line too, as in text mode's universal newlines
                    for line in decoded.replace("\r\n", "\n").split("\r"):
                        text = line.strip()
                        if text and not text.startswith("="):
                            yield text

    @property
    def passages(self) -> list[str]:
        """The suites' passages: every non-empty line that is not a wikitext heading (`` = Title = ``), stripped.
        In wikitext-2 raw a line is one Wikipedia paragraph; in other text files whatever the file puts on one
        line."""
        if self._passages is None:
            self._passages = [line.strip() for path in self.files
                              for line in _decode(path, read_bytes(path)).splitlines()
                              if line.strip() and not _HEADING.match(line)]
        return self._passages

    def passages_with(self, phrase: str, limit: int | None = None) -> list[str]:
        """Passages that contain ``phrase`` (see :func:`phrase_pattern`), in corpus order, at most ``limit``."""
        pattern = phrase_pattern(phrase)
        out = []
        for p in self.passages:
            if pattern.search(p):
                out.append(p)
                if limit is not None and len(out) >= limit:
                    break
        return out
