"""Fused optimizers: the sparse update rules applied to touched rows in backward (``rules.py``),
which table gets which (``settings.py``: ``apply_optimizer_in_backward``, ``optimizer=``,
``fused_params`` with :class:`EmbOptimType`), and the ``FusedOptimizer`` (a torch optimizer in
TorchRec's ``KeyedOptimizer`` shape) over their state.

Example:
    >>> import functools, torch; from shardwise.embedding.optim import resolve_optimizer
    >>> rule, hyper = resolve_optimizer(functools.partial(torch.optim.Adagrad, lr=0.1))   # what shard() fuses
    >>> rule.name, rule.state_shapes, hyper["lr"]
    ('Adagrad', {'sum': 'elem'}, 0.1)
"""

from .fused import FusedOptimizer
from .rules import FusedRule, RowWiseAdagrad, resolve_optimizer
from .settings import EmbOptimType, fused_params_optimizer, table_optimizers

__all__ = ["FusedOptimizer", "FusedRule", "RowWiseAdagrad", "resolve_optimizer", "EmbOptimType",
           "fused_params_optimizer", "table_optimizers"]
