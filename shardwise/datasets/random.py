"""TorchRec's ``RandomRecDataset`` (``torchrec.datasets.random``): random batches for a
recommendation model, reproducible with ``manual_seed``.

The draws are TorchRec's, in TorchRec's order (per key: the bag lengths, then the ids; then the
dense features, then the labels, all from one ``torch.Generator``), so a seed gives the batches
TorchRec 1.8 gives.

Example:
    >>> ds = RandomRecDataset(keys=["f1", "f2"], batch_size=4, hash_size=100, ids_per_feature=2,
    ...                       num_dense=13, manual_seed=0, num_batches=3)
    >>> len(ds), len(list(ds))
    (3, 3)
    >>> b = next(iter(ds)); b.sparse_features.lengths().tolist()    # ids_per_feature alone fixes the bags
    [2, 2, 2, 2, 2, 2, 2, 2]
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional, Sequence

import torch
from torch.utils.data import IterableDataset

from ..sparse import KeyedJaggedTensor
from .utils import Batch

__all__ = ["RandomRecDataset"]


def _per_key(name: str, many: Optional[Sequence[int]], one: Optional[int], default: int, keys: list,
             minimum: int) -> list:
    values = list(many) if many is not None else [default if one is None else one] * len(keys)
    if len(values) != len(keys):
        raise ValueError(f"RandomRecDataset: {name} has {len(values)} entries for {len(keys)} keys; give one per key")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"RandomRecDataset: {name} entry {v!r} must be an int >= {minimum}")
    return values


class _Batches:
    """The generator TorchRec's dataset iterates: ``num_generated_batches`` batches drawn up front
    and cycled (or, if negative, a new batch drawn for every step)."""

    def __init__(self, keys, batch_size, hash_sizes, ids, min_ids, num_dense, manual_seed, num_generated_batches):
        self.keys, self.batch_size, self.num_dense = keys, batch_size, num_dense
        self.hash_sizes, self.ids, self.min_ids = hash_sizes, ids, min_ids
        self.generator = None
        if manual_seed is not None:
            self.generator = torch.Generator()
            self.generator.manual_seed(manual_seed)
        self.num_generated_batches = num_generated_batches
        self.cached = [self._draw() for _ in range(num_generated_batches)]
        self.index = 0

    def __iter__(self) -> "_Batches":
        self.index = 0
        return self

    def __next__(self) -> Batch:
        if self.num_generated_batches >= 0:
            if not self.cached:
                raise StopIteration
            batch = self.cached[self.index % len(self.cached)]
        else:
            batch = self._draw()
        self.index += 1
        return batch

    def _draw(self) -> Batch:
        g, b = self.generator, self.batch_size
        values, lengths = [], []
        for hash_size, lo, hi in zip(self.hash_sizes, self.min_ids, self.ids):
            length = torch.randint(lo, hi + 1, (b,), dtype=torch.int32, generator=g)
            lengths.append(length)
            values.append(torch.randint(0, hash_size, (int(length.sum()),), generator=g))
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=torch.cat(values), lengths=torch.cat(lengths))
        dense = torch.randn(b, self.num_dense, generator=g)
        labels = torch.randint(low=0, high=2, size=(b,), generator=g)
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels)


class RandomRecDataset(IterableDataset):
    """Batches of ``batch_size`` examples: for each key in ``keys`` a bag of ``min_ids .. ids`` ids
    (uniform) below its hash size, ``num_dense`` normal dense features and 0/1 labels (int64).

    Arguments are TorchRec's: ``hash_size`` (100) or ``hash_sizes`` per key; ``ids_per_feature`` (2) or
    ``ids_per_features``; ``min_ids_per_feature`` / ``min_ids_per_features`` (default: the
    ``ids_per_feature`` given, so bags have exactly that many ids; 0 when neither is given);
    ``manual_seed`` (None draws from torch's global generator, as TorchRec does);
    ``num_batches`` (None: endless; ``len()`` needs it); ``num_generated_batches`` batches are drawn
    at construction and cycled (negative: a fresh batch every step). Each ``iter()`` starts again
    from the first cached batch; as in TorchRec, the iterators of one dataset share its position.

    Example:
        >>> def make():
        ...     return RandomRecDataset(["a"], batch_size=2, hash_sizes=[10], ids_per_features=[3],
        ...                             min_ids_per_features=[1], num_dense=1, manual_seed=3, num_batches=2)
        >>> [torch.equal(x.dense_features, y.dense_features) for x, y in zip(make(), make())]   # one seed
        [True, True]
    """

    def __init__(self, keys: Sequence[str], batch_size: int, hash_size: Optional[int] = None,
                 hash_sizes: Optional[Sequence[int]] = None, ids_per_feature: Optional[int] = None,
                 ids_per_features: Optional[Sequence[int]] = None, num_dense: int = 50,
                 manual_seed: Optional[int] = None, num_batches: Optional[int] = None,
                 num_generated_batches: int = 10, min_ids_per_feature: Optional[int] = None,
                 min_ids_per_features: Optional[Sequence[int]] = None):
        super().__init__()
        keys = list(keys)
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"RandomRecDataset: keys={keys!r} must be a non-empty list of feature names")
        for name, v in (("batch_size", batch_size), ("num_dense", num_dense)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "batch_size" else 0):
                raise ValueError(f"RandomRecDataset: {name}={v!r} must be an int >= {1 if name == 'batch_size' else 0}")
        if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 0):
            raise ValueError(f"RandomRecDataset: num_batches={num_batches!r} must be None (endless) or an int >= 0")
        hashes = _per_key("hash_sizes", hash_sizes, hash_size, 100, keys, 1)
        ids = _per_key("ids_per_features", ids_per_features, ids_per_feature, 2, keys, 0)
        low = min_ids_per_feature if min_ids_per_feature is not None else ids_per_feature
        mins = _per_key("min_ids_per_features", min_ids_per_features, low, 0, keys, 0)
        bad = [(k, lo, hi) for k, lo, hi in zip(keys, mins, ids) if lo > hi]
        if bad:
            raise ValueError(f"RandomRecDataset: (key, min ids, ids) {bad}: the minimum number of ids per bag must not "
                             f"exceed ids_per_feature(s)")
        self.num_batches = num_batches
        self.batch_generator = _Batches(keys, batch_size, hashes, ids, mins, num_dense, manual_seed,
                                        num_generated_batches)

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self.batch_generator), self.num_batches)

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("RandomRecDataset: len() needs num_batches= (the dataset is endless without it)")
        return self.num_batches
