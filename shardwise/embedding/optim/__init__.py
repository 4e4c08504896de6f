"""Fused optimizers: the sparse update rules applied to touched rows in backward, and the
``FusedOptimizer`` view of their state.

Example:
    >>> import functools, torch; from shardwise.embedding.optim import resolve_optimizer
    >>> rule, hyper = resolve_optimizer(functools.partial(torch.optim.Adagrad, lr=0.1))   # what shard() fuses
    >>> rule.name, rule.state_shapes, hyper["lr"]
    ('Adagrad', {'sum': 'elem'}, 0.1)
"""

from .fused import FusedOptimizer
from .rules import FusedRule, RowWiseAdagrad, resolve_optimizer

__all__ = ["FusedOptimizer", "FusedRule", "RowWiseAdagrad", "resolve_optimizer"]
