"""Random ops (dropout, bernoulli, uniform_/normal_ and the other in-place samplers, rand_like & co.).

A sharded random op gives each rank its slice of the tensor the unsharded op would give with the same
generator state, and leaves every rank's generator where the unsharded op would. So a sharded
DTensor's values are distinct per shard, a replicated one's are identical on every rank, and a
sharded model draws exactly what the same model on one process draws (the ground truth every test
compares against). Generators in sync across ranks (``torch.manual_seed`` with one seed everywhere)
remain the caller's contract, as with PyTorch's DTensor.

On a ``Shard`` layout each rank draws the whole tensor's random numbers (the cost of one unsharded
call) and keeps its slice: CPU generators cannot skip ahead, and that is the only way the values
match the unsharded op on every device. PyTorch's DTensor on CPU runs the op on each local piece, so
with one seed everywhere all shards repeat the same values (its offset-based tracker, CUDA only,
gives distinct ones); on replicated inputs the two agree value for value.

>>> import torch.nn.functional as F; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
>>> x = distribute_tensor(torch.ones(8, 4), init_device_mesh("cpu", (1,)), [Shard(0)])
>>> _ = torch.manual_seed(0); y = F.dropout(x, 0.5)
>>> _ = torch.manual_seed(0); ref = F.dropout(torch.ones(8, 4), 0.5)
>>> torch.equal(y.full_tensor(), ref)
True
"""

from __future__ import annotations

import torch
from torch.ops import aten

from ...placements import Shard
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy
from ..common import ALL_PARTIALS, R

# ops that draw into (or like) their first tensor; their other arguments are scalars, so values drawn
# depend only on the first tensor's shape, dtype and device, never on its values
_INPLACE = [
    aten.uniform_.default, aten.normal_.default, aten.bernoulli_.float, aten.log_normal_.default,
    aten.exponential_.default, aten.geometric_.default, aten.cauchy_.default, aten.random_.default,
    getattr(aten.random_, "from"), aten.random_.to,
]
_LIKE = [
    aten.rand_like.default, aten.randn_like.default, aten.randint_like.default, aten.randint_like.low_dtype,
    aten.bernoulli.p,
]
# the draws depend on the input's values (probabilities): gathered and drawn whole on every rank
_VALUE_DEPENDENT = [aten.bernoulli.default, aten.bernoulli_.Tensor]


def _follow_input(schema, partials=()) -> list[Strategy]:
    n, ndim = schema.num_outputs, schema.tensor_args[0].ndim
    strategies = [Strategy((R,) * n, (R,))]
    strategies += [Strategy((Shard(d),) * n, (Shard(d),)) for d in range(ndim)]
    # a new random tensor inherits no pending reduction: every rank draws the same whole tensor
    strategies += [Strategy((R,) * n, (p,)) for p in partials]
    return strategies


def _slice_of(spec, coord) -> tuple:
    shape, offset = spec.local_shape(coord), spec.local_offset(coord)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def _whole_draw(spec, coord):
    """For a ``local`` hook: this rank's slice of the whole tensor and a maker of the whole-tensor
    stand-in to draw into; None where the local piece is the whole tensor (the op itself then draws
    exactly what the unsharded op would)."""
    if not any(type(p) is Shard for p in spec.placements):
        return None
    index = _slice_of(spec, coord)
    shape, stride = spec.shape, spec.stride

    def stand_in(local):  # the unsharded tensor's layout: in-place samplers fill in memory order
        return torch.empty_strided(shape, stride, dtype=local.dtype, device=local.device)

    return index, stand_in


def _inplace_local(schema, decision, out_specs, mesh, coord):
    drawn = _whole_draw(out_specs[0], coord)
    if drawn is None:
        return None
    index, stand_in = drawn

    def kernel(op, args, kwargs):
        whole = op(stand_in(args[0]), *args[1:], **kwargs)
        return args[0].copy_(whole[index])

    return LocalPlan(kernel=kernel)


def _like_local(schema, decision, out_specs, mesh, coord):
    # the output's global shape and stride are the input's (a *_like op preserves the layout); its dtype
    # may differ (randint_like(x, dtype=...)), so the stand-in takes the input piece's dtype
    drawn = _whole_draw(out_specs[0], coord)
    if drawn is None:
        return None
    index, stand_in = drawn

    def kernel(op, args, kwargs):
        return op(stand_in(args[0]), *args[1:], **kwargs)[index].clone()  # not a view pinning the whole

    return LocalPlan(kernel=kernel)


def _dropout_local(schema, decision, out_specs, mesh, coord):
    drawn = _whole_draw(out_specs[0], coord)
    if drawn is None:
        return None
    index, _ = drawn
    shape, mask_dtype = out_specs[0].shape, out_specs[1].dtype

    def kernel(op, args, kwargs):
        local = args[0]
        train = args[2] if len(args) > 2 else kwargs.get("train")
        if train is False:  # no draw: the input and an all-true mask, as unsharded
            out, mask = op(*args, **kwargs)
            return out, mask.to(mask_dtype)  # an empty piece gets a float mask from the CPU kernel
        # the mask depends only on the shape: drawn whole from ones, whose output is mask * 1/(1-p)
        scaled, mask = op(torch.ones(shape, dtype=local.dtype, device=local.device), *args[1:], **kwargs)
        return local * scaled[index], mask[index].clone()

    return LocalPlan(kernel=kernel)


@register_rule(*_INPLACE, local=_inplace_local, pointwise=True)
def inplace_random_rule(schema, mesh_size):
    return _follow_input(schema)


@register_rule(*_LIKE, local=_like_local, pointwise=True)
def like_random_rule(schema, mesh_size):
    return _follow_input(schema, ALL_PARTIALS)


@register_rule(aten.native_dropout.default, local=_dropout_local, pointwise=True)
def dropout_rule(schema, mesh_size):
    return _follow_input(schema)


@register_rule(*_VALUE_DEPENDENT, pointwise=True)
def value_dependent_random_rule(schema, mesh_size):
    outs = tuple(None if o is None else R for o in schema.outputs)
    return [Strategy(outs, tuple(R for _ in schema.tensor_args))]
