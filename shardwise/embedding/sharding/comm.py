"""Differentiable collectives for pooled embeddings (torch.distributed underneath)."""

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
    def forward(ctx, anchor, send, in_splits, out_splits, group):
        ctx.splits, ctx.group = (list(in_splits), list(out_splits)), group
        recv = send.new_empty((sum(out_splits),) + tuple(send.shape[1:]))
        dist.all_to_all_single(recv, send.contiguous(), list(out_splits), list(in_splits), group=group)
        return recv

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        g_send = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(g_send, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return None, g_send, None, None, None


class ReduceScatter(torch.autograd.Function):
    """Sum equal chunks over ranks, rank r keeping chunk r; backward all-gathers the gradients."""

    @staticmethod
    def forward(ctx, anchor, send, world, group):
        ctx.world, ctx.group = world, group
        out = send.new_empty(send.shape[0] // world)
        dist.reduce_scatter_single(out, send.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        full = grad.new_empty(grad.shape[0] * ctx.world)
        dist.all_gather_single(full, grad.contiguous(), group=ctx.group)
        return None, full, None, None


def all_gather_ints(values: list[int], world: int, group, device) -> list[list[int]]:
    """Every rank's short int list (same length everywhere), e.g. local batch sizes."""
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = mine.new_empty(world * len(values))
    dist.all_gather_single(out, mine, group=group)
    return out.view(world, len(values)).tolist()
