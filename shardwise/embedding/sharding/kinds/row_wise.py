"""Row-wise: torch.chunk row blocks over ranks; ids are bucketized by block, each block pools a
partial sum and the partials are reduce-scattered (NCCL) or all-to-all'ed and added (gloo)."""

from __future__ import annotations

from ...plan.values import row_wise
from ..stages import GroupedLookup, InputDist, ReduceScatterOutputDist
from .base import ShardingKind, Stages, check_rank, row_blocks


def layout(table, ps, topo):
    ranks = tuple(range(topo.world_size)) if ps.ranks is None else ps.ranks
    for r in ranks:
        check_rank(r, table.name, topo.world_size, "row_wise")
    return row_blocks(table, ranks)


def build(routing, topo, store, anchor, weighted, dtype) -> Stages:
    return Stages(InputDist(routing, topo, weighted, dtype=dtype), GroupedLookup(store, anchor),
                  ReduceScatterOutputDist(routing, topo, anchor, dtype))

def sharding_of(boxes, topo):
    return row_wise(tuple(b.rank for b in boxes))


SHARDER = ShardingKind(layout, build, sharding_of)
