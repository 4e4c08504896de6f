"""The Criteo click-log column names as TorchRec's ``torchrec.datasets.criteo`` names them.

shardwise's own Criteo reader (:mod:`shardwise.data`, ``shardwise data prepare``) names the columns
``I1..I13`` / ``C1..C26``; these are TorchRec's names for scripts written against TorchRec.

Example:
    >>> DEFAULT_INT_NAMES[:2], DEFAULT_CAT_NAMES[-1], DEFAULT_LABEL_NAME
    (['int_0', 'int_1'], 'cat_25', 'label')
"""

from __future__ import annotations

__all__ = ["INT_FEATURE_COUNT", "CAT_FEATURE_COUNT", "DEFAULT_LABEL_NAME", "DEFAULT_INT_NAMES", "DEFAULT_CAT_NAMES",
           "DEFAULT_COLUMN_NAMES"]

INT_FEATURE_COUNT = 13
CAT_FEATURE_COUNT = 26
DEFAULT_LABEL_NAME = "label"
DEFAULT_INT_NAMES = [f"int_{i}" for i in range(INT_FEATURE_COUNT)]
DEFAULT_CAT_NAMES = [f"cat_{i}" for i in range(CAT_FEATURE_COUNT)]
DEFAULT_COLUMN_NAMES = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]
