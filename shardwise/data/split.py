r"""Which lines of a click-log file a rank parses: stripes of ``block_size`` bytes, dealt round-robin.

The (uncompressed) bytes of the inputs, file after file, are cut into stripes of ``block_size``
bytes; stripe ``s`` (counted across all files) belongs to rank ``s % world``, and a line belongs to
the stripe holding its first byte. So the ranks' rows partition the input, every rank derives the
same split from the file sizes alone, and a rank never parses another rank's lines:

- a plain ``.tsv`` is read by byte range: a rank seeks to each of its stripes, moves to the first
  line start and reads up to the first line start of the next stripe;
- a ``.gz`` cannot seek, so every rank decompresses the whole stream but tokenizes and converts only
  the lines of its stripes. Both give the same rows for the same content.

Example:
    >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
    >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
    >>> src = Source.open(path)
    >>> sum(len(c.data) for c in src.chunks(8 << 20, rank=0, world=1, first_stripe=0)) == os.path.getsize(path)
    True
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

try:   # ISA-L's inflate (python-isal) is 2.5-3x zlib's on these files; the same gzip format and API
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _IsalError
except ImportError:   # a trimmed install still reads .gz, at zlib's speed
    _gzip, _IsalError = gzip, zlib.error

__all__ = ["Chunk", "Source"]

_GZIP_MAGIC = b"\x1f\x8b"
_SCAN = 1 << 16


@dataclass
class Chunk:
    """Whole lines of one file, starting at a line start; ``first_line()`` is their first line number."""

    data: bytes
    first_line: Callable[[], int]


@dataclass
class Source:
    """One input file, checked when opened (exists, not empty, gzip when named .gz)."""

    path: Path
    gzipped: bool
    size: int
    stripes_seen: Optional[int] = field(default=None)   # stripes of the last full pass (.gz: known after it)

    @classmethod
    def open(cls, path) -> "Source":
        """Check ``path`` and return it as a source; ValueError naming the path and the fix otherwise."""
        p = Path(path)
        if p.is_dir():
            raise ValueError(f"{str(p)!r} is a folder; pass Criteo-format files (.tsv or .tsv.gz) or a folder "
                             f"made by `shardwise data prepare`, alone")
        if not p.is_file():
            raise ValueError(f"{str(p)!r}: no such file; pass a Criteo-format file (label, 13 ints, 26 hex ids, "
                             f"tab-separated), .tsv or .tsv.gz")
        size = p.stat().st_size
        if size == 0:
            raise ValueError(f"{str(p)!r}: the file is empty (0 bytes); pass a file with at least one line of "
                             f"Criteo data, or leave it out")
        with open(p, "rb") as fh:
            magic = fh.read(2)
        gzipped = magic == _GZIP_MAGIC
        if p.suffix == ".gz" and not gzipped:
            raise ValueError(f"{str(p)!r} is named .gz but is not gzip-compressed (it starts with {magic!r}, not "
                             f"1f 8b); rename it without .gz if it is plain text, or fetch the file again")
        return cls(p, gzipped, size)

    def plain_stripes(self, block_size: int) -> Optional[int]:
        """Stripes of a plain file, from its size (None for .gz: known only after reading it)."""
        return None if self.gzipped else -(-self.size // block_size)

    def chunks(self, block_size: int, rank: int, world: int, first_stripe: int) -> Iterator[Chunk]:
        """This rank's lines of the file, in file order, in chunks of about ``block_size`` bytes."""
        if self.gzipped:
            yield from self._gzip_chunks(block_size, rank, world, first_stripe)
        else:
            yield from self._plain_chunks(block_size, rank, world, first_stripe)

    # ---- plain files: read only this rank's byte ranges -------------------------------------------
    def _plain_chunks(self, block_size, rank, world, first_stripe) -> Iterator[Chunk]:
        n = self.plain_stripes(block_size)
        with open(self.path, "rb") as fh:
            for j in range(n):
                if (first_stripe + j) % world != rank:
                    continue
                start = _line_start_at_or_after(fh, j * block_size, self.size)
                end = _line_start_at_or_after(fh, (j + 1) * block_size, self.size)
                if end > start:
                    fh.seek(start)
                    yield Chunk(fh.read(end - start), _lines_before(self.path, start))
        self.stripes_seen = n

    # ---- gzip: every rank inflates everything, keeps its stripes' lines ----------------------------
    def _gzip_chunks(self, block_size, rank, world, first_stripe) -> Iterator[Chunk]:
        out = _Gather(block_size)
        carry, carry_stripe, line_no, j = b"", 0, 1, 0
        with _gzip.open(self.path, "rb") as fh:
            while True:
                piece = self._read(fh, block_size)
                if not piece:
                    break
                mine = (first_stripe + j) % world == rank
                rest = piece
                if carry:   # the line that started in an earlier stripe ends in this piece (or later)
                    nl = piece.find(b"\n")
                    if nl < 0:
                        carry += piece
                        j += 1
                        continue
                    if (first_stripe + carry_stripe) % world == rank:
                        yield from out.add(carry + piece[:nl + 1], line_no)
                    line_no += 1
                    rest = piece[nl + 1:]
                cut = rest.rfind(b"\n") + 1
                if mine and cut:
                    yield from out.add(rest[:cut], line_no)
                line_no += rest.count(b"\n", 0, cut)
                carry, carry_stripe = rest[cut:], j
                j += 1
        if carry and (first_stripe + carry_stripe) % world == rank:
            yield from out.add(carry, line_no)
        yield from out.flush()
        self.stripes_seen = j

    def _read(self, fh, n: int) -> bytes:
        """Exactly n bytes (fewer only at the end): stripes of a .gz must line up with the plain file's."""
        try:
            parts, got = [], 0
            while got < n:
                part = fh.read(n - got)
                if not part:
                    break
                parts.append(part)
                got += len(part)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        except (OSError, EOFError, zlib.error, _IsalError) as e:
            raise ValueError(f"{str(self.path)!r}: the gzip stream is damaged or cut short ({e}); fetch or "
                             f"compress the file again (`gzip -t` checks it)") from None


class _Gather:
    """Joins consecutive owned pieces into chunks of about ``size`` bytes (contiguous lines only, so a
    chunk's line numbers stay first_line + k)."""

    def __init__(self, size: int):
        self.size, self.parts, self.first, self.next_line, self.nbytes = size, [], 0, None, 0

    def add(self, data: bytes, line_no: int) -> Iterator[Chunk]:
        if self.parts and line_no != self.next_line:
            yield from self.flush()
        if not self.parts:
            self.first = line_no
        self.parts.append(data)
        self.nbytes += len(data)
        self.next_line = line_no + data.count(b"\n")
        if self.nbytes >= self.size:
            yield from self.flush()

    def flush(self) -> Iterator[Chunk]:
        if self.parts:
            first = self.first
            yield Chunk(b"".join(self.parts), lambda: first)
        self.parts, self.nbytes, self.next_line = [], 0, None


def _line_start_at_or_after(fh, pos: int, size: int) -> int:
    """The first offset >= pos at which a line starts (size when none does)."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    at = pos - 1   # a line starts at p when the byte before p is a newline
    fh.seek(at)
    while True:
        window = fh.read(_SCAN)
        if not window:
            return size
        nl = window.find(b"\n")
        if nl >= 0:
            return at + nl + 1
        at += len(window)


def _lines_before(path: Path, offset: int) -> Callable[[], int]:
    """A callable giving the line number at byte ``offset`` (counted only when an error needs it)."""
    def count() -> int:
        lines = 1
        with open(path, "rb") as fh:
            left = offset
            while left > 0:
                window = fh.read(min(left, 1 << 24))
                if not window:
                    break
                lines += window.count(b"\n")
                left -= len(window)
        return lines
    return count

