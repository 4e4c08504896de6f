"""State-dict entries for sharded tables: our DTensor where the layout is a placement, else ShardedTable."""

from __future__ import annotations

from typing import Optional

import torch

from .plan.values import ShardBox, chunk_sizes
from .sharded_table import ShardedTable

__all__ = ["wrap_shards", "copy_into_shards"]


def _dtensor_api():
    """Our DTensor when it can be checkpointed by torch.distributed.checkpoint, else None."""
    try:
        from ..tensor.dtensor import DTensor
        from ..tensor.placements import Replicate, Shard
    except ImportError:
        return None
    if not hasattr(DTensor, "__create_chunk_list__"):
        return None
    return DTensor, Shard, Replicate


def _placement(boxes: list[ShardBox], size: tuple, world: int, replicated: bool) -> Optional[str]:
    """'replicate' / 'shard0' / 'shard1' when the boxes are exactly that DTensor layout."""
    if replicated:
        return "replicate"
    by_rank = sorted(boxes, key=lambda b: b.rank)
    if [b.rank for b in by_rank] != list(range(world)):
        return None
    rows = [(b.row_offset, b.row_size) for b in by_rank]
    cols = [(b.col_offset, b.col_size) for b in by_rank]
    if len(size) == 1 or all(c == (0, size[1]) for c in cols):
        if rows == chunk_sizes(size[0], world):
            return "shard0"
    if len(size) == 2 and all(r == (0, size[0]) for r in rows) and cols == chunk_sizes(size[1], world):
        return "shard1"
    return None


def wrap_shards(boxes: list[ShardBox], local: dict, size: tuple, topo, replicated: bool, dtype):
    """One table's global tensor from all its boxes and this rank's ``{box: tensor view}``."""
    kind = _placement(boxes, size, topo.world_size, replicated)
    api = _dtensor_api()
    mine = [b for b in boxes if b.rank == topo.rank]
    if kind is not None and api is not None and topo.mesh.ndim == 1:
        DTensor, Shard, Replicate = api
        placement = {"replicate": Replicate(), "shard0": Shard(0), "shard1": Shard(1)}[kind]
        return DTensor.from_local(local[mine[0]], topo.mesh, [placement], shape=size)
    if replicated:
        mine = mine[:1]
    shards = [((b.row_offset, b.col_offset)[:len(size)], local[b]) for b in mine]
    layout = tuple((b.rank, b.row_offset, b.row_size, b.col_offset, b.col_size) for b in boxes)
    return ShardedTable(shards, size, topo.group, dtype, topo.device, layout=layout, replicated=replicated)


@torch.no_grad()
def copy_into_shards(value, boxes: list[ShardBox], local: dict, size: tuple, topo, replicated: bool,
                     what: str) -> None:
    """Copy ``value`` (ShardedTable, DTensor or a whole plain tensor) into this rank's shard views.

    The path is chosen from global facts only (layouts, shapes), so every rank takes the same one.
    """
    if tuple(value.shape) != tuple(size):
        raise ValueError(f"{what}: shape {tuple(value.shape)} does not match the table's {tuple(size)}; "
                         f"load a state dict of the same tables")
    mine = [b for b in boxes if b.rank == topo.rank]
    layout = tuple((b.rank, b.row_offset, b.row_size, b.col_offset, b.col_size) for b in boxes)
    if isinstance(value, ShardedTable) and value.box_layout == layout:
        for b, (_, t) in zip(mine[:1] if replicated else mine, value.local_shards()):
            local[b].copy_(t)
        if replicated:
            for b in mine[1:]:
                local[b].copy_(value.local_shards()[0][1])
        return
    full = value.full_tensor() if hasattr(value, "full_tensor") else value
    full = full.to(topo.device)
    for b in mine:
        rows = slice(b.row_offset, b.row_offset + b.row_size)
        if len(size) == 1:
            local[b].copy_(full[rows])
        else:
            local[b].copy_(full[rows, b.col_offset:b.col_offset + b.col_size])
