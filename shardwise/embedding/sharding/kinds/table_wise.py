"""Table-wise: each table whole on one rank; ids all-to-all in, pooled all-to-all out."""

from __future__ import annotations

from ...plan.values import ShardBox, table_wise
from ..stages import AllToAllOutputDist, GroupedLookup, InputDist
from .base import ShardingKind, Stages, check_rank


def layout(table, ps, topo) -> list[ShardBox]:
    if ps.ranks is None or len(ps.ranks) != 1:
        raise ValueError(f"table {table.name!r}: table_wise needs exactly one rank, got {ps.ranks}")
    check_rank(ps.ranks[0], table.name, topo.world_size, "table_wise")
    return [ShardBox(table.name, ps.ranks[0], 0, table.num_embeddings, 0, table.embedding_dim)]


def build(routing, topo, store, anchor, weighted, dtype) -> Stages:
    return Stages(InputDist(routing, topo, weighted, dtype=dtype), GroupedLookup(store, anchor),
                  AllToAllOutputDist(routing, topo, anchor, dtype))

def sharding_of(boxes, topo):
    return table_wise(boxes[0].rank)


SHARDER = ShardingKind(layout, build, sharding_of)
