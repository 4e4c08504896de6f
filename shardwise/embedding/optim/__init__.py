"""Fused optimizers: the sparse update rules applied to touched rows in backward, and the
``FusedOptimizer`` view of their state."""

from .fused import FusedOptimizer
from .rules import FusedRule, RowWiseAdagrad, resolve_optimizer

__all__ = ["FusedOptimizer", "FusedRule", "RowWiseAdagrad", "resolve_optimizer"]
