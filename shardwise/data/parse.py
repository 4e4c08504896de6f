"""One chunk of whole Criteo lines (bytes) -> a ``ClickLogBatch``: pyarrow tokenizes, numpy converts.

Every field is read as raw bytes, checked and converted with numpy over whole columns (no Python
loop per value: one 8-byte word load per value, then bit tricks on uint64 vectors). Rows not
accepted outright go through the line parser of ``shardwise.train.data`` one by one, so the values
and the error messages are exactly those of ``CriteoTSV``; only such rows pay for it (a bad line in
raise mode: its whole chunk, to find and number the first one).

Example:
    >>> out = parse_chunk(b"1\\t" + b"\\t" * 13 + b"\\t".join([b"ab"] * 26) + b"\\n", "f.tsv", ChunkOptions())
    >>> int(out.batch.ids[0, 0]), out.bad_lines
    (171, 0)
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from .criteo import DENSE_NAMES, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, ClickLogBatch
from .criteo import parse_line as _python_parse_line

__all__ = ["ChunkOptions", "ParsedChunk", "parse_chunk", "explain_line"]

_NAMES = ["label", *DENSE_NAMES, *SPARSE_NAMES]
_LOW63 = np.uint64(2**63 - 1)
_ARROW_BLOCK = 4 << 20
_ONES = 0x0101010101010101
_HIGH = np.uint64(0x80 * _ONES)
# _KEEP_HIGH[w]: a little-endian word's top w bytes (a value's last w bytes end the 8-byte window)
_KEEP_HIGH = np.array([0] + [(2**64 - 1) ^ (2**(64 - 8 * w) - 1) for w in range(1, 9)], dtype=np.uint64)


# every bad-line error says how to go on without fixing the file (shardwise train and data prepare
# both take the flag)
SKIP_HINT = "or pass --skip-bad-lines to skip and count malformed lines"


@dataclass(frozen=True)
class ChunkOptions:
    """How to parse: skip bad lines (and count them) or raise; threads for pyarrow's tokenizer."""

    skip_bad_lines: bool = False
    use_threads: bool = False


@dataclass
class ParsedChunk:
    batch: ClickLogBatch
    bad_lines: int


def explain_line(raw: bytes, line_no: int, name: str):
    """Parse one line as ``CriteoTSV`` does: its values, or its ValueError (file, line, field, fix).

    Returns None for a blank line (``CriteoTSV`` skips those).
    """
    try:
        line = raw.decode("ascii")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name} line {line_no}: byte {raw[e.start]:#04x} at column {e.start + 1} is not text; "
                         f"a Criteo file holds ASCII digits, hex ids and tabs only") from None
    if not line.strip():
        return None
    return _python_parse_line(line, line_no, name)


def parse_chunk(data: bytes, name: str, opts: ChunkOptions,
                first_line: Optional[Callable[[], int]] = None) -> ParsedChunk:
    """Parse ``data`` (whole lines of one file) into a ``ClickLogBatch``.

    ``first_line()`` gives the file line number of the chunk's first line; it is asked only when an
    error must be reported (for a byte range of a plain file it costs a count of the bytes before it).
    """
    if _odd(data):
        return _python_chunk(data, name, opts, first_line)
    invalid: list = []   # rows without 40 fields (pyarrow's row numbers skip empty lines: not used)

    def on_invalid(row) -> str:
        if row.text.strip():     # ASCII here (see _odd), so pyarrow could decode it; blank: not bad
            invalid.append(row.text)
        return "skip"

    # 4 MiB pyarrow blocks, converted one by one (CPU time measured on 8 MiB of Criteo-like lines:
    # 256 KiB blocks pay numpy's per-call overhead twice over, 16 MiB ones tokenize 25% slower)
    try:
        table = pacsv.read_csv(pa.BufferReader(data), read_options=pacsv.ReadOptions(
            column_names=_NAMES, use_threads=opts.use_threads, block_size=_ARROW_BLOCK),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False,
                                             escape_char=False, newlines_in_values=False,
                                             invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in _NAMES}, check_utf8=False,
                                                 null_values=[], strings_can_be_null=False))
    except pa.ArrowInvalid:
        return _python_chunk(data, name, opts, first_line)
    bad = len(invalid)
    if bad and not opts.skip_bad_lines:
        return _python_chunk(data, name, opts, first_line)   # raises at the first bad line, numbered
    batches = table.to_batches()
    converted = list(_pool().map(_convert, [rb.columns for rb in batches]) if opts.use_threads and len(batches) > 1
                     else map(_convert, [rb.columns for rb in batches]))
    out = []
    for rb, (batch, ok) in zip(batches, converted):
        if not ok.all():   # rows the fast path flagged: good after all (a count over 16 digits) or bad
            keep, n_bad = _python_fixups(rb.columns, ok, batch, name)
            if n_bad and not opts.skip_bad_lines:
                return _python_chunk(data, name, opts, first_line)
            bad += n_bad
            batch = ClickLogBatch(batch.dense[keep], batch.ids[keep], batch.labels[keep])
        out.append(batch)
    return ParsedChunk(_concat(out), bad)


def _odd(data: bytes) -> bool:
    """Bytes the fast path would read differently from CriteoTSV: a NUL (it looks like the fast
    path's zero padding), a carriage return not ending a line (pyarrow ends the row there), a
    non-ASCII byte (always an error; pyarrow cannot hand such a row to its handler)."""
    return not data.isascii() or b"\0" in data or (b"\r" in data and data.count(b"\r") != data.count(b"\r\n"))


def _concat(parts: list) -> ClickLogBatch:
    if not parts:
        return ClickLogBatch(np.zeros((0, NUM_DENSE), np.float32), np.zeros((0, NUM_SPARSE), np.int64),
                     np.zeros(0, np.float32))
    return ClickLogBatch(*(np.concatenate(x) for x in zip(*((b.dense, b.ids, b.labels) for b in parts))))


def _python_chunk(data: bytes, name: str, opts: ChunkOptions, first_line: Optional[Callable[[], int]]) -> ParsedChunk:
    """The whole chunk through CriteoTSV's line parser: the first bad line raises (its line number
    counted only then), or with skip_bad_lines is dropped and counted."""
    labels, dense, ids, bad = [], [], [], 0
    for k, raw in enumerate(data.split(b"\n")):
        if not raw:
            continue
        try:
            parsed = explain_line(raw + b"\n", 0, name)
        except ValueError:
            if opts.skip_bad_lines:
                bad += 1
                continue
            try:
                explain_line(raw + b"\n", (first_line() if first_line is not None else 1) + k, name)
            except ValueError as e:
                raise ValueError(f"{e} ({SKIP_HINT})") from None
            raise AssertionError(f"{name}: the line parser accepted a line it had refused") from None
        if parsed is not None:
            labels.append(parsed[0])
            dense.append(parsed[1])
            ids.append(parsed[2])
    batch = ClickLogBatch(np.asarray(dense, dtype=np.float32).reshape(-1, NUM_DENSE),
                  np.asarray(ids, dtype=np.int64).reshape(-1, NUM_SPARSE), np.asarray(labels, dtype=np.float32))
    return ParsedChunk(batch, bad)


@functools.lru_cache(maxsize=None)
def _pool() -> ThreadPoolExecutor:
    """For use_threads: numpy releases the GIL in its loops, so pyarrow's blocks convert side by side.
    Made on first use, so importing the package starts no threads."""
    return ThreadPoolExecutor(max(os.cpu_count() or 1, 1), thread_name_prefix="shardwise-convert")


def _convert(cols) -> tuple[ClickLogBatch, np.ndarray]:
    """Columns -> arrays, and the rows every field of which the fast path accepts (the others get
    placeholder values, fixed up or dropped after)."""
    n = len(cols[0])
    col = _Column(cols[0])
    first = col.first_byte()
    ok = (col.lengths == 1) & ((first == ord("0")) | (first == ord("1")))
    labels = (first == ord("1")).astype(np.float32)
    dense = np.zeros((n, NUM_DENSE), dtype=np.float32)
    for k, c in enumerate(cols[1:1 + NUM_DENSE]):
        dense[:, k], good = _dense_column(_Column(c))
        ok &= good
    ids = np.empty((n, NUM_SPARSE), dtype=np.int64)
    for k, c in enumerate(cols[1 + NUM_DENSE:]):
        ids[:, k], good = _hex_column(_Column(c))
        ok &= good
    return ClickLogBatch(dense, ids, labels), ok


class _Column:
    """A binary column's bytes (8 zero bytes on each side) with each value's end and length, and
    ``tail(back, width)``: for every value, its ``width`` (<= 8) bytes ending ``back`` bytes before
    its end, loaded as one little-endian uint64 (one unaligned 8-byte load per value, no loop over
    characters) with the bytes before them zeroed."""

    def __init__(self, col: pa.Array):
        n = len(col)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset:col.offset + n + 1].astype(np.int64)
        raw = col.buffers()[2]
        data = np.frombuffer(raw, dtype=np.uint8)[:offsets[-1]] if raw is not None else np.zeros(0, np.uint8)
        self.data = np.concatenate([np.zeros(8, np.uint8), data[offsets[0]:], np.zeros(8, np.uint8)])
        self.ends = offsets[1:] - offsets[0] + 8
        self.lengths = np.diff(offsets)
        # every 8-byte window of the data as a (misaligned) uint64: a gather loads 8 bytes per value
        self.words = np.ndarray((len(self.data) - 7,), dtype="<u8", buffer=self.data, strides=(1,))

    def first_byte(self) -> np.ndarray:
        return np.where(self.lengths > 0, self.data[np.minimum(self.ends - self.lengths, len(self.data) - 1)], 0)

    def tail(self, back: int, width: np.ndarray) -> np.ndarray:
        return self.words[np.maximum(self.ends - back - 8, 0)] & _KEEP_HIGH[np.minimum(np.maximum(width, 0), 8)]


def _bytes_in(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Per byte of ``v`` (all bytes < 0x80): 0x80 where lo <= byte <= hi, else 0 (no carries cross bytes)."""
    return ((v + np.uint64((0x80 - lo) * _ONES)) & ~(v + np.uint64((0x7F - hi) * _ONES))) & _HIGH


def _zero_bytes(v: np.ndarray) -> np.ndarray:
    """Per byte (all < 0x80): 0x80 where it is 0 (the padding in front of a short value)."""
    return ~(v + np.uint64(0x7F * _ONES)) & _HIGH


def _digits_ok(v: np.ndarray) -> np.ndarray:
    """Every byte padding or '0'-'9' (word-wide bit tricks, no per-byte table lookups)."""
    return ((v & _HIGH) == 0) & ((_zero_bytes(v) | _bytes_in(v, 0x30, 0x39)) == _HIGH)


def _hex_column(col: _Column) -> tuple[np.ndarray, np.ndarray]:
    """Hex ids -> int64 (missing = -1), and which values were well formed.

    Per 8 characters: each byte becomes its digit ((c & 15) + 9 for letters) and the 8 nibbles are
    packed with shifts, all on uint64 vectors. A 64-bit id with its top bit set keeps its low 63
    bits, as ``CriteoTSV`` does.
    """
    lengths = col.lengths
    low = col.tail(0, lengths)
    good = _hex_ok(low)
    value = _hex8(low)
    if (lengths > 8).any():
        high = col.tail(8, lengths - 8)
        value |= _hex8(high) << np.uint64(32)
        good &= _hex_ok(high)
    good &= lengths <= 16
    out = (value & _LOW63).astype(np.int64)
    out[lengths == 0] = -1
    return out, good


def _hex_ok(v: np.ndarray) -> np.ndarray:
    """Every byte padding, '0'-'9', or (with the case bit set) 'a'-'f'."""
    ascii_only = (v & _HIGH) == 0
    hit = _zero_bytes(v) | _bytes_in(v, 0x30, 0x39) | _bytes_in(v | np.uint64(0x20 * _ONES), 0x61, 0x66)
    return ascii_only & (hit == _HIGH)


def _hex8(v: np.ndarray) -> np.ndarray:
    """8 ASCII hex digits (first digit in the lowest byte; zero bytes read as 0) -> their value."""
    letter = (v >> np.uint64(6)) & np.uint64(0x0101010101010101)
    d = (v & np.uint64(0x0F0F0F0F0F0F0F0F)) + letter * np.uint64(9)
    d = ((d & np.uint64(0x000F000F000F000F)) << np.uint64(4)) | ((d >> np.uint64(8)) & np.uint64(0x000F000F000F000F))
    d = ((d & np.uint64(0x000000FF000000FF)) << np.uint64(8)) | ((d >> np.uint64(16)) & np.uint64(0x000000FF000000FF))
    return ((d & np.uint64(0xFFFF)) << np.uint64(16)) | ((d >> np.uint64(32)) & np.uint64(0xFFFF))


def _dense_column(col: _Column) -> tuple[np.ndarray, np.ndarray]:
    """Decimal counts (up to 16 digits here) -> float32, missing and negatives read as 0; and which
    values were well formed (longer ones may still be in int64 range: the line parser decides)."""
    lengths = col.lengths
    negative = (lengths > 1) & (col.first_byte() == ord("-"))
    digits = lengths - negative
    low = col.tail(0, digits)
    good = _digits_ok(low)
    value = _dec8(low)
    if (digits > 8).any():
        high = col.tail(8, digits - 8)
        value += _dec8(high) * np.uint64(10**8)
        good &= _digits_ok(high)
    good &= digits <= 16
    value[negative] = 0
    # through float64, as numpy turns CriteoTSV's Python ints into float32
    return value.astype(np.float64).astype(np.float32), good


def _dec8(v: np.ndarray) -> np.ndarray:
    """8 ASCII decimal digits (first in the lowest byte; zero bytes read as 0) -> their value."""
    d = v - ((v >> np.uint64(4)) & np.uint64(0x0101010101010101)) * np.uint64(0x30)   # '0'..'9' have bit 4 set
    d = (d & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(10) + ((d >> np.uint64(8)) & np.uint64(0x00FF00FF00FF00FF))
    d = (d & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(100) + ((d >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF))
    return (d & np.uint64(0xFFFFFFFF)) * np.uint64(10000) + (d >> np.uint64(32))


def _python_fixups(cols, ok: np.ndarray, batch: ClickLogBatch, name: str):
    """Rows the fast path did not accept: the line parser's values, or dropped and counted."""
    keep = np.ones(len(ok), dtype=bool)
    bad = 0
    for i in np.flatnonzero(~ok):
        raw = b"\t".join(c[int(i)].as_py() for c in cols)
        try:
            parsed = explain_line(raw, 0, name)
        except ValueError:
            parsed = None
        if parsed is None:
            keep[i] = False
            bad += not _blank(raw)   # CriteoTSV passes over lines of tabs only, as blank
            continue
        label, dense, ids = parsed
        batch.labels[i], batch.dense[i], batch.ids[i] = label, dense, ids
    return keep, bad


def _blank(raw: bytes) -> bool:
    try:
        return not raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return False
