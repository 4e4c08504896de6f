"""Tables stacked into one buffer per (dtype, width): one pooled lookup and one fused update per buffer,
whatever the number of tables (how :class:`~shardwise.embedding.FusedEmbeddingBagCollection` runs).

A table's rows live at a base row of its buffer (a :class:`~shardwise.embedding.sharding.store.ShardStore`
holding every table as one box on rank 0); a feature's ids are shifted by its table's base, so the bags of
all features of a buffer are one ``embedding_bag`` call over the batch's key-major values as they come
(no per-feature split). The backward of that call applies the optimizer to the touched rows of the whole
buffer at once. Ids are checked against their own table's rows first: a stacked lookup would otherwise
read a neighbouring table's rows for an out-of-range id instead of failing.

Example:
    >>> from shardwise.embedding import EmbeddingBagConfig
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> tables = [EmbeddingBagConfig(10, 4, f"t{i}", feature_names=[f"f{i}"]) for i in range(3)]
    >>> stack = StackedTables(tables, init_seed=0, device="cpu")
    >>> [tuple(b.shape) for b in stack.buffers()]          # three tables of width 4: one buffer
    [(30, 4)]
    >>> kjt = KeyedJaggedTensor(["f0", "f1", "f2"], torch.tensor([1, 2, 9]), lengths=torch.tensor([1, 1, 1]))
    >>> stack.lookup(kjt, torch.zeros((), requires_grad=True)).shape   # batch 1, 3 features x 4
    torch.Size([1, 12])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ...sparse import KeyedJaggedTensor
from ..plan.values import ShardBox
from ..sharding.store import ShardStore
from .init import fill_rows

__all__ = ["StackedTables"]


@dataclass
class _Slot:
    """One buffer: its store, the buffer index in it, and its features in lookup order."""
    store: ShardStore
    w: int
    features: list          # feature names, in config order
    bases: list             # base row of each feature's table in the buffer
    rows: list              # each feature's table size
    dim: int


@dataclass
class _Plan:
    """How a batch with given keys is looked up (cached per key tuple): the permutation of its keys into
    lookup order (None: already in it), each slot's key range in that order, and per-slot tensors."""
    perm: Optional[list]
    ranges: list            # per slot: (first key, end key) in lookup order; empty when absent
    bases: list             # per slot: int64 tensor of each present feature's base row (None: all 0)
    base_list: list         # per slot: the same base rows as ints
    rows: list              # per slot: int64 tensor of each present feature's table size
    mean: list              # per slot: bool tensor of each present feature's pooling == "mean" (None: all sum)
    present: list           # per slot: the present features' names
    same_rows: list         # per slot: whether every present feature's table has the same size
    in_order: bool          # every feature present, lookup order = config order, one slot per width run


# from this many ids per key on, a loop of one add per key (a few microseconds of Python each) beats
# the per-id shift tensor and its add: one pass over the ids instead of three (on CPU, ~0.65 against
# ~1.3 ms for 206k ids over 100 keys)
_LOOP_IDS_PER_KEY = 1024


class StackedTables:
    """The tables of a collection stacked by (dtype, embedding width); see the module docstring.

    ``rule`` / ``hp`` (from :func:`~shardwise.embedding.optim.rules.resolve_optimizer`) make the lookup's
    backward apply that optimizer; ``hp`` is read at every update (pass the optimizer's param group,
    or set :attr:`hp` when it is replaced). Initial values are the collection's seeded init (then each
    table's ``init_fn``), written straight into the buffers: no table is allocated twice.
    """

    def __init__(self, tables, init_seed: int, device, rule=None, hp: Optional[dict] = None):
        tables = list(tables)
        self.hp = hp or {}
        by_dtype: dict = {}
        for t in tables:
            by_dtype.setdefault(t.data_type.torch_dtype, []).append(t)
        stores = []
        for dtype, group in by_dtype.items():
            by_name = {t.name: t for t in group}
            boxes = [ShardBox(t.name, 0, 0, t.num_embeddings, 0, t.embedding_dim) for t in group]

            def fill(box, out, by_name=by_name):
                table = by_name[box.table]
                fill_rows(out, table, init_seed, 0, 0)
                if table.init_fn is not None:
                    table.init_fn(out)

            stores.append(ShardStore(boxes, 0, fill, device, rule, self.hp, dtype=dtype))
        self._index(tables, stores)

    @classmethod
    def over_store(cls, tables, store: ShardStore) -> "StackedTables":
        """The stacked lookup of ``store``, which holds each of ``tables`` whole (one box of all its rows
        and columns, on the store's rank): a sharded collection whose every shard is local and whole
        looks its batch up this way. The update reads the store's own ``hp`` (``hp`` here is None).

        Example:
            >>> from shardwise.embedding import EmbeddingBagConfig
            >>> tables = [EmbeddingBagConfig(10, 4, f"t{i}", feature_names=[f"f{i}"]) for i in range(2)]
            >>> store = ShardStore([ShardBox(t.name, 0, 0, 10, 0, 4) for t in tables], 0, None, "cpu",
            ...                    dtype=torch.float32)
            >>> stack = StackedTables.over_store(tables, store)
            >>> stack.buffers()[0] is store.buffers[0]
            True
        """
        self = cls.__new__(cls)
        self.hp = None
        self._index(tables, [store])
        return self

    def _index(self, tables, stores: list) -> None:
        """Slots (one per width buffer of each store) and where each table's rows sit in them."""
        self._tables = list(tables)
        self._features = [f for t in self._tables for f in t.feature_names]
        self._slots: list[_Slot] = []
        self._where: dict = {}   # table name -> (slot index, base row, rows)
        self.on_update = None    # called with (slot index) after each update (the optimizer's step counters)
        rows_of = {t.name: t.num_embeddings for t in self._tables}
        for store in stores:
            first = len(self._slots)
            for w, width in enumerate(store.widths):
                self._slots.append(_Slot(store, w, [], [], [], width))
            for i, (w, base) in store.loc.items():
                name = store.boxes[i].table
                if name in rows_of:
                    self._where[name] = (first + w, base, rows_of[name])
        for t in self._tables:
            s, base, _ = self._where[t.name]
            for f in t.feature_names:
                slot = self._slots[s]
                slot.features.append(f)
                slot.bases.append(base)
                slot.rows.append(t.num_embeddings)
        self._mean = {f: t.pooling == "mean" for t in self._tables for f in t.feature_names}
        self._dims = {f: t.embedding_dim for t in self._tables for f in t.feature_names}
        self._plans: dict = {}

    def buffers(self) -> list[torch.Tensor]:
        return [s.store.buffers[s.w] for s in self._slots]

    def table_view(self, name: str, what: Optional[str] = None) -> torch.Tensor:
        """Table ``name``'s rows in its buffer (``what=None``) or in an optimizer state buffer."""
        s, base, rows = self._where[name]
        slot = self._slots[s]
        src = slot.store.buffers[slot.w] if what is None else slot.store.states[slot.w][what]
        return src[base:base + rows]

    def slot_of(self, name: str) -> int:
        return self._where[name][0]

    def step_of(self, slot: int) -> int:
        s = self._slots[slot]
        return s.store.steps[s.w]

    def set_step(self, slot: int, step: int) -> None:
        s = self._slots[slot]
        s.store.steps[s.w] = int(step)

    def lookup(self, kjt: KeyedJaggedTensor, anchor: torch.Tensor, weighted: bool = False,
               per_feature: bool = False, on_bad_id=None):
        """Pooled bags of a checked, fixed-batch ``kjt``: ``[B, sum of dims]`` in config feature order
        (absent features pool to zeros), or ``{feature: [B, dim]}`` with ``per_feature``. A backward
        through it runs the optimizer on every buffer it read (``anchor``: a leaf that requires grad,
        so that backward reaches the lookup). An id outside its table's rows raises ValueError before
        any lookup, or calls ``on_bad_id()`` (which must raise) instead."""
        plan = self._plan(kjt.keys())
        if plan.perm is not None:
            kjt = kjt.permute(plan.perm)
        batch, lengths, values = kjt.stride(), kjt.lengths(), kjt.values().to(torch.int64)
        offsets = kjt.offsets().to(torch.int64)
        psw = kjt.weights() if weighted else None
        ids = self._checked_ids(plan, values, lengths, offsets, batch, on_bad_id)
        pooled = []
        for k, (a, b) in enumerate(plan.ranges):
            if a == b:
                pooled.append(None)
                continue
            lo, (lo_i, hi_i) = offsets[a * batch], ids[k][1]
            part_lengths = lengths[a * batch:b * batch]
            part_offsets = offsets[a * batch:b * batch + 1]
            if lo_i:
                part_offsets = part_offsets - lo
            slot = self._slots[k]
            part_w = None if psw is None else psw[lo_i:hi_i].to(slot.store.buffers[slot.w].dtype)
            out = _StackedLookup.apply(anchor, self, k, ids[k][0], part_offsets, part_w)
            out = out.view(b - a, batch, slot.dim)
            if plan.mean[k] is not None:
                counts = part_lengths.view(b - a, batch).clamp(min=1).to(out.dtype)
                out = out / torch.where(plan.mean[k].unsqueeze(1), counts, torch.ones_like(counts)).unsqueeze(2)
            pooled.append(out)
        if plan.in_order and not per_feature:
            parts = [p.transpose(0, 1).reshape(batch, -1) for p in pooled]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        found = {f: p[j] for p, names in zip(pooled, plan.present) if p is not None for j, f in enumerate(names)}
        dtype = self.buffers()[0].dtype
        device = self.buffers()[0].device
        out = {f: found[f] if f in found else torch.zeros(batch, self._dims[f], dtype=dtype, device=device)
               for f in self._features}
        return out if per_feature else torch.cat(list(out.values()), dim=1)

    def _checked_ids(self, plan: _Plan, values, lengths, offsets, batch: int, on_bad_id) -> list:
        """Per slot with keys: (its ids shifted to their table's base rows, (first, end) in ``values``);
        every slot's ids are checked before the first lookup."""
        out = [None] * len(plan.ranges)
        for k, (a, b) in enumerate(plan.ranges):
            if a != b:
                lo_i, hi_i = int(offsets[a * batch]), int(offsets[b * batch])
                out[k] = (self._shifted_ids(values[lo_i:hi_i], lengths[a * batch:b * batch], batch, plan, k,
                                            on_bad_id), (lo_i, hi_i))
        return out

    def _shifted_ids(self, values, lengths, batch: int, plan: _Plan, k: int, on_bad_id=None) -> torch.Tensor:
        """``values`` (key-major, the slot's keys) shifted to their table's base row, after checking each
        id against its own table's size (ValueError naming the feature otherwise)."""
        nkeys = plan.rows[k].numel()
        per_key = lengths.view(nkeys, batch).sum(1) if nkeys > 1 else None
        if values.numel():
            if per_key is None or plan.same_rows[k]:   # one bound for every id: one pass (min and max)
                low, high = torch.aminmax(values)
                bad = int(low) < 0 or int(high) >= int(plan.rows[k][0])
                limit = plan.rows[k][:1]
            else:
                limit = torch.repeat_interleave(plan.rows[k], per_key, output_size=values.numel())
                bad = bool(((values < 0) | (values >= limit)).any())
            if bad:
                if on_bad_id is not None:
                    on_bad_id()
                self._raise_bad_id(values, limit, per_key, plan.present[k])
        if plan.bases[k] is None:
            return values
        if per_key is None:
            return values + plan.bases[k]
        if values.numel() >= _LOOP_IDS_PER_KEY * nkeys:   # long runs per key: one add per key's slice
            out, at = torch.empty_like(values), 0
            for base, n in zip(plan.base_list[k], per_key.tolist()):
                torch.add(values[at:at + n], base, out=out[at:at + n])
                at += n
            return out
        return values + torch.repeat_interleave(plan.bases[k], per_key, output_size=values.numel())

    @staticmethod
    def _raise_bad_id(values, limit, per_key, names) -> None:
        bad = int(torch.nonzero((values < 0) | (values >= limit))[0])
        key = 0 if per_key is None else int(torch.searchsorted(torch.cumsum(per_key, 0), bad, right=True))
        rows = int(limit.expand_as(values)[bad])
        raise ValueError(f"feature {names[key]!r} has id {int(values[bad])}, but its table has {rows} rows "
                         f"(ids must be in [0, {rows - 1}]); fix the batch or enlarge the table's num_embeddings")

    def _plan(self, keys: list) -> _Plan:
        key = tuple(keys)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(keys)
        return plan

    def _make_plan(self, keys: list) -> _Plan:
        index = {k: i for i, k in enumerate(keys)}
        order, ranges, bases, rows, mean, present = [], [], [], [], [], []
        for slot in self._slots:
            dev = slot.store.buffers[slot.w].device   # the ids' device: the lookup's tensors live there
            names = [f for f in slot.features if f in index]
            ranges.append((len(order), len(order) + len(names)))
            order += [index[f] for f in names]
            picked = [j for j, f in enumerate(slot.features) if f in index]
            b = [slot.bases[j] for j in picked]
            bases.append(None if not any(b) else torch.tensor(b, dtype=torch.int64, device=dev))
            rows.append(torch.tensor([slot.rows[j] for j in picked], dtype=torch.int64, device=dev))
            m = [self._mean[f] for f in names]
            mean.append(torch.tensor(m, device=dev) if any(m) else None)
            present.append(names)
        perm = None if order == list(range(len(keys))) else order
        in_order = [keys[i] for i in order] == self._features and all(names for names in present)
        same = [bool(r.numel()) and bool((r == r[0]).all()) for r in rows]
        base_list = [[] if b is None else b.tolist() for b in bases]
        return _Plan(perm, ranges, bases, base_list, rows, mean, present, same, in_order)

    @torch.no_grad()
    def apply_gradient(self, k: int, ids, offsets, psw, grad: torch.Tensor) -> None:
        """The optimizer step of slot ``k`` for one lookup's output gradient."""
        slot = self._slots[k]
        if self.hp is not None:   # None: a stack over a sharded collection's store, which keeps its own
            slot.store.hp = self.hp
        slot.store.apply_bag_gradient(slot.w, ids, offsets, psw, grad)
        if self.on_update is not None:
            self.on_update(k)


class _StackedLookup(torch.autograd.Function):
    """Pooled lookup in one stacked buffer whose backward applies the optimizer (no weight gradient)."""

    @staticmethod
    def forward(ctx, anchor, stack: StackedTables, k: int, ids, offsets, psw):
        ctx.stack, ctx.k = stack, k
        ctx.save_for_backward(ids, offsets, psw)
        slot = stack._slots[k]
        return F.embedding_bag(ids, slot.store.buffers[slot.w], offsets, mode="sum", per_sample_weights=psw,
                               include_last_offset=True)

    @staticmethod
    def backward(ctx, grad):
        ids, offsets, psw = ctx.saved_tensors
        ctx.stack.apply_gradient(ctx.k, ids, offsets, psw, grad)
        return None, None, None, None, None, None
