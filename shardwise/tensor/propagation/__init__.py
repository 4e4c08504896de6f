"""Sharding propagation: rule registry, op schemas and the layout chooser."""

from .propagator import Decision, choose_layout
from .registry import RULES, lookup_rule, register_rule, registered_ops
from .schema import LocalPlan, OpSchema, Strategy, TensorArg

__all__ = [
    "Decision", "choose_layout", "RULES", "lookup_rule", "register_rule", "registered_ops", "LocalPlan",
    "OpSchema", "Strategy", "TensorArg",
]
