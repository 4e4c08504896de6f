"""The op -> sharding rule table, filled by decorators in ``shardwise/tensor/ops/*/``.

A rule describes one mesh dimension: ``rule(schema, mesh_size) -> list[Strategy]``. The propagator
applies it to every mesh dimension and picks the cheapest strategy per dimension. An optional
``local`` hook adjusts the local call for the chosen layout (sizes of a view, a custom kernel).

>>> import torch
>>> import shardwise.tensor   # its ops/ register the rules
>>> lookup_rule(torch.ops.aten.relu.default).rule.__name__
'nonlinear_rule'
>>> @register_rule(aten.relu.default, pointwise=True)   # it would replace that rule   # doctest: +SKIP
... def relu_rule(schema, mesh_size):
...     return [Strategy((Shard(0),), (Shard(0),)), Strategy((Replicate(),), (Replicate(),))]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["RuleEntry", "RULES", "register_rule", "lookup_rule", "registered_ops", "is_out_variant"]


@dataclass(frozen=True)
class RuleEntry:
    rule: Callable
    local: Optional[Callable] = None
    # scalars do not change the decision (pointwise/foreach ops): keep their values out of the cache
    # key, so e.g. a new learning rate every step does not miss the cache
    scalar_insensitive: bool = False
    # the rule decides the whole N-D layout itself (e.g. per-element foreach ops)
    whole_mesh: bool = False


class _Rules(dict):
    """op overload -> RuleEntry. A process-wide table of pure functions (it holds no mesh or group)."""


RULES: _Rules = _Rules()


def register_rule(*ops, local=None, pointwise: bool = False, whole_mesh: bool = False):
    """Register ``fn`` as the sharding rule of ``ops`` (aten overloads or overload packets)."""

    def deco(fn):
        entry = RuleEntry(fn, local, pointwise, whole_mesh)
        for op in ops:
            if hasattr(op, "overloads"):  # an OpOverloadPacket: every functional/in-place overload
                for name in op.overloads():
                    ov = getattr(op, name)
                    if _takes_tensors(ov) and not is_out_variant(ov):
                        RULES[ov] = entry
            else:
                RULES[op] = entry
        return fn

    return deco


def _takes_tensors(ov) -> bool:
    # out= variants write into given tensors and scalar overloads (add.int) never see a DTensor
    return any("Tensor" in str(a.type) for a in ov._schema.arguments)


def is_out_variant(ov) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in ov._schema.arguments)


def lookup_rule(op) -> Optional[RuleEntry]:
    return RULES.get(op)


def registered_ops() -> list:
    return sorted(RULES, key=str)
