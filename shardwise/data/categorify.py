"""Categorify: each feature's raw ids -> contiguous rows 0..K-1 by frequency, plus one rare/OOV row.

Counting is done block by block (unique ids and counts per block, merged now and then), so memory
grows with the number of distinct ids, not with the log. Ties in frequency go to the smaller raw id,
so the mapping is a pure function of the data.

Every feature's table has ``K + 1`` rows: rows ``0..K-1`` hold the ids seen at least ``min_count``
times (most frequent first), row ``K`` is shared by the ids seen fewer times *and* by every id never
seen at all (later data, a held-out file, serving). A missing id (-1) stays -1: an empty bag.

Example:
    >>> c = IdCounter(1)
    >>> c.add(np.array([[5], [7], [5], [-1]]))
    >>> m = c.mapping(min_count=2)
    >>> m[0].table_size, m[0].apply(np.array([5, 7, 8, 10**12, -1])).tolist()   # 7 rare; 8, 10**12 unseen
    (2, [0, 1, 1, 1, -1])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["IdCounter", "FeatureMapping"]


@dataclass
class FeatureMapping:
    """One feature's mapping: ``vocab[i]`` is the raw id of row i (most frequent first); every other id
    (seen fewer than ``min_count`` times, ``rare_ids`` of them, or never seen) maps to ``oov_row``.

    ``oov_row`` is ``len(vocab)`` (the last row); a vocabulary prepared before shardwise reserved that
    row for every feature has ``oov_row=None`` where it saw no rare id, and cannot map unseen ids.

    Example:
        >>> m = FeatureMapping.from_vocab(np.array([9, 3]))       # row 0 <- id 9, row 1 <- id 3
        >>> m.apply(np.array([3, 9, 8, -1])).tolist(), m.table_size
        ([1, 0, 2, -1], 3)
    """

    vocab: np.ndarray          # int64 [K], raw ids in row order
    rare_ids: int = 0          # distinct ids sent to the shared row when the mapping was counted
    oov_row: "int | None" = -2   # -2: len(vocab) (set in __post_init__)
    _sorted: np.ndarray = field(default=None, repr=False)         # vocab, ascending (for searchsorted)
    _row_of_sorted: np.ndarray = field(default=None, repr=False)

    def __post_init__(self):
        self.vocab = np.ascontiguousarray(self.vocab, dtype=np.int64)
        if self.oov_row == -2:
            self.oov_row = len(self.vocab)
        order = np.argsort(self.vocab, kind="stable")
        self._sorted, self._row_of_sorted = self.vocab[order], order.astype(np.int64)

    @classmethod
    def from_vocab(cls, vocab: np.ndarray, rare_ids: int = 0) -> "FeatureMapping":
        """The mapping whose row i holds raw id ``vocab[i]``; every other id -> row ``len(vocab)``."""
        return cls(np.asarray(vocab, dtype=np.int64), int(rare_ids))

    @property
    def table_size(self) -> int:
        """Rows the feature's table needs: the vocabulary plus the rare/OOV row."""
        return len(self.vocab) + (0 if self.oov_row is None else 1)

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """Raw ids (-1 = missing, kept) -> rows; an id not in the vocabulary -> ``oov_row``.

        Vectorised: one ``searchsorted`` over the sorted vocabulary and one comparison per id.
        """
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.shape, -1, dtype=np.int64)
        present = ids >= 0
        x = ids[present]
        k = len(self._sorted)
        if k:
            pos = np.minimum(np.searchsorted(self._sorted, x), k - 1)
            hit = self._sorted[pos] == x
            rows = self._row_of_sorted[pos]
        else:
            hit, rows = np.zeros(len(x), bool), np.zeros(len(x), np.int64)
        if self.oov_row is None and not hit.all():
            bad = int(x[~hit][0])
            raise ValueError(f"raw id {bad:#x} is not in this vocabulary, which has no out-of-vocabulary row (it "
                             f"was prepared by an older shardwise); prepare the training data again with "
                             f"`shardwise data prepare ... --categorify`")
        out[present] = np.where(hit, rows, -1 if self.oov_row is None else self.oov_row)
        return out

    def count_oov(self, ids: np.ndarray) -> int:
        """How many present ids of ``ids`` are not in the vocabulary (they read the OOV row)."""
        rows = self.apply(ids)
        return int((rows == self.oov_row).sum()) if self.oov_row is not None else 0


class IdCounter:
    """Counts of every raw id per feature, fed block by block (``add(ids [n, features])``).

    Example: see the module's.
    """

    def __init__(self, num_features: int):
        self.num_features = num_features
        self._merged = [(np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in range(num_features)]
        self._pending: list[list] = [[] for _ in range(num_features)]
        self._pending_len = [0] * num_features

    def add(self, ids: np.ndarray) -> None:
        for j in range(self.num_features):
            col = ids[:, j]
            u, c = np.unique(col[col >= 0], return_counts=True)
            self._pending[j].append((u, c))
            self._pending_len[j] += len(u)
            # merge when the pending uniques outgrow the merged table: amortised O(total) work
            if self._pending_len[j] > max(len(self._merged[j][0]), 1 << 18):
                self._merge(j)

    def _merge(self, j: int) -> None:
        parts = [self._merged[j], *self._pending[j]]
        u = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        uniq, inverse = np.unique(u, return_inverse=True)
        self._merged[j] = (uniq, np.bincount(inverse, weights=c, minlength=len(uniq)).astype(np.int64))
        self._pending[j], self._pending_len[j] = [], 0

    def counts(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(distinct raw ids ascending, their counts) of feature j."""
        self._merge(j)
        return self._merged[j]

    def mapping(self, min_count: int) -> list[FeatureMapping]:
        """One ``FeatureMapping`` per feature: rows by descending count, rare and unseen ids in the last row."""
        if not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count={min_count!r} must be an int >= 1 (ids seen fewer times share one row)")
        out = []
        for j in range(self.num_features):
            uniq, counts = self.counts(j)
            order = np.lexsort((uniq, -counts))       # most frequent first, ties by raw id
            k = int((counts >= min_count).sum())
            out.append(FeatureMapping.from_vocab(uniq[order][:k], len(uniq) - k))
        return out
