"""Datasets as TorchRec's ``torchrec.datasets`` names them: :class:`RandomRecDataset`
(``torchrec.datasets.random``), :class:`Batch` (``torchrec.datasets.utils``) and the Criteo column
names (``torchrec.datasets.criteo``). shardwise's own click-log reader is :mod:`shardwise.data`.

Example:
    >>> from shardwise.datasets import DEFAULT_CAT_NAMES, RandomRecDataset
    >>> batch = next(iter(RandomRecDataset(DEFAULT_CAT_NAMES, batch_size=8, num_dense=13, manual_seed=0)))
    >>> batch.sparse_features.keys()[:2], batch.dense_features.shape
    (['cat_0', 'cat_1'], torch.Size([8, 13]))
"""

from . import criteo, random, utils
from .criteo import (
    CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES, DEFAULT_COLUMN_NAMES, DEFAULT_INT_NAMES, DEFAULT_LABEL_NAME,
    INT_FEATURE_COUNT,
)
from .random import RandomRecDataset
from .utils import Batch

__all__ = ["RandomRecDataset", "Batch", "DEFAULT_CAT_NAMES", "DEFAULT_INT_NAMES", "DEFAULT_LABEL_NAME",
           "DEFAULT_COLUMN_NAMES", "INT_FEATURE_COUNT", "CAT_FEATURE_COUNT", "criteo", "random", "utils"]
