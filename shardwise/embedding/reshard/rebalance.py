"""Rebalancing proposals: ``changes`` for :func:`~shardwise.embedding.reshard` made from measured load.

Example (two ranks, both tables table-wise on rank 0: the proposal moves one to rank 1; docs/reshard.md):
    >>> stats = sharded.load_stats()                                   # doctest: +SKIP
    >>> changes = propose_rebalance(stats, max_bytes=256 << 20)        # doctest: +SKIP
    >>> changes                                                        # doctest: +SKIP
    {'t0': ParameterSharding(sharding_type=<ShardingType.TABLE_WISE: 'table_wise'>, ranks=(1,), host_index=None)}
    >>> sharded.reshard(changes)                                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.values import ShardingType, column_wise, data_parallel, row_wise, table_wise
from ..sharding import SHARDERS, LayoutTopology
from .load import LoadStats, TableLoad
from .pieces import plan_pieces

__all__ = ["propose_rebalance"]


@dataclass(frozen=True)
class _Cfg:
    name: str
    num_embeddings: int
    embedding_dim: int


_ALL = (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.DATA_PARALLEL)


def _candidates(t: TableLoad, world: int, types) -> list:
    """Shardings tried for one table, in a fixed order (ties go to the earlier one), among ``types``."""
    out = [table_wise(r) for r in range(world)] + [row_wise()]
    if t.dim >= world and not t.row_state:
        out.append(column_wise(list(range(world))))
    out.append(data_parallel())
    return [ps for ps in out if ps.sharding_type in types]


def _check(load_stats, max_bytes, sharding_types) -> frozenset:
    """The allowed types, after checking every input (before any work)."""
    if not isinstance(load_stats, LoadStats):
        raise TypeError(f"load_stats must be a LoadStats (from sharded.load_stats()), got "
                        f"{type(load_stats).__name__}; it carries the table sizes and boxes a proposal needs")
    if not isinstance(max_bytes, (int, float)) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ValueError(f"max_bytes={max_bytes!r} must be a number >= 0 (bytes that may move)")
    return _allowed(sharding_types)


def _allowed(sharding_types) -> frozenset:
    if sharding_types is None:
        return frozenset(_ALL)
    try:
        types = frozenset(ShardingType(t) for t in sharding_types)
    except (ValueError, TypeError):
        raise ValueError(f"sharding_types={sharding_types!r}: each must be one of "
                         f"{[t.value for t in ShardingType]}, e.g. ['row_wise', 'data_parallel']") from None
    if not types:
        raise ValueError("sharding_types=[] allows no layout at all; pass None for every type or name some")
    return types


def _moved_bytes(t: TableLoad, new_boxes: list, world: int) -> float:
    """Bytes that would cross the wire (weights + optimizer state) for this table's move."""
    replicated = {t.name} if t.sharding.sharding_type == ShardingType.DATA_PARALLEL else set()
    pieces = plan_pieces([t.name], {t.name: list(t.boxes)}, {t.name: new_boxes}, replicated)
    return sum((p.r1 - p.r0) * (p.c1 - p.c0) for p in pieces if p.src != p.dst) * t.bytes_per_elem


def _score(load: list) -> tuple:
    # lowest maximum first; then the most even spread (sum of squares)
    return (max(load), sum(x * x for x in load))


def propose_rebalance(load_stats: LoadStats, max_bytes: int, sharding_types=None) -> dict:
    """``changes`` for :func:`reshard` that lower the maximum per-rank lookup load, moving at most
    ``max_bytes`` (weights + optimizer state that cross the wire). Empty when nothing helps.
    ``sharding_types`` (``ShardingType`` values or their names; None: table-wise, row-wise,
    column-wise and data-parallel) are the only layouts a proposal may use -- pass the planner's
    ``types`` so a live reshard never picks a layout the user excluded from the plan.

    ``load_stats`` is a :class:`LoadStats` from ``sharded.load_stats()`` (collective; per table: ids
    per step in row buckets and per asking rank, current boxes, bytes per element). The proposal is
    a pure function of it -- greedy, one table at a time, each table moved at most once, ties broken
    by table order -- so every rank proposes the same changes.

    Example (one rank: nothing can move; the module's example shows two):
        >>> import torch
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, table_wise
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(8, 4, "t0", feature_names=["f0"])])
        >>> sharded = shard(ebc, {"t0": table_wise(0)})
        >>> propose_rebalance(sharded.load_stats(), max_bytes=1 << 30)
        {}
    """
    types = _check(load_stats, max_bytes, sharding_types)
    world = load_stats.world_size
    topo = LayoutTopology(world, load_stats.hosts or (tuple(range(world)),))
    loads = {t.name: t.rank_load(t.boxes, t.sharding.sharding_type, world) for t in load_stats.tables}
    total = [sum(v[r] for v in loads.values()) for r in range(world)]
    moves, spent = [], 0.0
    best_max, best_len = max(total), 0
    while True:
        best = None
        for t in load_stats.tables:
            if any(name == t.name for name, _ in moves):
                continue
            for ps in _candidates(t, world, types):
                boxes = SHARDERS[ps.sharding_type].layout(_Cfg(t.name, t.rows, t.dim), ps, topo)
                if boxes == list(t.boxes) and ps.sharding_type == t.sharding.sharding_type:
                    continue
                cost = _moved_bytes(t, boxes, world)
                if spent + cost > max_bytes:
                    continue
                cand = t.rank_load(boxes, ps.sharding_type, world)
                new_total = [x - old + new for x, old, new in zip(total, loads[t.name], cand)]
                key = _score(new_total) + (cost,)
                if best is None or key < best[0]:
                    best = (key, t, ps, cand, new_total, cost)
        now = _score(total)
        # a move must lower the maximum, or keep it and even out the rest (which can unlock a
        # lower maximum with the next move); only the prefix that reached the lowest maximum is kept
        if best is None or not (best[0][0] < now[0] * (1 - 1e-9) or
                                (best[0][0] <= now[0] and best[0][1] < now[1] * (1 - 1e-9))):
            break
        _, t, ps, cand, total, cost = best
        moves.append((t.name, ps))
        loads[t.name] = cand
        spent += cost
        if max(total) < best_max * (1 - 1e-9):
            best_max, best_len = max(total), len(moves)
    return dict(moves[:best_len])
