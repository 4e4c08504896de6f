"""Column-wise: column blocks on several ranks; every block receives all ids of its table and the
pooled column blocks come back with one all-to-all, landing side by side."""

from __future__ import annotations

from ...plan.values import ShardBox, chunk_sizes, column_wise
from ..stages import AllToAllOutputDist
from .base import ShardingKind, check_rank, routed_build


def layout(table, ps, topo) -> list[ShardBox]:
    for r in ps.ranks:
        check_rank(r, table.name, topo.world_size, "column_wise")
    if len(ps.ranks) > table.embedding_dim:
        raise ValueError(f"table {table.name!r}: column_wise over {len(ps.ranks)} ranks needs embedding_dim >= "
                         f"{len(ps.ranks)}, got {table.embedding_dim}; use fewer ranks")
    return [ShardBox(table.name, r, 0, table.num_embeddings, off, size)
            for r, (off, size) in zip(ps.ranks, chunk_sizes(table.embedding_dim, len(ps.ranks)))]


def sharding_of(boxes, topo):
    return column_wise(tuple(b.rank for b in boxes))


SHARDER = ShardingKind(layout, routed_build(AllToAllOutputDist), sharding_of)
