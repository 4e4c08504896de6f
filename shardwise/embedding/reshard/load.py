"""Lookup load measured during training: what a sharded collection counts and what it sums over ranks.

A sharded collection counts, per table, the ids of each forward in fixed row buckets (where the
hot rows are) and per source rank (who asks). :func:`load_stats` sums the counts over ranks into a
:class:`LoadStats`, the input of :func:`~shardwise.embedding.propose_rebalance`.

The load model: a shard's work per step is ids routed to it x its columns (the embedding_bag
work). Data-parallel tables serve each rank's own ids; other tables serve every rank's ids that
fall into the shard's rows (estimated from the row buckets, uniform within a bucket).

Example:
    >>> stats = sharded.load_stats(); stats.per_rank()                 # doctest: +SKIP
    [5120.0, 1024.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...sparse import KeyedJaggedTensor
from ..plan.values import ParameterSharding, ShardingType
from .pieces import itemsize, state_kinds

__all__ = ["LookupCounter", "TableLoad", "LoadStats", "load_stats", "BUCKETS"]

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
    plan, boxes = module.sharding_plan(), module.boxes()
    kinds = state_kinds(module.fused_optimizer.rule)
    tables, start = [], 0
    per_rank_all = flat[sum(counter.buckets):].view(len(module._tables), world)
    for i, t in enumerate(module._tables):
        n = counter.buckets[i]
        hist = tuple(flat[start:start + n].tolist())
        start += n
        bpe = sum(itemsize(w, module._dtype) * (1.0 if k == "elem" else 1.0 / t.embedding_dim) for w, k in kinds)
        tables.append(TableLoad(t.name, t.num_embeddings, t.embedding_dim, bpe, plan[t.name],
                                tuple(b for b in boxes if b.table == t.name), hist,
                                tuple(per_rank_all[i].tolist()), any(k == "row" for _, k in kinds)))
    if reset:
        counter.reset()
    return LoadStats(world, steps, tuple(tables), tuple(topo.hosts))
