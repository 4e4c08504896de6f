"""What each sharding type supplies: a layout (table -> shard boxes) and a factory of the three stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...plan.values import LayoutTopology, ShardBox, chunk_sizes  # noqa: F401  (LayoutTopology re-exported)
from ..stages import GroupedLookup, InputDist

__all__ = ["ShardingKind", "Stages", "LayoutTopology", "check_rank", "row_blocks", "routed_build"]


@dataclass(frozen=True)
class Stages:
    input_dist: Callable
    lookup: Callable
    output_dist: Callable


@dataclass(frozen=True)
class ShardingKind:
    """One sharding type, the single source of its shard boxes:
    ``layout(config, sharding, topology) -> [ShardBox]`` (every rank's boxes, empty ones included);
    ``sharding_of(boxes, topology) -> ParameterSharding`` (the inverse: the sharding those boxes came from);
    ``build(routing, topology, store, anchor, weighted, dtype) -> Stages``."""

    layout: Callable
    build: Callable
    sharding_of: Callable
    local_only: bool = False        # routing keeps ids on their own rank (data parallel)
    replicated: bool = False        # every rank holds the whole table; gradients are all-reduced


def routed_build(output_dist: Callable, exchange: bool = True) -> Callable:
    """A kind's ``build``: ids routed by ``InputDist`` (exchanged between ranks unless ``exchange`` is
    False), looked up by ``GroupedLookup``, pooled rows sent back by ``output_dist(routing, topology,
    anchor, dtype)``; the kinds differ only in that last stage."""
    def build(routing, topo, store, anchor, weighted, dtype) -> Stages:
        return Stages(InputDist(routing, topo, weighted, exchange=exchange, dtype=dtype), GroupedLookup(store, anchor),
                      output_dist(routing, topo, anchor, dtype))
    return build


def check_rank(rank: int, table: str, world: int, what: str) -> None:
    if rank >= world:
        raise ValueError(f"table {table!r}: {what} names rank {rank} but the mesh has {world} ranks "
                         f"(0..{world - 1}); pick a rank in range")


def row_blocks(table, ranks) -> list[ShardBox]:
    """torch.chunk row blocks of ``table`` over ``ranks`` (trailing blocks short or empty)."""
    return [ShardBox(table.name, r, off, size, 0, table.embedding_dim)
            for r, (off, size) in zip(ranks, chunk_sizes(table.num_embeddings, len(ranks)))]


