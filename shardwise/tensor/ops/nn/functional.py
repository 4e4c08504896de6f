"""Neural-net ops: softmax/log_softmax, nll_loss (cross-entropy), layer_norm — forward and backward."""

from __future__ import annotations

import torch
from torch.ops import aten

from ...collectives import all_reduce
from ...placements import Partial, Shard
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy, TensorArg
from ..common import PSUM, R, normalize_dim


@register_rule(aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
               aten._log_softmax_backward_data.default, aten._safe_softmax.default)
def softmax_rule(schema, mesh_size):
    # softmax couples every element along `dim`; any other dim may stay sharded
    n_in = len(schema.tensor_args)
    x = schema.tensor_args[-1] if n_in == 2 else schema.tensor_args[0]
    dim = normalize_dim(schema.args[n_in], x.ndim)
    st = [Strategy((R,), (R,) * n_in)]
    st += [Strategy((Shard(d),), (Shard(d),) * n_in) for d in range(x.ndim) if d != dim]
    return st


# --- nll_loss ---------------------------------------------------------------------------------

def _by_arg(schema, mapping) -> tuple:
    """Placements for each tensor arg from {arg position: placement}; other tensors replicated."""
    out = []
    for ta in schema.tensor_args:
        pos = next(i for i, a in enumerate(schema.args) if a is ta) if ta in schema.args else -1
        out.append(mapping.get(pos, R))
    return tuple(out)


def nll_forward_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    reduction = schema.args[3]
    st = [Strategy((R, R), _by_arg(schema, {}))]
    if x.ndim >= 2:  # batch-sharded input and target (nll_loss2d: images of class scores too)
        ins = _by_arg(schema, {0: Shard(0), 1: Shard(0)})
        if reduction == 0:
            st.append(Strategy((Shard(0), R), ins))
        elif reduction == 2:
            st.append(Strategy((PSUM, PSUM), ins))
        else:  # mean: local sums over the global weight (see _nll_local)
            st.append(Strategy((PSUM, R), ins))
    return st


def _nll_local(schema, decision, out_specs, mesh, coord):
    in_pl = decision.inputs[0] or schema.tensor_args[0].placements
    if schema.args[3] != 1 or all(type(p) is not Shard for p in in_pl):
        return None
    mesh_dims = [m for m, p in enumerate(in_pl) if type(p) is Shard]

    def kernel(op, args, kwargs):
        x, target, weight, _, ignore_index = args[:5]
        total, tw = op(x, target, weight, 2, ignore_index)
        for m in mesh_dims:  # the weight of the whole batch, the same on every rank
            tw = all_reduce(tw, "sum", mesh, m)
        return total / tw, tw

    return LocalPlan(kernel=kernel)


register_rule(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default, local=_nll_local)(nll_forward_rule)


@register_rule(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_backward_rule(schema, mesh_size):
    # (grad_output, self, target, weight, reduction, ignore_index, total_weight)
    reduction = schema.args[4]
    st = [Strategy((R,), _by_arg(schema, {}))]
    if schema.args[1].ndim >= 2:
        g = Shard(0) if reduction == 0 else R
        st.append(Strategy((Shard(0),), _by_arg(schema, {0: g, 1: Shard(0), 2: Shard(0)})))
    return st


# --- layer_norm -------------------------------------------------------------------------------

@register_rule(aten.native_layer_norm.default)
def layer_norm_rule(schema, mesh_size):
    # (input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)
    x = schema.args[0]
    lead = x.ndim - len(schema.args[1])
    st = [Strategy((R, R, R), _by_arg(schema, {}))]
    for d in range(lead):
        st.append(Strategy((Shard(d),) * 3, _by_arg(schema, {0: Shard(d)})))
    return st


@register_rule(aten.native_layer_norm_backward.default)
def layer_norm_backward_rule(schema, mesh_size):
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, mask) -> (dx, dweight, dbias)
    x = schema.args[1]
    lead = x.ndim - len(schema.args[2])
    n_out = schema.num_outputs
    st = [Strategy((R,) * n_out, _by_arg(schema, {}))]
    for d in range(lead):
        ins = _by_arg(schema, {0: Shard(d), 1: Shard(d), 3: Shard(d), 4: Shard(d)})
        st.append(Strategy((Shard(d),) + (PSUM,) * (n_out - 1), ins))
    return st
