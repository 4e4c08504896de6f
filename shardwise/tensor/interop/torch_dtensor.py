"""Conversion to and from PyTorch's own ``torch.distributed.tensor.DTensor``, sharing local data."""

from __future__ import annotations

import torch.distributed.tensor as tdt
import torch.distributed.tensor.placement_types as tpt

from ..placements import NormPartial, Partial, Replicate, Shard

__all__ = ["from_torch", "to_torch", "placement_from_torch", "placement_to_torch"]


def placement_from_torch(p):
    if isinstance(p, tpt.Shard):
        return Shard(p.dim)
    if isinstance(p, tpt.Replicate):
        return Replicate()
    if type(p).__name__ == "_NormPartial":  # torch's pending norm (private class): its reduce_op reads "sum"
        return NormPartial(p.norm_type)
    if isinstance(p, tpt.Partial):
        return Partial(p.reduce_op)
    raise TypeError(f"cannot convert torch placement {p!r}; only Shard, Replicate and Partial map across")


def placement_to_torch(p):
    if type(p) is Shard:
        return tpt.Shard(p.dim)
    if type(p) is Replicate:
        return tpt.Replicate()
    if isinstance(p, NormPartial):
        from torch.distributed.tensor._ops._math_ops import _NormPartial

        return _NormPartial(p.norm_type)
    if isinstance(p, Partial):
        return tpt.Partial(p.reduce_op)
    raise TypeError(f"cannot convert placement {p!r} to torch's DTensor")


def from_torch(t):
    """shardwise DTensor from a torch DTensor: same mesh, same local tensor, autograd connected."""
    from ..dtensor import DTensor

    if not isinstance(t, tdt.DTensor):
        raise TypeError(f"from_torch expects torch.distributed.tensor.DTensor, got {type(t).__name__}")
    placements = [placement_from_torch(p) for p in t.placements]
    return DTensor.from_local(t.to_local(), t.device_mesh, placements, shape=t.shape, stride=t.stride())


def to_torch(x):
    """torch DTensor from a shardwise DTensor: same mesh, same local tensor, autograd connected."""
    placements = [placement_to_torch(p) for p in x.placements]
    return tdt.DTensor.from_local(x.to_local(), x.device_mesh, placements, shape=x.shape, stride=x.stride())
