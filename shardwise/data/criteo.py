r"""The Criteo click-log schema: the column names, the raw batch every reader returns, and the line parser.

A line is ``label <TAB> I1..I13 <TAB> C1..C26`` (40 fields): the label 0 or 1, counts as decimal
integers (missing = 0, negative ones read as 0), categorical ids as hex (missing = -1: an empty bag).
``parse_line`` is the reference parser: ``shardwise.data``'s vectorised reader falls back to it for
any row it does not accept outright, so values and error messages are the same.

Example:
    >>> label, dense, ids = parse_line("\t".join(["1"] + ["5"] * 13 + ["ff"] * 26), 1, "day_0.tsv")
    >>> label, dense[0], ids[0]
    (1, 5, 255)
    >>> ClickLogBatch(np.zeros((2, NUM_DENSE), np.float32), np.full((2, NUM_SPARSE), -1), np.zeros(2)).ids.shape
    (2, 26)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["NUM_DENSE", "NUM_SPARSE", "DENSE_NAMES", "SPARSE_NAMES", "ClickLogBatch", "parse_line"]

NUM_DENSE, NUM_SPARSE = 13, 26
DENSE_NAMES = [f"I{i + 1}" for i in range(NUM_DENSE)]
SPARSE_NAMES = [f"C{i + 1}" for i in range(NUM_SPARSE)]
_INT = re.compile(r"-?[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
_INT64_LIMIT = 2**63


@dataclass
class ClickLogBatch:
    """Raw features: ``dense`` float32 [n, 13] (missing = 0), ``ids`` int64 [n, 26] (missing = -1),
    ``labels`` float32 [n]. (TorchRec's ``Batch`` of model inputs is another thing.)"""

    dense: np.ndarray
    ids: np.ndarray
    labels: np.ndarray


def parse_line(line: str, line_no: int, name: str) -> tuple:
    """One Criteo line -> (label, 13 counts, 26 ids); ValueError naming the file, line, field and fix."""
    fields = line.rstrip("\r\n").split("\t")
    where = f"{name} line {line_no}"
    if len(fields) != 1 + NUM_DENSE + NUM_SPARSE:
        raise ValueError(f"{where}: expected 40 tab-separated fields (label, I1-I13, C1-C26), got "
                         f"{len(fields)}; fix or drop that line")
    if fields[0] not in ("0", "1"):
        raise ValueError(f"{where}, field label: {fields[0]!r} must be 0 or 1 (clicked or not); fix or drop that line")
    dense = []
    for k, text in enumerate(fields[1:1 + NUM_DENSE]):
        # a regex, not just int(): int() also takes ' 5', '+5' and '1_000'
        if text and _INT.fullmatch(text):
            if len(text.lstrip("-")) > 18 and abs(int(text)) >= _INT64_LIMIT:
                # float32 would turn it into inf and the loss into nan many steps later
                raise ValueError(f"{where}, field {DENSE_NAMES[k]}: {text!r} is outside the 64-bit integer "
                                 f"range; counts in a Criteo file fit in int64, fix or drop that line")
            dense.append(max(int(text), 0))
        elif not text:
            dense.append(0)
        else:
            raise ValueError(f"{where}, field {DENSE_NAMES[k]}: {text!r} is not an integer; "
                             f"use a decimal integer or leave it empty for missing")
    ids = []
    for k, text in enumerate(fields[1 + NUM_DENSE:]):
        if text.startswith("-") and _HEX.fullmatch(text[1:]):
            raise ValueError(f"{where}, field {SPARSE_NAMES[k]}: {text!r} is negative; ids must be >= 0 "
                             f"(hex digits only), or leave the field empty for missing")
        if text and not _HEX.fullmatch(text):
            raise ValueError(f"{where}, field {SPARSE_NAMES[k]}: {text!r} is not a hex id; "
                             f"use hex digits (e.g. 68fd1e64) or leave it empty for missing")
        if len(text) > 16:
            # ids are stored as int64; numpy would raise a bare OverflowError without the line
            raise ValueError(f"{where}, field {SPARSE_NAMES[k]}: {text!r} has {len(text)} hex digits; ids must "
                             f"fit in 64 bits (at most 16 hex digits, Criteo's have 8), fix or drop that line")
        value = int(text, 16) if text else -1
        # a 64-bit hash with its top bit set keeps its low 63 bits: ids stay int64 and >= 0 (-1 = missing)
        ids.append(value % _INT64_LIMIT if value >= 0 else value)
    return int(fields[0]), dense, ids
