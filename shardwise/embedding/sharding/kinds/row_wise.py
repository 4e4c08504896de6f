"""Row-wise: torch.chunk row blocks over ranks; ids are bucketized by block, each block pools a
partial sum and the partials are reduce-scattered (NCCL) or all-to-all'ed and added (gloo)."""

from __future__ import annotations

from ...plan.values import row_wise
from ..stages import ReduceScatterOutputDist
from .base import ShardingKind, check_rank, row_blocks, routed_build


def layout(table, ps, topo):
    ranks = tuple(range(topo.world_size)) if ps.ranks is None else ps.ranks
    for r in ranks:
        check_rank(r, table.name, topo.world_size, "row_wise")
    return row_blocks(table, ranks)


def sharding_of(boxes, topo):
    return row_wise(tuple(b.rank for b in boxes))


SHARDER = ShardingKind(layout, routed_build(ReduceScatterOutputDist), sharding_of)
