"""Dtype casts around a redistribute, for ``redistribute(forward_dtype=, backward_dtype=)`` as in
PyTorch: the move runs in ``forward_dtype``; in backward the gradient's move runs in
``backward_dtype``, and the gradient reaching the input has the input's dtype again.

Example:
    >>> from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,)); x = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
    >>> y = x.redistribute(mesh, [Replicate()], forward_dtype=torch.bfloat16)   # the gather in bf16
    >>> y.dtype, y.placements
    (torch.bfloat16, (Replicate(),))
"""

from __future__ import annotations

import torch

__all__ = ["cast_forward", "cast_backward"]


def _local_cast(x, dtype):
    from .dtensor import DTensor

    if x._local_tensor.dtype == dtype:
        return x
    spec = x._spec
    return DTensor._wrap(x._local_tensor.to(dtype), type(spec)(spec.mesh, spec.placements, spec.shape,
                                                              spec.stride, dtype))


class _ForwardCast(torch.autograd.Function):
    """Forward: to ``dtype``; backward: the gradient back to the input's dtype."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return _local_cast(x, dtype)

    @staticmethod
    def backward(ctx, grad):
        return _local_cast(grad, ctx.dtype), None


class _BackwardCast(torch.autograd.Function):
    """Forward: the same values; backward: the gradient to ``dtype`` before it is moved."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _local_cast(grad, ctx.dtype), None


def cast_forward(x, dtype):
    if dtype is None or dtype == x.dtype:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _ForwardCast.apply(x, dtype)
    return _local_cast(x, dtype)


def cast_backward(y, dtype):
    if dtype is None or not (y.requires_grad and torch.is_grad_enabled()):
        return y
    return _BackwardCast.apply(y, dtype)
