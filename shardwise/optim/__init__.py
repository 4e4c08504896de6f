"""TorchRec's ``torchrec.optim`` names: keyed optimizers (one object for a whole model's fused and
dense optimizers), ``RowWiseAdagrad``, ``apply_optimizer_in_backward`` and
``in_backward_optimizer_filter``. Model-generic (no embedding code here); the fused embedding
optimizer itself lives in ``shardwise.embedding.optim`` and is a :class:`KeyedOptimizer`.

Example:
    >>> import torch
    >>> from shardwise.optim import KeyedOptimizerWrapper, in_backward_optimizer_filter
    >>> lin = torch.nn.Linear(2, 1)
    >>> dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(lin.named_parameters())),
    ...                               lambda ps: torch.optim.Adam(ps, lr=1e-3))
    >>> sorted(dense.params)
    ['bias', 'weight']
"""

from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

from .keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from .optimizers import in_backward_optimizer_filter
from .rowwise_adagrad import RowWiseAdagrad

__all__ = ["KeyedOptimizer", "CombinedOptimizer", "KeyedOptimizerWrapper", "in_backward_optimizer_filter",
           "RowWiseAdagrad", "apply_optimizer_in_backward"]
