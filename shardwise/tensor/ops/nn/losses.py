"""Elementwise losses as ops (mse, l1/huber/smooth-l1, soft-margin, binary cross-entropy with and
without logits) and their backward ops.

``reduction='none'`` is pointwise. ``sum`` over a sharded dim leaves a pending sum; ``mean`` a pending
average when every rank holds as many elements (even shards at every mesh level), else the dim is
replicated first. The backward of ``mean`` scales by the element count its kernel sees: a shard would
scale by its own count, so it runs on replicated inputs.
"""

from __future__ import annotations

from math import prod

from torch.ops import aten

from ...placements import Partial, Shard
from ...propagation.registry import register_rule
from ...propagation.schema import Strategy
from ..common import R, broadcast_placement, named_arg, pointwise_strategies

__all__ = ["FORWARD", "BACKWARD"]

FORWARD = [aten.mse_loss.default, aten.huber_loss.default, aten.smooth_l1_loss.default,
           aten.soft_margin_loss.default, aten.binary_cross_entropy.default,
           aten.binary_cross_entropy_with_logits.default]
BACKWARD = [aten.mse_loss_backward.default, aten.huber_loss_backward.default,
            aten.smooth_l1_loss_backward.default, aten.soft_margin_loss_backward.default,
            aten.binary_cross_entropy_backward.default]
_NONE, _MEAN, _SUM = 0, 1, 2


@register_rule(*FORWARD)
def loss_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    reduction = named_arg(schema, "reduction", _MEAN)
    if reduction == _NONE:
        return pointwise_strategies(schema)
    n = len(schema.tensor_args)
    st = [Strategy((R,), (R,) * n)]
    for d in range(x.ndim):
        if reduction == _MEAN and x.shape[d] % prod(schema.mesh_shape or (mesh_size,)):
            continue
        ins = tuple(broadcast_placement(Shard(d), ta, x.shape) for ta in schema.tensor_args)
        st.append(Strategy((Partial("avg" if reduction == _MEAN else "sum"),), ins))
    return st


@register_rule(*BACKWARD)
def loss_backward_rule(schema, mesh_size):
    # (grad_output, self, target, [weight,] ...): grad_output is 0-d unless reduction is none
    x = schema.tensor_args[1]
    reduction = named_arg(schema, "reduction", _MEAN)
    n = len(schema.tensor_args)
    st = [Strategy((R,), (R,) * n)]
    if reduction == _MEAN:
        return st
    for d in range(x.ndim):
        st.append(Strategy((Shard(d),), tuple(broadcast_placement(Shard(d), ta, x.shape) if ta.ndim else R
                                              for ta in schema.tensor_args)))
    return st
