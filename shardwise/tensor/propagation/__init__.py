"""Sharding propagation: rule registry, op schemas and the layout chooser.

Example:
    >>> import torch, shardwise.tensor   # shardwise.tensor's ops/ register the rules
    >>> from shardwise.tensor.propagation import lookup_rule, registered_ops
    >>> torch.ops.aten.mm.default in registered_ops(), lookup_rule(torch.ops.aten.mm.default) is not None
    (True, True)
"""

from .propagator import Decision, choose_layout
from .registry import RULES, lookup_rule, register_rule, registered_ops
from .schema import LocalPlan, OpSchema, Strategy, TensorArg

__all__ = [
    "Decision", "choose_layout", "RULES", "lookup_rule", "register_rule", "registered_ops", "LocalPlan",
    "OpSchema", "Strategy", "TensorArg",
]
