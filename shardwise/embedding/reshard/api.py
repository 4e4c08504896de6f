"""Live resharding: move tables of a sharded collection to new shardings while training continues.

The whole move is planned from shard boxes that every rank knows: the overlap of each table's old
and new boxes gives a list of pieces (table, source rank, destination rank, rectangle). Pieces whose
source and destination are the same rank are copied locally; the rest cross the wire in rounds of
bounded messages (``executor``: one all-to-all per round), carrying weights and every
optimizer-state buffer of the moved tables. Only the sharding-type groups that gain or lose a table
are rebuilt, into new stores; the others are left alone.

Example:
    >>> stats = reshard(sharded, {"t0": row_wise(), "t1": table_wise(1)})   # doctest: +SKIP
    >>> stats.tables_moved, stats.bytes_sent                                # doctest: +SKIP
    (['t0', 't1'], [409600, 204800])
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Optional


from ..plan.values import ParameterSharding, ShardingType
from ..sharding import SHARDERS
from ..sharding.comm import all_gather_ints
from .executor import CHUNK_BYTES, exchange, local_index, plan_moves
from .pieces import Piece, itemsize, piece_numel, plan_pieces, state_kinds
from .reuse import adopt_buffers, memory_split, release

__all__ = ["ReshardStats", "reshard", "current_plan", "changes_digest"]


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

    Example:
        >>> current_plan(sharded)["t0"]                          # doctest: +SKIP
        ParameterSharding(sharding_type=<ShardingType.ROW_WISE: 'row_wise'>, ranks=(0, 1), host_index=None)
    """
    return module.sharding_plan()


def _canonical(changes) -> str:
    """A text encoding of ``changes`` that is the same on every rank iff the changes are."""
    if not isinstance(changes, dict):
        return f"not-a-dict:{type(changes).__name__}"
    items = []
    for k in sorted(changes, key=repr):
        v = changes[k]
        if isinstance(v, ParameterSharding):
            st = v.sharding_type.value if isinstance(v.sharding_type, ShardingType) else repr(v.sharding_type)
            items.append((repr(k), st, repr(v.ranks), repr(v.host_index)))
        else:
            items.append((repr(k), "not-a-ParameterSharding", type(v).__name__))
    return repr(items)


def changes_digest(changes) -> bytes:
    """sha256 of the canonical encoding of ``changes`` (never Python's per-process ``hash()``)."""
    return hashlib.sha256(_canonical(changes).encode()).digest()


def _new_boxes(module, changes: dict) -> dict:
    """Validate ``changes`` against ``module`` (local, no collectives); {table: new boxes}."""
    if not isinstance(changes, dict):
        raise TypeError(f"changes must be a dict {{table name: ParameterSharding}}, got {type(changes).__name__}")
    tables = {t.name: t for t in module._tables}
    unknown = sorted((k for k in changes if k not in tables), key=repr)
    if unknown:
        raise ValueError(f"changes name unknown tables {unknown}; tables are {list(tables)}")
    out = {}
    for name, ps in changes.items():
        if not isinstance(ps, ParameterSharding) or not isinstance(ps.sharding_type, ShardingType):
            raise TypeError(f"changes[{name!r}] must be a ParameterSharding (e.g. row_wise()), got {ps!r}")
        try:
            out[name] = list(SHARDERS[ps.sharding_type].layout(tables[name], ps, module._topo))
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"changes[{name!r}] = {ps!r} is not a valid sharding ({exc}); build it with "
                             f"table_wise/row_wise/column_wise/table_row_wise/data_parallel") from None
    plan = {**current_plan(module), **changes}
    module._check_rule(module.fused_optimizer.rule, plan)
    return out


def _step_vector(module) -> list:
    """Per table (config order): the optimizer step of the buffer holding it here, -1 if none."""
    steps = {}
    for g in module._groups:
        for i, b in enumerate(g.routing.boxes):
            if b.rank == module._topo.rank:
                steps[b.table] = g.store.steps[g.store.loc[i][0]]
    return [steps.get(t.name, -1) for t in module._tables]


def _check_chunk(chunk_bytes) -> int:
    if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes < 64:
        raise ValueError(f"reshard: chunk_bytes={chunk_bytes!r} must be an int >= 64 (bytes per message; the "
                         f"default is {CHUNK_BYTES})")
    return chunk_bytes


def _agree(module, changes, limit: Optional[int], chunk_bytes) -> tuple:
    """Validate everywhere, then agree: one all-gather of (digest, chunk size, ok, steps). Raises the same
    error on every rank before anything changes; returns ({table: new boxes}, {table: step})."""
    topo = module._topo
    error, new = None, {}
    chunk = chunk_bytes if isinstance(chunk_bytes, int) and not isinstance(chunk_bytes, bool) else -1
    try:
        _check_chunk(chunk_bytes)
        new = _new_boxes(module, changes)
        _memory_check(module, {**current_plan(module), **changes}, new, limit)
    except (TypeError, ValueError) as exc:
        error = exc
    row = list(changes_digest(changes)) + [chunk, 0 if error is None else 1] + _step_vector(module)
    rows = all_gather_ints(row, topo.world_size, topo.group, topo.device)
    if any(r[:33] != rows[0][:33] for r in rows):
        differ = [r for r in range(topo.world_size) if rows[r][:33] != rows[0][:33]]
        raise ValueError(f"reshard: changes differ across ranks (ranks {differ} differ from rank 0 in the changes or "
                         f"chunk_bytes); every rank must pass the same changes and chunk_bytes, nothing was moved")
    if error is not None:
        raise error
    bad = [r for r in range(topo.world_size) if rows[r][33]]
    if bad:
        raise ValueError(f"reshard: ranks {bad} rejected the changes; nothing was moved")
    steps = {t.name: max(r[34 + k] for r in rows) for k, t in enumerate(module._tables)}
    return new, steps


def _set_steps(groups: list, steps: dict) -> None:
    for g in groups:
        per_width: dict = {}
        for i, (w, _) in g.store.loc.items():
            per_width.setdefault(w, set()).add(steps[g.store.boxes[i].table])
        for w, found in per_width.items():
            # tables sharing a buffer share one step count; _check_steps refused a mismatch earlier
            g.store.steps[w] = max(found)


def _check_steps(module, plan: dict, new_boxes: dict, steps: dict) -> None:
    """Tables that would share a new width buffer on some rank must have the same step count (from
    all-gathered data, so identical everywhere)."""
    if module.fused_optimizer.rule is None:
        return
    boxes = {t.name: [b for g in module._groups for b in g.spec.boxes if b.table == t.name]
             for t in module._tables}
    boxes.update(new_boxes)
    seen: dict = {}
    for t in module._tables:
        for b in boxes[t.name]:
            if b.row_size and b.col_size:
                key = (plan[t.name].sharding_type.value, b.rank, b.col_size)
                seen.setdefault(key, {})[t.name] = steps[t.name]
    for key, per_table in seen.items():
        if len(set(per_table.values())) > 1:
            raise ValueError(f"reshard: tables {sorted(per_table)} would share a buffer on rank {key[1]} but "
                             f"have different optimizer step counts {per_table}; load a consistent "
                             f"optimizer state first")


def _memory_check(module, plan: dict, new_boxes: dict, limit: Optional[int]) -> None:
    if limit is None:
        return
    kinds = state_kinds(module.fused_optimizer.rule)
    per_rank = [0] * module._topo.world_size
    old = {b.table: [] for b in module.boxes()}
    for b in module.boxes():
        old[b.table].append(b)
    old.update(new_boxes)
    for boxes in old.values():
        for b in boxes:
            per_rank[b.rank] += sum(itemsize(w, module._dtype) * b.row_size * (b.col_size if k == "elem" else 1)
                                    for w, k in kinds)
    over = [r for r, n in enumerate(per_rank) if n > limit]
    if over:
        raise ValueError(f"reshard: the new layout needs {[per_rank[r] for r in over]} bytes on ranks {over}, "
                         f"over max_bytes_per_rank={limit}; spread the tables over more ranks or raise the limit")


def _rebuild_groups(module, plan: dict, affected: set) -> list:
    """New group list in ShardingType order: affected types built afresh with new, uninitialised
    stores (the move writes every element; never a copy of the full tables), the others kept."""
    old = {g.sharding_type: g for g in module._groups}
    cols = next(iter(old.values())).spec.feature_cols
    rule, hp = module.fused_optimizer.rule, module.fused_optimizer.hp
    groups = []
    for st in ShardingType:
        tables = [t for t in module._tables if plan[t.name].sharding_type == st]
        if not tables:
            continue
        groups.append(old[st] if st not in affected else module._build_group(st, tables, plan, cols, None, rule, hp))
    return groups


def _kept_pieces(groups: list, moved: set, me: int) -> list:
    """Whole boxes of unmoved tables in rebuilt groups: they stay on this rank, unchanged."""
    return [Piece(b.table, me, me, b.row_offset, b.row_offset + b.row_size, b.col_offset,
                  b.col_offset + b.col_size, b, b)
            for g in groups for b in g.routing.boxes if b.rank == me and b.table not in moved]


def _count_bytes(stats: ReshardStats, pieces: list, kinds: list, dtype, me: int) -> None:
    for p in pieces:
        n = sum(piece_numel(p, k) * itemsize(w, dtype) for w, k in kinds)
        if p.src != p.dst:
            stats.bytes_sent[p.src] += n
            stats.bytes_received[p.dst] += n
            stats.bytes_matrix[p.src][p.dst] += n
        elif p.src == me:
            stats.bytes_local += n


def _move(module, plan: dict, affected: set, pieces: list, moved: set, stats: ReshardStats, chunk: int) -> tuple:
    """Rebuild the affected groups with new stores and fill them: the moved pieces and, inside the
    rebuilt groups, the unmoved tables' boxes (local copies, none where a store took over the old
    buffer they sit in). Returns (all groups, rebuilt groups)."""
    topo = module._topo
    old_groups = [g for g in module._groups if g.sharding_type in affected]
    old_index = local_index(old_groups)
    groups = _rebuild_groups(module, plan, affected)
    rebuilt = [g for g in groups if g.sharding_type in affected]
    adopt_buffers(old_groups, rebuilt)
    new_index = local_index(rebuilt)

    def views(box, what, old: bool):
        store, i = (old_index if old else new_index)[box]
        return store.box_view(i, what)
    every = pieces + _kept_pieces(rebuilt, moved, topo.rank)
    kinds = state_kinds(module.fused_optimizer.rule)
    moves = plan_moves(every, kinds, views, topo.rank, topo.world_size, module._dtype, chunk)
    if moves.conflicts:   # taken-over buffers the loop's order cannot protect: new memory for them
        release(rebuilt, moves.conflicts)
        moves = plan_moves(every, kinds, views, topo.rank, topo.world_size, module._dtype, chunk)
    done = exchange(moves, topo.group, topo.device)
    stats.transient_bytes = done["transient_peak"]
    stats.bytes_reused, stats.bytes_allocated = memory_split(old_groups, rebuilt)
    return groups, rebuilt


def reshard(module, changes: dict, *, max_bytes_per_rank: Optional[int] = None,
            chunk_bytes: int = CHUNK_BYTES) -> ReshardStats:
    """Move the tables named in ``changes`` to their new shardings, with all their optimizer state.

    Collective: every rank calls it with the same ``changes`` (``{table: ParameterSharding}``, any
    sharding type to any other, other ranks, other shard counts). Tables not named keep their shards
    and state untouched. Anything invalid (unknown table, rank out of range, changes differing across
    ranks, a layout over ``max_bytes_per_rank``) raises the same ValueError/TypeError on every rank
    before anything changes. Forwards and training continue afterwards exactly as if the module had
    been sharded with the new plan from the start.

    Memory: the rebuilt sharding-type groups get new stores (the old ones are freed when the move
    ends; a new buffer takes over an old one of the same shape when the move's order allows, see
    ``stats.bytes_reused``); beyond those, the move holds at most four message buffers of ``chunk_bytes``
    (two rounds on the wire x two directions, ``stats.transient_bytes``), whatever the size of the move.

    Example:
        >>> stats = reshard(sharded, {"t0": table_wise(1)})      # doctest: +SKIP
        >>> stats.bytes_sent                                     # doctest: +SKIP
        [8192, 0]
    """
    t0 = time.perf_counter()
    topo = module._topo
    new_boxes, steps = _agree(module, changes, max_bytes_per_rank, chunk_bytes)
    old_plan = current_plan(module)
    plan = {**old_plan, **changes}
    old_boxes = {t.name: [] for t in module._tables}
    for b in module.boxes():
        old_boxes[b.table].append(b)
    moved = [t.name for t in module._tables if t.name in new_boxes and
             (new_boxes[t.name] != old_boxes[t.name] or plan[t.name].sharding_type != old_plan[t.name].sharding_type)]
    _check_steps(module, plan, new_boxes, steps)
    world = topo.world_size
    stats = ReshardStats(moved, [0] * world, [0] * world, bytes_matrix=[[0] * world for _ in range(world)])
    if not moved:
        stats.wall_time_s = time.perf_counter() - t0
        return stats
    affected = {old_plan[n].sharding_type for n in moved} | {plan[n].sharding_type for n in moved}
    replicated = {n for n in moved if old_plan[n].sharding_type == ShardingType.DATA_PARALLEL}
    pieces = plan_pieces([t.name for t in module._tables], old_boxes, {n: new_boxes[n] for n in moved}, replicated)
    _count_bytes(stats, pieces, state_kinds(module.fused_optimizer.rule), module._dtype, topo.rank)
    groups, rebuilt = _move(module, plan, affected, pieces, set(moved), stats, chunk_bytes)
    _set_steps(rebuilt, steps)
    # the one place routing state changes: groups carry routing, stores and stages together
    module._groups = groups
    module._reset_load_stats()
    stats.wall_time_s = time.perf_counter() - t0
    return stats
