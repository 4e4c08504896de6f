"""Criteo-format lines for the data tests: random values with every corner the format allows."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from shardwise.train.data import NUM_DENSE, NUM_SPARSE


def random_line(rng: random.Random) -> str:
    """One valid line: missing fields, negatives, long counts, mixed-case and 64-bit hex ids."""
    ints = []
    for _ in range(NUM_DENSE):
        kind = rng.random()
        ints.append("" if kind < 0.1 else str(rng.randint(-5, -1)) if kind < 0.15 else
                    str(rng.randint(10**8, 10**16)) if kind < 0.16 else str(rng.randint(0, 3000)))
    cats = []
    for _ in range(NUM_SPARSE):
        kind = rng.random()
        cats.append("" if kind < 0.08 else format(rng.getrandbits(64), "x") if kind < 0.13 else
                    format(rng.randint(0, 40), "X") if kind < 0.3 else format(rng.getrandbits(32), "08x"))
    return "\t".join([rng.choice("01"), *ints, *cats]) + "\n"


def write_log(path: Path, lines: int, seed: int = 0, gz: bool = False, extra: dict | None = None) -> Path:
    """``lines`` random lines; ``extra`` maps a 0-based line index to a replacement line."""
    rng = random.Random(seed)
    text = [random_line(rng) for _ in range(lines)]
    for k, v in (extra or {}).items():
        text[k] = v
    data = "".join(text).encode("latin-1")
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path


def line(label="1", ints=None, cats=None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(NUM_DENSE)]
    cats = cats if cats is not None else [format(0xABC0 + i, "x") for i in range(NUM_SPARSE)]
    return "\t".join([label, *ints, *cats]) + "\n"
