"""Table-wise: each table whole on one rank; ids all-to-all in, pooled all-to-all out."""

from __future__ import annotations

from ...plan.values import ShardBox, table_wise
from ..stages import AllToAllOutputDist
from .base import ShardingKind, check_rank, routed_build


def layout(table, ps, topo) -> list[ShardBox]:
    if ps.ranks is None or len(ps.ranks) != 1:
        raise ValueError(f"table {table.name!r}: table_wise needs exactly one rank, got {ps.ranks}")
    check_rank(ps.ranks[0], table.name, topo.world_size, "table_wise")
    return [ShardBox(table.name, ps.ranks[0], 0, table.num_embeddings, 0, table.embedding_dim)]


def sharding_of(boxes, topo):
    return table_wise(boxes[0].rank)


SHARDER = ShardingKind(layout, routed_build(AllToAllOutputDist), sharding_of)
