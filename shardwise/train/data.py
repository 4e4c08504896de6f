"""Click logs in Criteo's schema: a deterministic synthetic generator and a Criteo TSV reader.

Both yield the same thing: ``batch(start, count) -> ClickLogBatch`` for examples ``start .. start+count-1``
of an endless stream (the TSV file is cycled), so every rank can read its own slice of a step and
a resumed run continues from a saved cursor.

Example:
    >>> data = SyntheticClicks(seed=0, cardinalities=default_cardinalities(1000))
    >>> b = data.batch(0, 4)
    >>> b.dense.shape, b.ids.shape, b.labels.shape
    ((4, 13), (4, 26), (4,))
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..data.criteo import DENSE_NAMES, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, ClickLogBatch
from ..data.criteo import parse_line as _parse_line
from ..sparse import KeyedJaggedTensor
from .synthetic.draw import bag_parts, draw_sub_block, seed_words

__all__ = [
    "NUM_DENSE", "NUM_SPARSE", "DENSE_NAMES", "SPARSE_NAMES", "ClickLogBatch", "SyntheticClicks", "CriteoTSV",
    "default_cardinalities", "to_model_inputs", "open_data", "Rows", "read_ahead",
]

# Synthetic examples are generated in fixed sub-blocks, each from its own seed, so any slice is
# reproducible and a rank generates only the sub-blocks holding the rows it reads (with the job's
# default 256 per rank: exactly its own rows, whatever the world size).
_SUB_BLOCK = 256
_CACHED_SUB_BLOCKS = 9   # a read that ends inside a sub-block finds it again at the next step


def default_cardinalities(max_rows: int) -> list[int]:
    """26 table sizes spread log-uniformly from 8 to ``max_rows`` (in a fixed shuffled order, like
    Criteo, where tiny and huge features interleave).

    Example:
        >>> max(default_cardinalities(5000))
        5000
    """
    if not isinstance(max_rows, int) or max_rows < 8:
        raise ValueError(f"max_rows={max_rows!r} must be an int >= 8 (the smallest table has 8 rows)")
    sizes = np.geomspace(8, max_rows, NUM_SPARSE).round().astype(int).tolist()
    return [sizes[(7 * i) % NUM_SPARSE] for i in range(NUM_SPARSE)]


class SyntheticClicks:
    """A click log whose labels come from a hidden logistic model, so a DLRM can learn it.

    Ids follow a power law (P(id) ~ 1/(id+1)): a few rows of every table are hot, as in real logs.
    The hidden model: a weighted sum of log1p(dense) plus one hidden effect per (feature, id); about a
    third of the features carry strong effects. Everything derives from ``seed`` through numpy
    SeedSequences, so every rank and every resumed run sees identical examples.

    Example:
        >>> SyntheticClicks(0, default_cardinalities(100)).batch(10, 2).labels.tolist()   # any rank, any run
        [1.0, 0.0]
    """

    def __init__(self, seed: int, cardinalities: Sequence[int], missing_rate: float = 0.01):
        if len(cardinalities) != NUM_SPARSE:
            raise ValueError(f"need {NUM_SPARSE} cardinalities (one per C feature), got {len(cardinalities)}")
        self.seed, self.cards = int(seed), [int(c) for c in cardinalities]
        self.missing_rate = float(missing_rate)
        hidden = np.random.default_rng(np.random.SeedSequence([self.seed, 0xC0FFEE]))
        self.dense_mu = hidden.uniform(0.0, 3.0, NUM_DENSE)
        self.dense_w = hidden.normal(0.0, 0.35, NUM_DENSE)
        strong = hidden.permutation(NUM_SPARSE)[:9]
        scale = np.where(np.isin(np.arange(NUM_SPARSE), strong), 1.0, 0.15)
        self.effects = [hidden.normal(0.0, scale[j], c).astype(np.float32) for j, c in enumerate(self.cards)]
        self.bias = -1.0
        self._cache: dict[int, ClickLogBatch] = {}
        self._flat = None
        self._cards_f = np.asarray(self.cards, dtype=np.float64)
        self._log_cards1 = np.log(self._cards_f + 1.0)
        self._last_row = self._cards_f - 1
        self._seed_prefix = seed_words(self.seed, 0x5EED, _SUB_BLOCK)

    def flat_effects(self) -> tuple:
        """(every table's hidden effects end to end, each after one 0.0; where each table starts)."""
        if self._flat is None:
            zero = np.zeros(1, np.float32)
            offsets = np.cumsum([1] + [c + 1 for c in self.cards[:-1]]).astype(np.int64)
            self._flat = (np.concatenate([x for e in self.effects for x in (zero, e)]), offsets)
        return self._flat

    def _block(self, index: int) -> ClickLogBatch:
        """Examples ``index * 256 ..`` (256 of them), drawn from their own seed: a sub-block never
        depends on which other sub-blocks were generated, so every rank and every world size sees
        the same examples."""
        if index in self._cache:
            return self._cache[index]
        # the generator of SeedSequence([seed, 0x5EED, 256, index]) seeded and drawn in one loop
        # (synthetic/draw.py): the numbers a numpy draw per use gave, in the same order, transformed by the
        # same arithmetic (this runs on every rank at every step)
        flat, offsets = self.flat_effects()
        dense, ids, labels = draw_sub_block(self._seed_prefix, index, _SUB_BLOCK, self.dense_mu, self._log_cards1,
                                            self._last_row, self.missing_rate, self.bias, self.dense_w, flat, offsets)
        out = ClickLogBatch(dense, ids, labels)
        if len(self._cache) >= _CACHED_SUB_BLOCKS:
            self._cache.pop(next(iter(self._cache)))
        self._cache[index] = out
        return out

    def batch(self, start: int, count: int) -> ClickLogBatch:
        """Examples ``start .. start+count-1`` of the endless stream (none when ``count`` is 0)."""
        if start < 0 or count < 0:
            raise ValueError(f"batch(start={start}, count={count}): the stream starts at example 0 and a read "
                             f"holds count >= 0 examples; pass non-negative numbers")
        parts, pos, end = [], start, start + count
        while pos < end:
            b, off = divmod(pos, _SUB_BLOCK)
            take = min(_SUB_BLOCK - off, end - pos)
            blk = self._block(b)
            parts.append((blk.dense[off:off + take], blk.ids[off:off + take], blk.labels[off:off + take]))
            pos += take
        if not parts:   # an empty read: the arrays' shapes and types, with no rows
            return ClickLogBatch(np.zeros((0, NUM_DENSE), np.float32), np.zeros((0, NUM_SPARSE), np.int64),
                                 np.zeros(0, np.float32))
        return ClickLogBatch(*(np.concatenate(x) for x in zip(*parts)))


class CriteoTSV:
    r"""A Criteo-format file: ``label <TAB> I1..I13 <TAB> C1..C26`` per line (40 fields).

    Integers may be negative or empty (missing = 0); categorical ids are hex strings or empty
    (missing = an empty bag). The whole file is parsed up front, so a malformed line fails before any
    training step, identically on every rank; the error names the line and the field. The stream
    cycles through the file in order. Raw ids are mapped to rows with ``id % num_embeddings``.

    Example:
        >>> import os, tempfile; tmp = tempfile.TemporaryDirectory(); path = os.path.join(tmp.name, "day_0.tsv")
        >>> with open(path, "w") as f: _ = f.write(("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n") * 4)
        >>> data = CriteoTSV(path)
        >>> data.batch(0, 8).ids.shape          # 4 lines, cycled
        (8, 26)
    """

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"--data {str(path)!r}: no such file; pass a Criteo-format TSV file "
                             f"(label, 13 ints, 26 hex ids, tab-separated)")
        dense, ids, labels = [], [], []
        with open(self.path, "rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("ascii")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{self.path.name} line {line_no}: byte {raw[e.start]:#04x} at column "
                                     f"{e.start + 1} is not text; a Criteo file holds ASCII digits, hex ids "
                                     f"and tabs only") from None
                if not line.strip():
                    continue
                lab, d, c = _parse_line(line, line_no, self.path.name)
                labels.append(lab)
                dense.append(d)
                ids.append(c)
        if not labels:
            raise ValueError(f"{self.path}: no examples; the file is empty")
        self.dense = np.asarray(dense, dtype=np.float32)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, start: int, count: int) -> ClickLogBatch:
        idx = np.arange(start, start + count) % len(self.labels)
        return ClickLogBatch(self.dense[idx], self.ids[idx], self.labels[idx])


class PerRank:
    """A reader of this rank's own rows (text logs split into per-rank stripes by
    ``shardwise.data``) behind the job's global indexing, where rank r's part of a step starts at
    ``cursor + r * count`` and the cursor advances by ``world * count``: that is row
    ``(start - r * count) // world`` of this rank's stream.

    Example:
        >>> PerRank(SyntheticClicks(0, default_cardinalities(100)), rank=1, world=2).batch(10, 5).labels.shape
        (5,)
    """

    def __init__(self, reader, rank: int, world: int):
        self.reader, self.rank, self.world = reader, rank, world

    def batch(self, start: int, count: int) -> ClickLogBatch:
        return self.reader.batch(max(0, start - self.rank * count) // self.world, count)

    @property
    def bad_lines(self) -> int:
        return getattr(self.reader, "bad_lines", 0)


class Rows:
    """Rows [start, stop) of a finite log, cycled: what training reads when the end is held out, or
    the held-out end itself.

    Example:
        >>> data = Rows(SyntheticClicks(0, default_cardinalities(100)), 10, 14)
        >>> len(data), data.batch(3, 2).labels.shape
        (4, (2,))
    """

    def __init__(self, data, start: int, stop: int):
        if not 0 <= start < stop:
            raise ValueError(f"rows [{start}, {stop}) are empty; a held-out fraction needs a log of several rows")
        self.data, self.start, self.stop = data, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def batch(self, start: int, count: int) -> ClickLogBatch:
        n = len(self)
        idx = [self.start + (start + i) % n for i in range(count)]
        # contiguous runs, so the underlying reader serves slices
        parts, i = [], 0
        while i < count:
            j = i
            while j + 1 < count and idx[j + 1] == idx[j] + 1:
                j += 1
            parts.append(self.data.batch(idx[i], j - i + 1))
            i = j + 1
        return ClickLogBatch(np.concatenate([p.dense for p in parts]), np.concatenate([p.ids for p in parts]),
                     np.concatenate([p.labels for p in parts]))


_FULL_CHECK_BYTES = 256 << 20


def check_logs(path: str, skip_bad_lines: bool = False):
    """Before launch: the inputs exist and are what they claim (gzip, a prepared folder's manifest and
    sizes); text logs up to 256 MiB are parsed whole, so a bad line fails here rather than in the
    job (larger ones fail in the job, on every rank together). Returns the malformed lines skipped in
    the whole logs when they were read in full, else None."""
    import os

    from ..data import PreparedClickLogs, open_click_logs

    paths = [p for p in path.split(",") if p]
    reader = open_click_logs(paths, 0, 1, skip_bad_lines=skip_bad_lines, prefetch=False)
    if isinstance(reader, PreparedClickLogs) or sum(os.path.getsize(p) for p in paths) > _FULL_CHECK_BYTES:
        return None
    try:
        for _ in reader.blocks():
            pass
        reader.batch(0, 1)     # raises when the logs hold no example at all
        return reader.bad_lines   # malformed lines in the whole logs (with skip_bad_lines)
    finally:
        reader.close()


def open_data(path, seed: int, cardinalities: Sequence[int]):
    """``CriteoTSV(path)`` when a path is given, else the synthetic log for ``seed``."""
    return CriteoTSV(path) if path else SyntheticClicks(seed, cardinalities)


def to_model_inputs(batch: ClickLogBatch, cardinalities: Sequence[int], device) -> tuple:
    """(dense [n, 13] = log1p(ints), KeyedJaggedTensor of C1..C26 (missing = empty bag), labels [n]).

    Example:
        >>> cards = default_cardinalities(100); batch = SyntheticClicks(0, cards).batch(0, 4)
        >>> dense, kjt, y = to_model_inputs(batch, cards, torch.device("cpu"))
        >>> dense.shape, len(kjt.keys()), y.shape
        (torch.Size([4, 13]), 26, torch.Size([4]))
    """
    dense = torch.from_numpy(np.log1p(batch.dense)).to(device)
    # key-major layout (all bags of C1 for the batch, then C2, ...), one loop (synthetic/draw.py)
    values, lengths, offsets, per_key = bag_parts(batch.ids, cardinalities)
    # every part is consistent by construction (one bag per example and feature, its id or nothing),
    # so the KJT skips the constructor's checks: this runs on every rank at every step
    to = lambda a: torch.from_numpy(a).to(device)   # noqa: E731
    kjt = KeyedJaggedTensor._from_consistent_parts(list(SPARSE_NAMES), to(values), to(lengths), to(offsets),
                                                   per_key.tolist(), [0] + np.cumsum(per_key).tolist())
    return dense, kjt, torch.from_numpy(batch.labels).to(device)


def read_ahead(inputs_of: Callable, starts: Iterable[int], count: int, depth: int = 8) -> Iterator:
    """``inputs_of(start, count)`` for each of ``starts`` in order, made ``depth`` at a time.

    A training step evicts the reader's working set (its code, the generator's tables, numpy's and
    the KJT's Python objects) from the CPU caches, so batches made one per step cost each step a cold
    start: in the 2-rank DLRM job a synthetic batch took 0.66 ms of CPU made alone between steps and
    0.40 ms made 8 in a row. The 8 batches ahead hold ~1.4 MB at the job's default 256 per rank.

    Example:
        >>> list(read_ahead(lambda s, n: (s, n), iter([0, 8, 16]), 4, depth=2))
        [(0, 4), (8, 4), (16, 4)]
    """
    starts = iter(starts)
    while True:
        ahead = [inputs_of(s, count) for s in itertools.islice(starts, depth)]
        if not ahead:
            return
        yield from ahead


def hidden_model_logits(data: SyntheticClicks, batch: ClickLogBatch) -> np.ndarray:
    """The generator's own logits for ``batch`` (the best any model can do; for sanity checks)."""
    ids = batch.ids
    bad = (ids < -1) | (ids >= np.asarray(data.cards))
    if bad.any():
        r, j = (int(x[0]) for x in np.nonzero(bad))
        raise ValueError(f"hidden_model_logits: id {int(ids[r, j])} of {SPARSE_NAMES[j]} (row {r}) is beyond its "
                         f"table of {data.cards[j]} rows; ids must be -1 (missing) or in [0, rows): pass batches "
                         f"of this generator")
    return _logits(data, np.log1p(batch.dense), ids)


def _logits(data: SyntheticClicks, log_dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """:func:`hidden_model_logits` of ids known to be in range, with ``log1p(dense)`` given."""
    logit = data.bias + log_dense @ data.dense_w
    # every feature's effect in one gather from the tables laid end to end, each after a 0.0 that a
    # missing id (-1) reads; then added feature by feature in the order the per-feature loop used,
    # so the float64 sums and with them the labels stay bit for bit what they were (a loop of 26
    # adds is faster here than one accumulate down a [27, n] array)
    flat, offsets = data.flat_effects()
    picked = flat[(ids + offsets).T]   # [26, n]: each feature's row contiguous for its add
    for j in range(NUM_SPARSE):
        logit += picked[j]
    return logit
