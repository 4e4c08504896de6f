"""Convolution, pooling, upsampling, padding and batch/group norm: batch-sharded where valid.

Ops over the trailing spatial dims of (N, C, *spatial) tensors work image by image and channel by
channel, so any leading (batch or channel) dim may stay sharded and the spatial dims are replicated.
Convolution mixes channels: batch-sharded (weights replicated; a batch-sharded backward leaves
pending weight gradients), or output-channel-sharded with a sharded weight. Batch norm normalises
each channel over the batch: channel-sharded. Group norm normalises each sample: batch-sharded, with
the batch size argument made the local one.
"""

from __future__ import annotations

from math import prod

from torch.ops import aten

from ...placements import Shard
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy, TensorArg
from ..common import PSUM, R, named_arg

__all__ = ["SPATIAL_DIMS"]

# op -> how many trailing dims it works across (the rest may stay sharded)
SPATIAL_DIMS = {
    **{getattr(aten, f"{n}{k}d").default: k for k in (1, 2, 3)
       for n in ("upsample_nearest", "_upsample_nearest_exact", "reflection_pad", "replication_pad")},
    **{getattr(aten, f"{n}{k}d").vec: k for k in (1, 2, 3) for n in ("upsample_nearest", "_upsample_nearest_exact")},
    **{getattr(aten, f"{n}_backward").default: k for k in (1, 2, 3) for n in (f"reflection_pad{k}d", f"replication_pad{k}d")},
    **{getattr(aten, f"avg_pool{k}d").default: k for k in (2, 3)},
    **{getattr(aten, f"avg_pool{k}d_backward").default: k for k in (2, 3)},
    **{getattr(aten, f"max_pool{k}d_with_indices").default: k for k in (2, 3)},
    **{getattr(aten, f"max_pool{k}d_with_indices_backward").default: k for k in (2, 3)},
    **{getattr(aten, f"_adaptive_avg_pool{k}d").default: k for k in (2, 3)},
    **{getattr(aten, f"_adaptive_avg_pool{k}d_backward").default: k for k in (2, 3)},
    **{getattr(aten, f"adaptive_max_pool{k}d").default: k for k in (2, 3)},
    **{getattr(aten, f"adaptive_max_pool{k}d_backward").default: k for k in (2, 3)},
    aten.avg_pool1d.default: 1, aten.adaptive_max_pool1d.default: 1,
    aten.upsample_linear1d.default: 1, aten.upsample_linear1d.vec: 1,
    aten.upsample_bilinear2d.default: 2, aten.upsample_bilinear2d.vec: 2,
    aten.upsample_bicubic2d.default: 2, aten.upsample_bicubic2d.vec: 2,
    aten._upsample_bilinear2d_aa.default: 2, aten._upsample_bicubic2d_aa.default: 2,
    aten.upsample_trilinear3d.default: 3, aten.upsample_trilinear3d.vec: 3,
    aten.max_unpool2d.default: 2, aten.max_unpool3d.default: 3,
    aten.pixel_shuffle.default: 3, aten.pixel_unshuffle.default: 3, aten.channel_shuffle.default: 3,
}


def spatial_rule(schema, mesh_size):
    """Every tensor of the input's rank sharded alike on a leading dim; other tensors replicated."""
    k = SPATIAL_DIMS[schema.op]
    x = max(schema.tensor_args, key=lambda t: t.ndim)
    n_in, n_out = len(schema.tensor_args), schema.num_outputs
    st = [Strategy((R,) * n_out, (R,) * n_in)]
    for d in range(x.ndim - k):
        # the CPU kernels refuse an empty channel (and some an empty batch): even shards only
        if x.shape[d] % prod(schema.mesh_shape or (mesh_size,)):
            continue
        ins = tuple(Shard(d) if t.ndim == x.ndim else R for t in schema.tensor_args)
        st.append(Strategy((Shard(d),) * n_out, ins))
    return st


register_rule(*SPATIAL_DIMS)(spatial_rule)


def _batched(schema) -> bool:
    x, w = schema.tensor_args[0], schema.tensor_args[1]
    return x.ndim == w.ndim


@register_rule(aten.convolution.default)
def convolution_rule(schema, mesh_size):
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    n = len(schema.tensor_args)
    rest = (R,) * (n - 2)
    st = [Strategy((R,), (R,) * n)]
    if not _batched(schema):
        return st
    st.append(Strategy((Shard(0),), (Shard(0), R) + rest))
    even_out = schema.tensor_args[1].shape[0] % prod(schema.mesh_shape or (mesh_size,)) == 0
    if named_arg(schema, "groups", 1) == 1 and not named_arg(schema, "transposed", False) and even_out:
        st.append(Strategy((Shard(1),), (R, Shard(0)) + (Shard(0),) * (n - 2)))  # output channels
    if n == 2:  # no bias: linear in the input alone and in the weight alone
        st += [Strategy((PSUM,), (PSUM, R)), Strategy((PSUM,), (R, PSUM))]
    return st


@register_rule(aten.convolution_backward.default)
def convolution_backward_rule(schema, mesh_size):
    # (grad_output, input, weight, bias_sizes, ...) -> (grad_input, grad_weight, grad_bias)
    st = [Strategy((R, R, R), (R, R, R))]
    if schema.tensor_args[1].ndim == schema.tensor_args[2].ndim:
        st.append(Strategy((Shard(0), PSUM, PSUM), (Shard(0), Shard(0), R)))
    return st


def _channel_layout(schema) -> tuple:
    x = schema.tensor_args[0]
    return tuple(Shard(1) if t.ndim == x.ndim else Shard(0) if t.ndim == 1 and t.shape[0] == x.shape[1] else R
                 for t in schema.tensor_args)


@register_rule(aten.native_batch_norm.default, aten._native_batch_norm_legit.default,
               aten._native_batch_norm_legit.no_stats, aten._native_batch_norm_legit_no_training.default,
               aten._batch_norm_with_update.default, aten.native_batch_norm_backward.default,
               aten.batch_norm_backward.default)
def batch_norm_rule(schema, mesh_size):
    # statistics per channel (dim 1): channel-sharded inputs, running stats and outputs
    x = schema.tensor_args[0]
    st = [Strategy((R,) * schema.num_outputs, (R,) * len(schema.tensor_args))]
    # a rank with no channels would make the CPU kernel divide by zero (SIGFPE): even shards only
    if x.ndim < 2 or x.shape[1] % prod(schema.mesh_shape or (mesh_size,)):
        return st
    outs = tuple(None if o is None else Shard(1) if o.ndim == x.ndim else Shard(0) if o.ndim == 1 and
                 o.shape[0] == x.shape[1] else R for o in schema.outputs)
    st.append(Strategy(outs, _channel_layout(schema)))
    return st


def _group_norm_local(n_arg: int):
    # the batch size is an argument: a batch-sharded call passes its own. The CPU backward kernel
    # returns NaN for a stride-0 gradient (the expanded ones of a .sum()): it gets a contiguous one
    def kernel(op, args, kwargs):
        return op(args[0].contiguous(), *args[1:], **kwargs)

    def local(schema, decision, out_specs, mesh, coord):
        backward = schema.op is aten.native_group_norm_backward.default
        if all(type(p) is not Shard for p in out_specs[0].placements):
            return LocalPlan(kernel=kernel) if backward else None
        return LocalPlan(arg_subs={n_arg: out_specs[0].local_shape(coord)[0]}, kernel=kernel if backward else None)

    return local


@register_rule(aten.native_group_norm.default, local=_group_norm_local(3))
def group_norm_rule(schema, mesh_size):
    # (input, weight, bias, N, C, HxW, group, eps) -> (out, mean[N, G], rstd[N, G])
    n = len(schema.tensor_args)
    st = [Strategy((R, R, R), (R,) * n)]
    return st + [Strategy((Shard(0),) * 3, (Shard(0),) + (R,) * (n - 1))]


@register_rule(aten.native_group_norm_backward.default, local=_group_norm_local(5))
def group_norm_backward_rule(schema, mesh_size):
    # (grad_out, input, mean, rstd, weight, N, C, HxW, group, mask) -> (dx, dweight, dbias)
    st = [Strategy((R, R, R), (R,) * len(schema.tensor_args))]
    ins = tuple(R if i >= 4 or not isinstance(t, TensorArg) else Shard(0) for i, t in enumerate(schema.tensor_args))
    return st + [Strategy((Shard(0), PSUM, PSUM), ins)]
