"""Data-parallel: the whole table on every rank; lookups stay local and the backward all-reduces
the touched rows' gradients so every replica applies the same update."""

from __future__ import annotations

from ...plan.values import ShardBox, data_parallel
from ..stages import LocalOutputDist
from .base import ShardingKind, routed_build


def layout(table, ps, topo) -> list[ShardBox]:
    return [ShardBox(table.name, r, 0, table.num_embeddings, 0, table.embedding_dim)
            for r in range(topo.world_size)]


def sharding_of(boxes, topo):
    return data_parallel()


SHARDER = ShardingKind(layout, routed_build(LocalOutputDist, exchange=False), sharding_of, local_only=True,
                       replicated=True)
