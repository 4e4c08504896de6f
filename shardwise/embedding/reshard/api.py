"""Live resharding: move tables of a sharded collection to new shardings while training continues.

Validate, agree in one all-gather, rebuild only the sharding-type groups that gain or lose a table
and fill them from the pieces (``pieces``, ``reuse``, ``executor``). Design: docs/reshard.md.

Example (in a process group; world size 1 here, every rank runs the same on more):
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard, table_wise
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(8, 4, f"t{i}", feature_names=[f"f{i}"]) for i in range(2)])
    >>> sharded = shard(ebc, {"t0": table_wise(0), "t1": table_wise(0)})
    >>> stats = reshard(sharded, {"t0": row_wise()})
    >>> stats.tables_moved, stats.bytes_sent, stats.bytes_local       # one rank: t0's 8 x 4 fp32 stay local
    (['t0'], [0], 128)
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Optional

from ..plan.values import ParameterSharding, ShardingType
from ..sharding import SHARDERS
from ..sharding.comm import all_gather_ints
from .executor import CHUNK_BYTES, exchange, plan_moves
from .pieces import piece_bytes, plan_pieces, state_kinds, whole_box
from .reuse import adopt_buffers, memory_split, release

__all__ = ["ReshardStats", "reshard", "current_plan", "changes_digest"]

_AGREED = 33   # the all-gathered row: 32 digest bytes and chunk_bytes (equal on every rank), ok flag, steps


@dataclass
class ReshardStats:
    """What one :func:`reshard` did. Byte counts are per rank (index = rank) and identical on every
    rank; ``bytes_matrix[src][dst]`` splits them by destination; ``bytes_local`` is what this rank
    copied without the wire."""

    tables_moved: list = field(default_factory=list)
    bytes_sent: list = field(default_factory=list)
    bytes_received: list = field(default_factory=list)
    bytes_local: int = 0
    wall_time_s: float = 0.0
    bytes_matrix: list = field(default_factory=list)
    transient_bytes: int = 0     # most bytes of message buffers alive at once on this rank
    bytes_reused: int = 0        # bytes of the rebuilt stores in old store memory taken over (this rank)
    bytes_allocated: int = 0     # bytes of the rebuilt stores in new memory (this rank)


def current_plan(module) -> dict:
    """``{table: ParameterSharding}`` that reproduces ``module``'s current boxes (each sharding class
    reads its own boxes back).

    Example (in a process group of one rank):
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, table_wise
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(8, 4, "t0", feature_names=["f0"])])
        >>> current_plan(shard(ebc, {"t0": table_wise(0)}))["t0"]
        ParameterSharding(sharding_type=<ShardingType.TABLE_WISE: 'table_wise'>, ranks=(0,), host_index=None)
    """
    return module.sharding_plan()


def changes_digest(changes) -> bytes:
    """sha256 of a canonical encoding of ``changes``, equal on two ranks iff their changes are (never
    Python's per-process ``hash()``).

    Example:
        >>> from shardwise.embedding import row_wise, table_wise
        >>> a, b = changes_digest({"t0": row_wise()}), changes_digest({"t0": table_wise(0)})
        >>> a == changes_digest({"t0": row_wise()}), a == b
        (True, False)
    """
    if not isinstance(changes, dict):
        return hashlib.sha256(f"not-a-dict:{type(changes).__name__}".encode()).digest()
    items = []
    for k in sorted(changes, key=repr):
        ps = changes[k]
        if not isinstance(ps, ParameterSharding):
            items.append((repr(k), "not-a-ParameterSharding", type(ps).__name__))
            continue
        st = ps.sharding_type.value if isinstance(ps.sharding_type, ShardingType) else repr(ps.sharding_type)
        items.append((repr(k), st, repr(ps.ranks), repr(ps.host_index)))
    return hashlib.sha256(repr(items).encode()).digest()


def _layout(module) -> dict:
    """{table: [ShardBox]} of the current layout, tables in config order."""
    out = {t.name: [] for t in module._tables}
    for b in module.boxes():
        out[b.table].append(b)
    return out


def _validate(module, changes, limit: Optional[int], chunk_bytes) -> dict:
    """This rank's verdict (no collectives): {table: new boxes}, or the TypeError/ValueError to raise."""
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes < 64:
        raise ValueError(f"reshard: chunk_bytes={chunk_bytes!r} must be an int >= 64 (bytes per message; the "
                         f"default is {CHUNK_BYTES})")
    if not isinstance(changes, dict):
        raise TypeError(f"changes must be a dict {{table name: ParameterSharding}}, got {type(changes).__name__}")
    tables = {t.name: t for t in module._tables}
    unknown = sorted((k for k in changes if k not in tables), key=repr)
    if unknown:
        raise ValueError(f"changes name unknown tables {unknown}; tables are {list(tables)}")
    new = {}
    for name, ps in changes.items():
        if not isinstance(ps, ParameterSharding) or not isinstance(ps.sharding_type, ShardingType):
            raise TypeError(f"changes[{name!r}] must be a ParameterSharding (e.g. row_wise()), got {ps!r}")
        try:
            new[name] = list(SHARDERS[ps.sharding_type].layout(tables[name], ps, module._topo))
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"changes[{name!r}] = {ps!r} is not a valid sharding ({exc}); build it with "
                             f"table_wise/row_wise/column_wise/table_row_wise/data_parallel") from None
    module._check_rule(module.fused_optimizer.rule, {**current_plan(module), **changes})
    if limit is not None:
        kinds = state_kinds(module.fused_optimizer.rule)
        per_rank = [0] * module._topo.world_size
        for b in (b for boxes in {**_layout(module), **new}.values() for b in boxes):
            per_rank[b.rank] += piece_bytes(whole_box(b), kinds, module._dtype)
        over = [r for r, n in enumerate(per_rank) if n > limit]
        if over:
            raise ValueError(f"reshard: the new layout needs {[per_rank[r] for r in over]} bytes on ranks {over}, "
                             f"over max_bytes_per_rank={limit}; spread the tables over more ranks or raise the limit")
    return new


def _agree(module, changes, limit: Optional[int], chunk_bytes) -> tuple:
    """Validate everywhere, then agree: one all-gather of (digest, chunk size, ok, steps). Raises the same
    error on every rank before anything changes; returns ({table: new boxes}, {table: step})."""
    topo, error, new = module._topo, None, {}
    try:
        new = _validate(module, changes, limit, chunk_bytes)
    except (TypeError, ValueError) as exc:
        error = exc
    chunk = chunk_bytes if isinstance(chunk_bytes, int) and not isinstance(chunk_bytes, bool) else -1
    # this rank's optimizer step per table (config order), -1 where it holds none of the table
    here = {g.store.boxes[i].table: g.store.steps[w] for g in module._groups for i, (w, _) in g.store.loc.items()}
    steps_here = [here.get(t.name, -1) for t in module._tables]
    row = list(changes_digest(changes)) + [chunk, int(error is not None)] + steps_here
    rows = all_gather_ints(row, topo.world_size, topo.group, topo.device)
    differ = [r for r in range(topo.world_size) if rows[r][:_AGREED] != rows[0][:_AGREED]]
    if differ:
        raise ValueError(f"reshard: changes differ across ranks (ranks {differ} differ from rank 0 in the changes or "
                         f"chunk_bytes); every rank must pass the same changes and chunk_bytes, nothing was moved")
    if error is not None:
        raise error
    bad = [r for r in range(topo.world_size) if rows[r][_AGREED]]
    if bad:
        raise ValueError(f"reshard: ranks {bad} rejected the changes; nothing was moved")
    return new, {t.name: max(r[_AGREED + 1 + k] for r in rows) for k, t in enumerate(module._tables)}


def _buffer_steps(module, plan: dict, layout: dict, steps: dict) -> dict:
    """{(sharding type, rank, width): optimizer step} of every width buffer of the new layout. Tables
    sharing one must have the same step count (decided on all-gathered data: the same everywhere)."""
    shared: dict = {}
    for t in module._tables:
        for b in layout[t.name]:
            if b.row_size and b.col_size:
                shared.setdefault((plan[t.name].sharding_type, b.rank, b.col_size), {})[t.name] = steps[t.name]
    for (_, rank, _), per_table in shared.items():
        if module.fused_optimizer.rule is not None and len(set(per_table.values())) > 1:
            raise ValueError(f"reshard: tables {sorted(per_table)} would share a buffer on rank {rank} but "
                             f"have different optimizer step counts {per_table}; load a consistent "
                             f"optimizer state first")
    return {key: max(per_table.values()) for key, per_table in shared.items()}


def _move(module, plan: dict, affected: set, pieces: list, moved: set, stats: ReshardStats, chunk: int,
          steps: dict) -> None:
    """Rebuild the affected sharding-type groups with new stores (the others are kept), fill them (the
    moved pieces and, inside the rebuilt groups, the unmoved tables' boxes: local copies, none where a
    store took over the buffer they sit in), set their step counts and swap them in."""
    topo, rule, hp = module._topo, module.fused_optimizer.rule, module.fused_optimizer.hp
    by_type, cols = {g.sharding_type: g for g in module._groups}, module._groups[0].spec.feature_cols
    groups = []
    for st in ShardingType:   # the construction's order; new stores start uninitialised: the move fills them
        tables = [t for t in module._tables if plan[t.name].sharding_type == st]
        if tables:
            groups.append(by_type[st] if st not in affected else
                          module._build_group(st, tables, plan, cols, None, rule, hp))
    old_groups = [g for g in module._groups if g.sharding_type in affected]
    rebuilt = [g for g in groups if g.sharding_type in affected]
    adopt_buffers(old_groups, rebuilt)
    old_index = {g.store.boxes[i]: (g.store, i) for g in old_groups for i in g.store.loc}
    new_index = {g.store.boxes[i]: (g.store, i) for g in rebuilt for i in g.store.loc}

    def views(box, what, old: bool):
        store, i = (old_index if old else new_index)[box]
        return store.box_view(i, what)
    every = pieces + [whole_box(b) for g in rebuilt for b in g.routing.boxes
                      if b.rank == topo.rank and b.table not in moved]
    args = (every, state_kinds(rule), views, topo.rank, topo.world_size, module._dtype, chunk)
    moves = plan_moves(*args)
    if moves.conflicts:   # taken-over buffers the loop's order cannot protect: new memory for them
        release(rebuilt, moves.conflicts)
        moves = plan_moves(*args)
    stats.transient_bytes = exchange(moves, topo.group, topo.device)
    stats.bytes_reused, stats.bytes_allocated = memory_split(old_groups, rebuilt)
    for g in rebuilt:
        for w, width in enumerate(g.store.widths):
            g.store.steps[w] = steps[g.sharding_type, topo.rank, width]
    # the one place routing state changes: groups carry routing, stores and stages together
    module._groups = groups
    module._reset_load_stats()


def reshard(module, changes: dict, *, max_bytes_per_rank: Optional[int] = None,
            chunk_bytes: int = CHUNK_BYTES) -> ReshardStats:
    """Move the tables named in ``changes`` to their new shardings, with all their optimizer state.

    Collective: every rank calls it with the same ``changes`` (``{table: ParameterSharding}``, any
    sharding type to any other, other ranks, other shard counts). Tables not named keep their shards
    and state untouched. Anything invalid (unknown table, rank out of range, changes differing across
    ranks, a layout over ``max_bytes_per_rank``) raises the same ValueError/TypeError on every rank
    before anything changes. Forwards and training continue afterwards exactly as if the module had
    been sharded with the new plan from the start. Memory beyond the rebuilt stores: at most four
    message buffers of ``chunk_bytes`` (``stats.transient_bytes``; docs/reshard.md).

    Example (two ranks, ``t0`` table-wise on rank 0 moving to rank 1; one rank: the module's example):
        >>> stats = reshard(sharded, {"t0": table_wise(1)})      # doctest: +SKIP
        >>> stats.bytes_sent                                     # doctest: +SKIP
        [8192, 0]
    """
    t0 = time.perf_counter()
    new_boxes, steps = _agree(module, changes, max_bytes_per_rank, chunk_bytes)
    old_plan, old_boxes = current_plan(module), _layout(module)
    plan = {**old_plan, **changes}
    moved = [t.name for t in module._tables if t.name in new_boxes and (new_boxes[t.name] != old_boxes[t.name]
             or plan[t.name].sharding_type != old_plan[t.name].sharding_type)]
    buffer_steps = _buffer_steps(module, plan, {**old_boxes, **new_boxes}, steps)
    world, kinds = module._topo.world_size, state_kinds(module.fused_optimizer.rule)
    stats = ReshardStats(moved, [0] * world, [0] * world, bytes_matrix=[[0] * world for _ in range(world)])
    if moved:
        affected = {old_plan[n].sharding_type for n in moved} | {plan[n].sharding_type for n in moved}
        replicated = {n for n in moved if old_plan[n].sharding_type == ShardingType.DATA_PARALLEL}
        pieces = plan_pieces([t.name for t in module._tables], old_boxes, {n: new_boxes[n] for n in moved}, replicated)
        for p in pieces:
            n = piece_bytes(p, kinds, module._dtype)
            if p.src != p.dst:
                stats.bytes_sent[p.src] += n
                stats.bytes_received[p.dst] += n
                stats.bytes_matrix[p.src][p.dst] += n
            elif p.src == module._topo.rank:
                stats.bytes_local += n
        _move(module, plan, affected, pieces, set(moved), stats, chunk_bytes, buffer_steps)
    stats.wall_time_s = time.perf_counter() - t0
    return stats
