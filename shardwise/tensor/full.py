"""``DTensor.full_tensor`` as one step: reduce/gather to Replicate and hand back the plain tensor.

Unfused, a differentiable ``full_tensor`` is ``redistribute`` to Replicate, then ``to_local``: two
autograd Functions, a DTensor wrapper in between, and in the backward a wrapper per Function again.
In a training step whose other work is a few hundred microseconds (a row-wise lookup, say) that
bookkeeping is a measurable share, so :func:`full_local` records one Function instead. Its backward
gives exactly what the two would: the incoming plain gradient, taken to be laid out as
``grad_placements`` (Replicate by default), moved to the source's gradient layout (its placements,
with pending sums replicated: the same value on every rank).

>>> import torch.nn.functional as F; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
>>> mesh = init_device_mesh("cpu", (1,))
>>> w = distribute_tensor(torch.randn(10, 4), mesh, [Shard(0)]).requires_grad_()
>>> ids = distribute_tensor(torch.tensor([1, 9, 1]), mesh, [Replicate()])
>>> out = F.embedding(ids, w).full_tensor()   # one Function; the pending sum reduced in place
>>> out.backward(torch.ones(3, 4))
>>> w.grad.placements, w.grad.full_tensor()[1]   # Shard(0), as from the two-step path; id 1 twice
((Shard(dim=0),), tensor([2., 2., 2., 2.]))
"""

from __future__ import annotations

from typing import Optional

import torch

from .placements import Partial, Replicate
from .redistribute import redistribute_local
from .spec import DTensorSpec, coord_or_none

__all__ = ["full_local", "grad_placements"]

_NO_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass


def grad_placements(placements) -> tuple:
    """The layout of the gradient that flows back to a tensor laid out as ``placements``: the same,
    except that a pending sum's gradient is the same for every rank, so it stays replicated."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def full_local(x, full: tuple, donate: bool, grad_placements_: Optional[tuple]) -> torch.Tensor:
    """``x`` (a DTensor) redistributed to the all-Replicate ``full`` as a plain tensor; differentiable
    when autograd records. ``donate``: the caller gives up ``x``'s buffer (see donation.py)."""
    src = x._spec
    with _NO_TORCH_FUNCTION():  # a DTensor's property reads otherwise run the dispatch fast path's lookup
        record = x.requires_grad and torch.is_grad_enabled()
    if not record:
        return redistribute_local(x._local_tensor, src, full, coord_or_none(src.mesh), donate)
    return _FullTensor.apply(x, full, donate, grad_placements_)


class _FullTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, full, donate, incoming):
        src = x._spec
        ctx.src, ctx.wrap = src, type(x)._wrap
        ctx.incoming = full if incoming is None else incoming
        local = redistribute_local(x._local_tensor, src, full, coord_or_none(src.mesh), donate)
        # a new tensor object, as to_local's: autograd writes its metadata into the output, which must
        # not land on a buffer a DTensor still holds (with no collective to run, the source's own)
        return local.view_as(local)

    @staticmethod
    def backward(ctx, grad):
        # never donated: autograd may hand the same gradient buffer to several consumers
        src = ctx.src
        target = grad_placements(src.placements)
        if ctx.incoming != target:
            spec = DTensorSpec(src.mesh, ctx.incoming, src.shape, src.stride, grad.dtype)
            grad = redistribute_local(grad, spec, target, coord_or_none(src.mesh))
        return ctx.wrap(grad, DTensorSpec(src.mesh, target, src.shape, src.stride, grad.dtype)), None, None, None
