"""Categorify: each feature's raw ids -> contiguous rows 0..K-1 by frequency, rare ids -> one bucket.

Counting is done block by block (unique ids and counts per block, merged now and then), so memory
grows with the number of distinct ids, not with the log. Ties in frequency go to the smaller raw id,
so the mapping is a pure function of the data.

Example:
    >>> c = IdCounter(1)
    >>> c.add(np.array([[5], [7], [5], [-1]]))
    >>> m = c.mapping(min_count=2)
    >>> m[0].table_size, m[0].apply(np.array([5, 7, -1])).tolist()
    (2, [0, 1, -1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["IdCounter", "FeatureMapping"]


@dataclass
class FeatureMapping:
    """One feature's mapping: ``vocab[i]`` is the raw id of row i (most frequent first); ids seen fewer
    than ``min_count`` times share row ``len(vocab)`` when there are any (``rare_ids`` of them).

    Example: see the module's.
    """

    vocab: np.ndarray          # int64 [K], raw ids in row order
    rare_ids: int              # distinct ids sent to the shared bucket
    _sorted: np.ndarray        # raw ids, ascending (for searchsorted)
    _row_of_sorted: np.ndarray

    @property
    def table_size(self) -> int:
        """Rows the feature's table needs (at least 1: a feature with no ids still gets a table)."""
        return max(len(self.vocab) + (1 if self.rare_ids else 0), 1)

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """Raw ids (-1 = missing, kept) -> rows."""
        out = np.full(ids.shape, -1, dtype=np.int64)
        present = ids >= 0
        if len(self._sorted):
            out[present] = self._row_of_sorted[np.searchsorted(self._sorted, ids[present])]
        return out


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
        """One ``FeatureMapping`` per feature: rows by descending count, rare ids in one bucket."""
        if not isinstance(min_count, int) or min_count < 1:
            raise ValueError(f"min_count={min_count!r} must be an int >= 1 (ids seen fewer times share one row)")
        out = []
        for j in range(self.num_features):
            uniq, counts = self.counts(j)
            order = np.lexsort((uniq, -counts))       # most frequent first, ties by raw id
            frequent = counts[order] >= min_count
            k = int(frequent.sum())
            row = np.empty(len(uniq), dtype=np.int64)
            row[order] = np.where(frequent, np.arange(len(uniq)), k)
            out.append(FeatureMapping(uniq[order][:k].copy(), len(uniq) - k, uniq, row))
        return out
