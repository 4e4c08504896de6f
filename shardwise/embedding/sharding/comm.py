"""Differentiable collectives for pooled embeddings (torch.distributed underneath).

``codecs`` (a :class:`~shardwise.embedding.qcomm.QuantizedCommCodecs`, or None for full precision)
casts the buffer for the wire and back: ``forward`` for the values, ``backward`` for their gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["AllToAll", "ReduceScatter", "all_gather_ints"]


class AllToAll(torch.autograd.Function):
    """Variable-split all-to-all of rows; backward sends gradients back along the reverse splits.

    ``anchor`` is a leaf that always requires grad so the backward collective runs on every rank,
    even on ranks whose send buffer has no autograd history (they hold no shards).
    """

    @staticmethod
    def forward(ctx, anchor, send, in_splits, out_splits, group, codecs=None):
        ctx.splits, ctx.group, ctx.codecs = (list(in_splits), list(out_splits)), group, codecs
        return _all_to_all(send, list(in_splits), list(out_splits), group, codecs and codecs.forward)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        codec = ctx.codecs and ctx.codecs.backward
        return None, _all_to_all(grad, out_splits, in_splits, ctx.group, codec), None, None, None, None


def _all_to_all(send, in_splits, out_splits, group, codec):
    """Rows of ``send`` split by ``in_splits`` out, ``out_splits`` in; through ``codec`` when given."""
    wire = send.contiguous() if codec is None else codec.encode(send).contiguous()
    recv = wire.new_empty((sum(out_splits),) + tuple(send.shape[1:]))
    dist.all_to_all_single(recv, wire, out_splits, in_splits, group=group)
    return recv if codec is None else codec.decode(recv).to(send.dtype)


class ReduceScatter(torch.autograd.Function):
    """Sum equal chunks over ranks, rank r keeping chunk r; backward all-gathers the gradients."""

    @staticmethod
    def forward(ctx, anchor, send, world, group, codecs=None):
        ctx.world, ctx.group, ctx.codec = world, group, codecs and codecs.backward
        codec = codecs and codecs.forward
        wire = send.contiguous() if codec is None else codec.encode(send).contiguous()
        out = wire.new_empty(send.shape[0] // world)
        dist.reduce_scatter_single(out, wire, group=group)   # the sum runs in the wire dtype, as TorchRec's
        return out if codec is None else codec.decode(out).to(send.dtype)

    @staticmethod
    def backward(ctx, grad):
        codec = ctx.codec
        wire = grad.contiguous() if codec is None else codec.encode(grad).contiguous()
        full = wire.new_empty(grad.shape[0] * ctx.world)
        dist.all_gather_single(full, wire, group=ctx.group)
        return None, full if codec is None else codec.decode(full).to(grad.dtype), None, None, None


def all_gather_ints(values: list[int], world: int, group, device) -> list[list[int]]:
    """Every rank's short int list (same length everywhere), e.g. local batch sizes."""
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = mine.new_empty(world * len(values))
    dist.all_gather_single(out, mine, group=group)
    return out.view(world, len(values)).tolist()
