"""A drift of the synthetic click log: from one step on, some features carry several ids per example.

This is what a product launch does to a live job: a new surface starts logging, say, the last items
a user saw, and a few features that held one id per example now hold many. The tables behind those
features get several times the lookups, and a plan made at start-up for one id per bag leaves the
ranks that hold them the slowest: the situation a live reshard exists for (docs/reshard.md).

``shardwise train --drift-at STEP`` turns it on (``make demo`` does; it is off by default, so
benchmarks and golden values keep the plain stream). From example ``start`` on (the first example of
step ``STEP``), each example's id of every drifted feature is joined by ``factor - 1`` more ids drawn
from the same power law, each sub-block of 256 examples from its own seed, so every rank, world
size and resumed run sees the same ids. After the drift, a drifted feature acts on the label
through the mean hidden effect of its ids (before it, of its one id), so the model can still learn it.

Example:
    >>> from shardwise.train.data import SyntheticClicks, default_cardinalities
    >>> cards = default_cardinalities(1000)
    >>> log = DriftingClicks(SyntheticClicks(0, cards), start=512, features=["C3"], factor=4)
    >>> before, after = log.batch(0, 256), log.batch(512, 256)
    >>> int((before.extra >= 0).sum()), int((after.extra >= 0).sum())   # 3 more ids per example after
    (0, 768)
    >>> _, kjt, _ = log.model_inputs(512, 2, cards, torch.device("cpu"))
    >>> kjt.length_per_key()[2], kjt.length_per_key()[3]               # C3: 2 examples x 4 ids; C4: 2 x 1
    (8, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ...sparse import KeyedJaggedTensor
from ..data import NUM_SPARSE, SPARSE_NAMES, hidden_model_logits

__all__ = ["DriftingClicks", "DriftedBatch", "DRIFT_FEATURES", "DRIFT_FACTOR"]

# four mid-sized features: the demo's start-up plan puts them on the same rank, as a plan made
# before a launch would (nothing told the planner they would grow)
DRIFT_FEATURES = ("C3", "C7", "C11", "C15")
DRIFT_FACTOR = 128
_SUB_BLOCK = 256
_CACHED = 9


@dataclass
class DriftedBatch:
    """A batch of the log (``dense``, ``ids``, ``labels`` as the plain log's) plus ``extra``: int64
    [n, drifted features, factor - 1], the added ids of each drifted feature (-1: none, before the drift)."""

    dense: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    extra: np.ndarray


class DriftingClicks:
    """The synthetic log ``base`` with ``features`` drifting to ``factor`` ids per example from example
    ``start`` on. Reads as the base log does (``batch(start, count)``); :meth:`model_inputs` gives the
    model's inputs with the extra ids in each drifted feature's bags."""

    def __init__(self, base, start: int, features: Sequence[str] = DRIFT_FEATURES, factor: int = DRIFT_FACTOR):
        unknown = [f for f in features if f not in SPARSE_NAMES]
        if unknown or not features:
            raise ValueError(f"drift features {list(features)!r}: {unknown or 'none given'} not among C1..C26; "
                             f"e.g. {','.join(DRIFT_FEATURES)}")
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
            raise ValueError(f"drift factor={factor!r} must be an int >= 2 (ids per example after the drift)")
        if not isinstance(start, int) or start < 0:
            raise ValueError(f"drift start={start!r} must be an example index >= 0")
        self.base, self.start, self.factor = base, start, factor
        self.features = [SPARSE_NAMES.index(f) for f in features]
        self._cards = np.asarray([base.cards[j] for j in self.features], dtype=np.float64)
        self._cache: dict = {}

    @property
    def cards(self) -> list:
        return self.base.cards

    def _block(self, index: int) -> tuple:
        """(extra ids, labels) of examples ``index * 256 ..`` as if every one of them had drifted: each
        drifted feature's effect on the label is the mean hidden effect of its ids (the base log's
        model with one id per bag is the mean of one), so the job stays learnable."""
        if index not in self._cache:
            rng = np.random.default_rng(np.random.SeedSequence([self.base.seed, 0xD21F7, index]))
            u = rng.random((_SUB_BLOCK, len(self.features), self.factor - 1))
            # the base log's Zipf(1) law, per drifted feature (row k with probability ~ 1/(k+1))
            ids = np.floor(np.exp(u * np.log(self._cards + 1.0)[:, None])) - 1.0
            extra = np.minimum(ids, self._cards[:, None] - 1).astype(np.int64)
            base = self.base.batch(index * _SUB_BLOCK, _SUB_BLOCK)
            logit = hidden_model_logits(self.base, base)
            for k, j in enumerate(self.features):
                eff = self.base.effects[j]
                own = np.where(base.ids[:, j] >= 0, eff[np.maximum(base.ids[:, j], 0)], 0.0)
                count = (base.ids[:, j] >= 0) + (self.factor - 1)
                logit += (own + eff[extra[:, k]].sum(axis=1)) / count - own
            labels = (rng.random(_SUB_BLOCK) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
            if len(self._cache) >= _CACHED:
                self._cache.pop(next(iter(self._cache)))
            self._cache[index] = (extra, labels)
        return self._cache[index]

    def batch(self, start: int, count: int) -> DriftedBatch:
        """Examples ``start .. start+count-1``: the base log's, with their extra ids and (after the
        drift) their labels drawn from the drifted model."""
        b = self.base.batch(start, count)
        extra = np.full((count, len(self.features), self.factor - 1), -1, dtype=np.int64)
        labels = b.labels.copy()
        pos = max(start, self.start)
        while pos < start + count:
            blk, off = divmod(pos, _SUB_BLOCK)
            take = min(_SUB_BLOCK - off, start + count - pos)
            ids, lab = self._block(blk)
            extra[pos - start:pos - start + take] = ids[off:off + take]
            labels[pos - start:pos - start + take] = lab[off:off + take]
            pos += take
        return DriftedBatch(b.dense, b.ids, labels, extra)

    def model_inputs(self, start: int, count: int, cardinalities: Sequence[int], device) -> tuple:
        """(dense [n, 13] = log1p(ints), KeyedJaggedTensor of C1..C26, labels [n]) for examples
        ``start ..``: each bag holds the example's id (none if missing) and, for a drifted feature
        after the drift, its extra ids."""
        return self.inputs_of(self.batch(start, count), cardinalities, device)

    def inputs_of(self, b, cardinalities: Sequence[int], device) -> tuple:
        """The model inputs of batch ``b`` (as :meth:`model_inputs`); a plain batch (no ``extra``, e.g. the
        empty rows evaluation pads with) has no extra ids."""
        drifted = {j: k for k, j in enumerate(self.features)} if hasattr(b, "extra") else {}
        values, lengths = [], []
        for j in range(NUM_SPARSE):   # key-major: every bag of C1 for the batch, then C2, ...
            ids = b.ids[:, j:j + 1]
            if j in drifted:
                ids = np.concatenate([ids, b.extra[:, drifted[j]]], axis=1)
            present = ids >= 0
            values.append(ids[present] % cardinalities[j])
            lengths.append(present.sum(axis=1))
        kjt = KeyedJaggedTensor(SPARSE_NAMES, torch.from_numpy(np.concatenate(values)).to(device),
                                lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int64)).to(device))
        dense = torch.from_numpy(np.log1p(b.dense)).to(device)
        return dense, kjt, torch.from_numpy(b.labels).to(device)
