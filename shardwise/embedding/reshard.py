"""Live resharding: move tables of a sharded collection to new shardings while training continues.

The whole move is planned from shard boxes that every rank knows: the overlap of each table's old
and new boxes gives a list of pieces (table, source rank, destination rank, rectangle). Pieces whose
source and destination are the same rank are copied locally; the rest cross the wire in one batch
of point-to-point messages (tags = positions in the shared piece list), straight from the old shard
views into the new ones, carrying weights and every optimizer-state buffer of the moved tables.
Only the sharding-type groups that gain or lose a table are rebuilt; the others are left alone.

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

import torch

from .comm import all_gather_ints
from .reshard_memory import fresh
from .reshard_move import exchange, local_index, new_layouts, new_memory, piece_numel
from .plan import ParameterSharding, ShardBox, ShardingType, column_wise, data_parallel, row_wise, \
    table_row_wise, table_wise
from .sharding import SHARDERS

__all__ = ["ReshardStats", "Piece", "reshard", "current_plan", "plan_pieces", "changes_digest"]


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


@dataclass(frozen=True)
class Piece:
    """Rows [r0, r1) x columns [c0, c1) of ``table`` going from ``src`` (inside ``src_box``) to
    ``dst`` (inside ``dst_box``)."""

    table: str
    src: int
    dst: int
    r0: int
    r1: int
    c0: int
    c1: int
    src_box: ShardBox
    dst_box: ShardBox


def current_plan(module) -> dict:
    """``{table: ParameterSharding}`` that reproduces ``module``'s current boxes.

    Example:
        >>> current_plan(sharded)["t0"]                          # doctest: +SKIP
        ParameterSharding(sharding_type=<ShardingType.ROW_WISE: 'row_wise'>, ranks=(0, 1), host_index=None)
    """
    out = {}
    for g in module._groups:
        for t in g.spec.tables:
            ranks = tuple(b.rank for b in g.spec.boxes if b.table == t.name)
            st = g.sharding_type
            if st == ShardingType.DATA_PARALLEL:
                out[t.name] = data_parallel()
            elif st == ShardingType.TABLE_WISE:
                out[t.name] = table_wise(ranks[0])
            elif st == ShardingType.ROW_WISE:
                out[t.name] = row_wise(ranks)
            elif st == ShardingType.COLUMN_WISE:
                out[t.name] = column_wise(ranks)
            else:
                out[t.name] = table_row_wise(list(module._topo.hosts).index(ranks))
    return {t.name: out[t.name] for t in module._tables}


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


def _kinds(rule) -> list:
    """(state name or None for the weight, 'elem' | 'row') in a fixed order shared by all ranks."""
    return [(None, "elem")] + ([(n, k) for n, k in rule.state_shapes.items()] if rule is not None else [])


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


def _agree(module, changes, limit: Optional[int] = None) -> tuple:
    """Validate everywhere, then agree: one all-gather of (digest, ok, steps). Raises the same error on
    every rank before anything changes; returns ({table: new boxes}, {table: step})."""
    topo = module._topo
    error, new = None, {}
    try:
        new = _new_boxes(module, changes)
        _memory_check(module, {**current_plan(module), **changes}, new, limit)
    except (TypeError, ValueError) as exc:
        error = exc
    row = list(changes_digest(changes)) + [0 if error is None else 1] + _step_vector(module)
    rows = all_gather_ints(row, topo.world_size, topo.group, topo.device)
    if any(r[:32] != rows[0][:32] for r in rows):
        differ = [r for r in range(topo.world_size) if rows[r][:32] != rows[0][:32]]
        raise ValueError(f"reshard: changes differ across ranks (ranks {differ} differ from rank 0); every rank "
                         f"must pass the same changes, nothing was moved")
    if error is not None:
        raise error
    bad = [r for r in range(topo.world_size) if rows[r][32]]
    if bad:
        raise ValueError(f"reshard: ranks {bad} rejected the changes; nothing was moved")
    steps = {t.name: max(r[33 + k] for r in rows) for k, t in enumerate(module._tables)}
    return new, steps


def plan_pieces(tables: list, old: dict, new: dict, replicated: set) -> list:
    """Overlap of old and new boxes, in a canonical order (table config order, new box, old box).

    ``tables``: names in config order; ``old``/``new``: {table: [ShardBox]}; ``replicated``: tables
    whose old boxes are full replicas (data-parallel) -- a destination reads its own replica when it
    has one, else the replica on ``dst % replicas`` so the sources spread.
    """
    out = []
    for name in tables:
        if name not in new:
            continue
        olds = [b for b in old[name] if b.row_size > 0 and b.col_size > 0]
        for nb in new[name]:
            if nb.row_size == 0 or nb.col_size == 0:
                continue
            cands = olds
            if name in replicated:
                cands = [b for b in olds if b.rank == nb.rank] or [olds[nb.rank % len(olds)]]
            for ob in cands:
                r0, r1 = max(ob.row_offset, nb.row_offset), min(ob.row_offset + ob.row_size,
                                                                nb.row_offset + nb.row_size)
                c0, c1 = max(ob.col_offset, nb.col_offset), min(ob.col_offset + ob.col_size,
                                                                nb.col_offset + nb.col_size)
                if r1 > r0 and c1 > c0:
                    out.append(Piece(name, ob.rank, nb.rank, r0, r1, c0, c1, ob, nb))
    return out


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
    kinds = _kinds(module.fused_optimizer.rule)
    item = torch.empty(0, dtype=module._dtype).element_size()
    per_rank = [0] * module._topo.world_size
    old = {b.table: [] for b in module.boxes()}
    for b in module.boxes():
        old[b.table].append(b)
    old.update(new_boxes)
    for boxes in old.values():
        for b in boxes:
            per_rank[b.rank] += item * sum(b.row_size * (b.col_size if k == "elem" else 1) for _, k in kinds)
    over = [r for r, n in enumerate(per_rank) if n > limit]
    if over:
        raise ValueError(f"reshard: the new layout needs {[per_rank[r] for r in over]} bytes on ranks {over}, "
                         f"over max_bytes_per_rank={limit}; spread the tables over more ranks or raise the limit")


def _rebuild_groups(module, plan: dict, affected: set, memory: dict) -> list:
    """New group list in ShardingType order: affected types built afresh (buffers from ``memory`` --
    carved out of the old stores -- or fresh and uninitialised, never a copy of the full tables), the
    others kept as they are."""
    old = {g.sharding_type: g for g in module._groups}
    cols = next(iter(old.values())).spec.feature_cols
    rule, hp = module.fused_optimizer.rule, module.fused_optimizer.hp
    dtype, device = module._dtype, module._topo.device
    groups = []
    for st in ShardingType:
        tables = [t for t in module._tables if plan[t.name].sharding_type == st]
        if not tables:
            continue
        if st not in affected:
            groups.append(old[st])
            continue

        def alloc(what, w, shape, st=st):
            t = memory.get((st, what, w))
            return t if t is not None and tuple(t.shape) == tuple(shape) else fresh(shape, dtype, device)
        # no initial weights: the exchange writes every element of the new stores
        groups.append(module._build_group(st, tables, plan, cols, None, rule, hp, alloc=alloc))
    return groups


def _kept_pieces(layouts: dict, moved: set, me: int) -> list:
    """Whole boxes of unmoved tables in rebuilt groups: they stay on this rank, unchanged."""
    return [Piece(b.table, me, me, b.row_offset, b.row_offset + b.row_size, b.col_offset,
                  b.col_offset + b.col_size, b, b)
            for boxes, _, _ in layouts.values() for b in boxes if b.rank == me and b.table not in moved]


def reshard(module, changes: dict, *, max_bytes_per_rank: Optional[int] = None) -> ReshardStats:
    """Move the tables named in ``changes`` to their new shardings, with all their optimizer state.

    Collective: every rank calls it with the same ``changes`` (``{table: ParameterSharding}``, any
    sharding type to any other, other ranks, other shard counts). Tables not named keep their shards
    and state untouched. Anything invalid (unknown table, rank out of range, changes differing across
    ranks, a layout over ``max_bytes_per_rank``) raises the same ValueError/TypeError on every rank
    before anything changes. Forwards and training continue afterwards exactly as if the module had
    been sharded with the new plan from the start.

    Example:
        >>> stats = reshard(sharded, {"t0": table_wise(1)})      # doctest: +SKIP
        >>> stats.bytes_sent                                     # doctest: +SKIP
        [8192, 0]
    """
    t0 = time.perf_counter()
    topo = module._topo
    new_boxes, steps = _agree(module, changes, max_bytes_per_rank)
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
    kinds = _kinds(module.fused_optimizer.rule)
    item = torch.empty(0, dtype=module._dtype).element_size()
    for p in pieces:
        if p.src != p.dst:
            n = sum(piece_numel(p, k) for _, k in kinds) * item
            stats.bytes_sent[p.src] += n
            stats.bytes_received[p.dst] += n
            stats.bytes_matrix[p.src][p.dst] += n
    old_groups = [g for g in module._groups if g.sharding_type in affected]
    old_index = local_index(old_groups)
    layouts = new_layouts(module, plan, affected)
    kept = _kept_pieces(layouts, set(moved), topo.rank)
    local = [p for p in pieces if p.src == p.dst == topo.rank] + kept
    memory = new_memory(layouts, local, kinds, old_index, old_groups)
    groups = _rebuild_groups(module, plan, affected, memory)
    rebuilt = [g for g in groups if g.sharding_type in affected]
    stats.bytes_local = exchange(module, pieces, kept, kinds, (old_index, local_index(rebuilt)))
    _set_steps(rebuilt, steps)
    # the one place routing state changes: groups carry routing, stores and stages together
    module._groups = groups
    if hasattr(module, "_reset_load_stats"):
        module._reset_load_stats()
    stats.wall_time_s = time.perf_counter() - t0
    return stats
