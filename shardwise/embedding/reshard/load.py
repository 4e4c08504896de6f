"""Lookup load measured during training: what a sharded collection counts and what it sums over ranks.

A sharded collection counts, per table, the ids of each forward in fixed row buckets (where the
hot rows are) and per source rank (who asks). :func:`load_stats` sums the counts over ranks into a
:class:`LoadStats`, the input of :func:`~shardwise.embedding.propose_rebalance`.

The load model: a shard's work per step is ids routed to it x its columns (the embedding_bag
work). Data-parallel tables serve each rank's own ids; other tables serve every rank's ids that
fall into the shard's rows (estimated from the row buckets, uniform within a bucket).

Example (in a process group of one rank; three ids of a 4-wide table in one forward):
    >>> import torch
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, table_wise
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(8, 4, "t0", feature_names=["f0"])])
    >>> sharded = shard(ebc, {"t0": table_wise(0)})
    >>> _ = sharded(KeyedJaggedTensor(["f0"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1])))
    >>> stats = load_stats(sharded)                  # the same as sharded.load_stats(); collective
    >>> stats.per_rank(), stats.per_table()          # ids x columns per step; (rank, ids, ids x columns) per shard
    ([12.0], {'t0': [(0, 3.0, 12.0)]})
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
    """Local per-table id counts: ``hist[t]`` over row buckets (views of one flat buffer).

    ``sample(kjt)`` counts every ``every``-th batch it is shown (the first one after a reset always):
    the reshard needs the shape of the load, which a sample of the steps gives, and the counting
    stays off most steps. Counting stays on the device (no host sync); :func:`load_stats` reduces it
    and divides by the batches counted, so the figures are ids per step either way.
    """

    def __init__(self, tables, device, buckets: int = BUCKETS, every: int = 1):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"LookupCounter: every={every!r} must be an int >= 1 (count every k-th batch)")
        self.tables, self.device, self.every = list(tables), device, every
        self.buckets = [min(buckets, t.num_embeddings) for t in self.tables]
        self._table_of = {f: i for i, t in enumerate(self.tables) for f in t.feature_names}
        self._starts = [0]
        for n in self.buckets:
            self._starts.append(self._starts[-1] + n)
        self._per_keys: dict = {}   # (keys, checked) -> per-key (rows, buckets, first bucket) tensors
        self.reset()

    def reset(self) -> None:
        self._flat = torch.zeros(self._starts[-1], dtype=torch.int64, device=self.device)
        self.hist = [self._flat[a:b] for a, b in zip(self._starts, self._starts[1:])]
        self.steps, self.seen = 0, 0

    def sample(self, kjt, checked: bool = False) -> None:
        """Count ``kjt`` if it is the first batch since the reset or every ``every``-th after it
        (``checked``: every id is known to be inside its table, see :meth:`observe`)."""
        if self.seen % self.every == 0:
            self.observe(kjt, checked)
        self.seen += 1

    def _key_tensors(self, keys: tuple, checked: bool):
        """(dtype, one size for every key, per-key rows, buckets, first bucket) for ``keys``."""
        if (keys, checked) not in self._per_keys:
            idx = [self._table_of.get(f) for f in keys]
            rows = [self.tables[i].num_embeddings if i is not None else 0 for i in idx]   # 0: never counted
            nb = [self.buckets[i] if i is not None else 0 for i in idx]
            first = [self._starts[i] if i is not None else 0 for i in idx]
            # checked ids x buckets below 2**31: the arithmetic runs on int32 (CPU divides int32 several
            # times faster than int64), the same integers; unchecked ids stay int64 (a cast could wrap them)
            fits = checked and max(rows, default=0) * max(nb, default=0) < 2 ** 31
            dtype = torch.int32 if fits else torch.int64
            same = len(set(zip(rows, nb))) == 1
            self._per_keys[keys, checked] = (dtype, same, *(torch.tensor(v, dtype=dtype, device=self.device)
                                                            for v in (rows, nb, first)))
        return self._per_keys[keys, checked]

    def observe(self, kjt, checked: bool = False) -> None:
        """Count every id of ``kjt`` (one bincount over all tables' buckets). Out-of-range ids are the
        forward's to reject (on every rank): counting them here would raise on this rank alone, before
        the forward's agreement, and leave the others hanging, so they land in one extra bucket that is
        dropped; ``checked=True`` (the forward checked every id already) skips that test."""
        self.steps += 1
        values = kjt.values()
        n = values.numel()
        if n == 0 or not kjt.keys():
            return
        dtype, same, rows, nb, first = self._key_tensors(tuple(kjt.keys()), checked)
        per_key = torch.tensor(kjt.length_per_key(), device=self.device)
        ids = values.to(self.device, dtype)
        total = self._starts[-1]
        if same:   # one table size and bucket count: only the first bucket differs per key
            first_v = torch.repeat_interleave(first, per_key, output_size=n)
            rows_v, nb_v = rows[:1], nb[:1]
        else:
            key = torch.repeat_interleave(torch.arange(len(rows), device=self.device), per_key, output_size=n)
            first_v, rows_v, nb_v = first.index_select(0, key), rows.index_select(0, key), nb.index_select(0, key)
        scaled = (ids if checked else ids.clamp(min=0)) * nb_v
        bucket = first_v.add_(torch.div(scaled, rows_v.clamp(min=1), rounding_mode="floor"))
        if not checked:
            bucket = torch.where((ids >= 0) & (ids < rows_v), bucket, total)
        self._flat += torch.bincount(bucket, minlength=total + 1)[:total]

    def hook(self, module, args) -> None:
        """forward pre-hook: count the batch the module is about to look up (anything but a
        KeyedJaggedTensor is left to the forward, which rejects it on every rank)."""
        if args and isinstance(args[0], KeyedJaggedTensor):
            self.sample(args[0])


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

    Example: see the module's.
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

    Example: see the module's.
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
