"""Lookup load measured during training, and rebalancing proposals made from it.

A sharded collection counts, per table, the ids of each forward in fixed row buckets (where the
hot rows are) and per source rank (who asks). :func:`load_stats` sums the counts over ranks into a
:class:`LoadStats`; :func:`propose_rebalance` turns it into ``changes`` for :func:`reshard`.

The load model: a shard's work per step is ids routed to it x its columns (the embedding_bag
work). Data-parallel tables serve each rank's own ids; other tables serve every rank's ids that
fall into the shard's rows (estimated from the row buckets, uniform within a bucket).

Example:
    >>> stats = sharded.load_stats()                                   # doctest: +SKIP
    >>> changes = propose_rebalance(stats, max_bytes=256 << 20)        # doctest: +SKIP
    >>> sharded.reshard(changes)                                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..sparse import KeyedJaggedTensor
from .plan import ParameterSharding, ShardingType, column_wise, data_parallel, row_wise, table_wise
from .reshard import _kinds, current_plan, plan_pieces
from .sharding import SHARDERS

__all__ = ["LookupCounter", "TableLoad", "LoadStats", "load_stats", "propose_rebalance"]

BUCKETS = 64


class LookupCounter:
    """Local per-table id counts of every forward: ``hist[t]`` over row buckets, ``ids[t]`` total.

    Counting stays on the device (no host sync per step); :func:`load_stats` reduces it.
    """

    def __init__(self, tables, device, buckets: int = BUCKETS):
        self.tables, self.device = list(tables), device
        self.buckets = [min(buckets, t.num_embeddings) for t in self.tables]
        self._table_of = {f: i for i, t in enumerate(self.tables) for f in t.feature_names}
        self.reset()

    def reset(self) -> None:
        self.hist = [torch.zeros(n, dtype=torch.int64, device=self.device) for n in self.buckets]
        self.steps = 0

    def observe(self, kjt) -> None:
        self.steps += 1
        per_key = kjt.offset_per_key()
        values = kjt.values()
        for k, f in enumerate(kjt.keys()):
            i = self._table_of.get(f)
            if i is None:
                continue
            ids = values[per_key[k]:per_key[k + 1]].to(self.device, torch.int64)
            # out-of-range ids are the forward's to reject (on every rank); counting them here would
            # raise on this rank alone, before the forward's agreement, and leave the others hanging
            ids = ids[(ids >= 0) & (ids < self.tables[i].num_embeddings)]
            bucket = ids * self.buckets[i] // self.tables[i].num_embeddings
            self.hist[i] += torch.bincount(bucket, minlength=self.buckets[i])[:self.buckets[i]]

    def hook(self, module, args) -> None:
        """forward pre-hook: count the batch the module is about to look up (anything but a
        KeyedJaggedTensor is left to the forward, which rejects it on every rank)."""
        if args and isinstance(args[0], KeyedJaggedTensor):
            self.observe(args[0])


@dataclass(frozen=True)
class TableLoad:
    """One table's measured load (identical on every rank).

    ``hist``: ids per step in each of ``len(hist)`` equal row buckets, summed over ranks;
    ``per_rank``: ids per step each rank's batches asked for; ``bytes_per_elem``: weight + optimizer
    state bytes per weight element (per-row state spread over the row).
    """

    name: str
    rows: int
    dim: int
    bytes_per_elem: float
    sharding: ParameterSharding
    boxes: tuple
    hist: tuple
    per_rank: tuple
    row_state: bool = False   # the optimizer keeps per-row state: column-wise is not allowed

    def ids_in_rows(self, r0: int, r1: int) -> float:
        """Estimated ids per step that hit rows [r0, r1) (uniform within a bucket)."""
        n, total = len(self.hist), 0.0
        for b, count in enumerate(self.hist):
            lo, hi = -(-b * self.rows // n), -(-(b + 1) * self.rows // n)   # rows whose bucket is b
            overlap = min(hi, r1) - max(lo, r0)
            if overlap > 0 and hi > lo:
                total += count * overlap / (hi - lo)
        return total

    def rank_load(self, boxes, sharding_type: ShardingType, world: int) -> list:
        """Lookup work per rank per step (ids x columns) if the table had ``boxes``."""
        out = [0.0] * world
        if sharding_type == ShardingType.DATA_PARALLEL:
            for r in range(world):
                out[r] += self.per_rank[r] * self.dim
            return out
        for b in boxes:
            if b.row_size and b.col_size:
                out[b.rank] += self.ids_in_rows(b.row_offset, b.row_offset + b.row_size) * b.col_size
        return out


@dataclass(frozen=True)
class LoadStats:
    """Measured load of a sharded collection: ``tables`` in config order, over ``steps`` forwards.

    ``per_rank()``: lookup work per rank per step; ``per_table()``: ``{table: [(rank, ids per step,
    ids x columns per step) per shard]}``.

    Example:
        >>> stats = sharded.load_stats(); stats.per_rank()      # doctest: +SKIP
        [5120.0, 1024.0]
    """

    world_size: int
    steps: int
    tables: tuple
    hosts: tuple = ()

    def per_rank(self) -> list:
        out = [0.0] * self.world_size
        for t in self.tables:
            for r, x in enumerate(t.rank_load(t.boxes, t.sharding.sharding_type, self.world_size)):
                out[r] += x
        return out

    def per_table(self) -> dict:
        out = {}
        for t in self.tables:
            dp = t.sharding.sharding_type == ShardingType.DATA_PARALLEL
            for b in t.boxes:
                n = t.per_rank[b.rank] if dp else t.ids_in_rows(b.row_offset, b.row_offset + b.row_size)
                out.setdefault(t.name, []).append((b.rank, n, n * b.col_size))
        return out


def load_stats(module, reset: bool = False) -> LoadStats:
    """Collective: the module's lookup counts summed over ranks, per step (see :class:`LoadStats`).

    Example:
        >>> load_stats(sharded).per_rank()                      # doctest: +SKIP
    """
    counter = module._lookup_counter
    topo = module._topo
    world, me = topo.world_size, topo.rank
    local = [h for h in counter.hist]
    per_rank = torch.zeros(len(module._tables), world, dtype=torch.int64, device=topo.device)
    for i, h in enumerate(local):
        per_rank[i, me] = h.sum()
    flat = torch.cat([h for h in local] + [per_rank.flatten(), torch.tensor([counter.steps], device=topo.device)])
    dist.all_reduce(flat, group=topo.group)
    # steps are counted on every rank; the sum over ranks / world is the common count
    steps = max(int(flat[-1].item()) // world, 1)
    flat = flat[:-1].double() / steps
    plan, boxes = current_plan(module), module.boxes()
    kinds = _kinds(module.fused_optimizer.rule)
    item = torch.empty(0, dtype=module._dtype).element_size()
    tables, start = [], 0
    per_rank_all = flat[sum(counter.buckets):].view(len(module._tables), world)
    for i, t in enumerate(module._tables):
        n = counter.buckets[i]
        hist = tuple(flat[start:start + n].tolist())
        start += n
        bpe = item * sum(1.0 if k == "elem" else 1.0 / t.embedding_dim for _, k in kinds)
        tables.append(TableLoad(t.name, t.num_embeddings, t.embedding_dim, bpe, plan[t.name],
                                tuple(b for b in boxes if b.table == t.name), hist,
                                tuple(per_rank_all[i].tolist()), any(k == "row" for _, k in kinds)))
    if reset:
        counter.reset()
    return LoadStats(world, steps, tuple(tables), tuple(topo.hosts))


@dataclass(frozen=True)
class _Cfg:
    name: str
    num_embeddings: int
    embedding_dim: int


@dataclass(frozen=True)
class _Topo:
    world_size: int
    hosts: tuple


def _candidates(t: TableLoad, world: int) -> list:
    """Shardings tried for one table, in a fixed order (ties go to the earlier one)."""
    out = [table_wise(r) for r in range(world)] + [row_wise()]
    if t.dim >= world and not t.row_state:
        out.append(column_wise(list(range(world))))
    out.append(data_parallel())
    return out


def _moved_bytes(t: TableLoad, new_boxes: list, world: int) -> float:
    """Bytes that would cross the wire (weights + optimizer state) for this table's move."""
    replicated = {t.name} if t.sharding.sharding_type == ShardingType.DATA_PARALLEL else set()
    pieces = plan_pieces([t.name], {t.name: list(t.boxes)}, {t.name: new_boxes}, replicated)
    return sum((p.r1 - p.r0) * (p.c1 - p.c0) for p in pieces if p.src != p.dst) * t.bytes_per_elem


def _score(load: list) -> tuple:
    # lowest maximum first; then the most even spread (sum of squares)
    return (max(load), sum(x * x for x in load))


def propose_rebalance(load_stats: LoadStats, max_bytes: int) -> dict:
    """``changes`` for :func:`reshard` that lower the maximum per-rank lookup load, moving at most
    ``max_bytes`` (weights + optimizer state that cross the wire). Empty when nothing helps.

    ``load_stats`` is a :class:`LoadStats` from ``sharded.load_stats()`` (collective; per table: ids
    per step in row buckets and per asking rank, current boxes, bytes per element). The proposal is
    a pure function of it -- greedy, one table at a time, each table moved at most once, ties broken
    by table order -- so every rank proposes the same changes.

    Example:
        >>> changes = propose_rebalance(sharded.load_stats(), max_bytes=1 << 30)   # doctest: +SKIP
        >>> reshard(sharded, changes)                                            # doctest: +SKIP
    """
    if not isinstance(load_stats, LoadStats):
        raise TypeError(f"load_stats must be a LoadStats (from sharded.load_stats()), got "
                        f"{type(load_stats).__name__}; it carries the table sizes and boxes a proposal needs")
    if not isinstance(max_bytes, (int, float)) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ValueError(f"max_bytes={max_bytes!r} must be a number >= 0 (bytes that may move)")
    world = load_stats.world_size
    topo = _Topo(world, load_stats.hosts or (tuple(range(world)),))
    loads = {t.name: t.rank_load(t.boxes, t.sharding.sharding_type, world) for t in load_stats.tables}
    total = [sum(v[r] for v in loads.values()) for r in range(world)]
    moves, spent = [], 0.0
    best_max, best_len = max(total), 0
    while True:
        best = None
        for t in load_stats.tables:
            if any(name == t.name for name, _ in moves):
                continue
            for ps in _candidates(t, world):
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
