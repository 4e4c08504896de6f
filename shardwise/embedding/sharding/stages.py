"""The three stages of a sharded lookup, generic over shard boxes.

input dist: split each feature's ids by row block, send every (box, feature) slot to its rank.
lookup:     one fused embedding_bag per local width buffer over everything received.
output dist: return pooled blocks to the ranks that own the samples and add them into place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...sparse import KeyedJaggedTensor
from .bucketing import RowBucketing
from .comm import AllToAll, ReduceScatter
from .native_ids import shifted_copy as _shifted_copy
from .routing import Routing
from .store import FusedLookup, ShardStore
from ..topology import MeshTopology

__all__ = ["Routed", "InputDist", "GroupedLookup", "AllToAllOutputDist", "ReduceScatterOutputDist",
           "LocalOutputDist"]


_SLOT_LOOP = 64   # up to this many slots a loop of slice copies beats the gather (Python cost per slot)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 0) - x


@dataclass
class Routed:
    """Ids received by this rank, one (ids, offsets, weights) triple per local width buffer."""

    per_width: list
    bags_per_source: list   # per width: number of bags received from each source rank
    # InputDist(keep_positions=True), for sequence outputs: (position of each sent id among this
    # group's ids in input order, ids per slot) -- where the rows that come back belong
    sent: Optional[tuple] = None


class InputDist:
    """Route a local KJT's ids to the ranks holding their shards (``exchange=False``: keep them local)."""

    def __init__(self, routing: Routing, topo: MeshTopology, weighted: bool, exchange: bool = True,
                 dtype: torch.dtype = torch.float32, keep_positions: bool = False):
        self.routing, self.topo, self.weighted, self.exchange = routing, topo, weighted, exchange
        self.keep_positions = keep_positions
        self.weight_dtype = dtype   # per-sample weights must match the tables' dtype in embedding_bag
        self.slot_unit, self.slot_shift, self.slots_per_dest = routing.slot_tensors(topo.device)
        self.unit_start = torch.tensor(routing.unit_start, dtype=torch.int64, device=topo.device)
        self.slot_dest = torch.repeat_interleave(
            torch.arange(len(self.slots_per_dest), device=topo.device),
            torch.tensor(self.slots_per_dest, device=topo.device))
        self.range_starts = [torch.tensor(s, dtype=torch.int64, device=topo.device) for s in routing.range_starts]
        self.shifts = self.slot_shift.tolist()
        self.names = [name for name, _ in routing.features]
        self.bucketing = RowBucketing.build(routing, self.slot_unit.tolist(), self.shifts, topo.device)

    def _features(self, kjt: KeyedJaggedTensor):
        """Values, lengths [F*B] and weights of this group's features (absent ones as empty bags)."""
        batch, keys, per_key = kjt.stride(), kjt.keys(), kjt.offset_per_key()
        kw = kjt.weights_or_none() if self.weighted else None
        a = keys.index(self.names[0]) if self.names and self.names[0] in keys else -1
        if a >= 0 and keys[a:a + len(self.names)] == self.names:
            return self._feature_run(kjt, a, batch, per_key, kw)
        vals, lens, wts, counts = [], [], [], []
        for name, _ in self.routing.features:
            if name in keys:
                k = keys.index(name)
                vals.append(kjt.values()[per_key[k]:per_key[k + 1]])
                lens.append(kjt.lengths()[k * batch:(k + 1) * batch])
                if kw is not None:
                    wts.append(kw[per_key[k]:per_key[k + 1]])
                counts.append(per_key[k + 1] - per_key[k])
            else:
                lens.append(torch.zeros(batch, dtype=torch.int64, device=self.topo.device))
                counts.append(0)
        dev = self.topo.device
        values = torch.cat(vals).to(dev, torch.int64) if vals else torch.zeros(0, dtype=torch.int64, device=dev)
        weights = None
        if self.weighted:
            # Always a tensor when weighted: the weights all-to-all must run on every rank.
            weights = torch.cat(wts).to(dev, self.weight_dtype) if wts else \
                torch.zeros(0, dtype=self.weight_dtype, device=dev)
        return values, torch.cat(lens).to(dev), weights, counts

    def _feature_run(self, kjt: KeyedJaggedTensor, a: int, batch: int, per_key: list, kw):
        """:meth:`_features` where the batch holds this group's features in a row from key ``a``, in the
        group's order (one group of every feature, as a plan of one sharding kind makes): views of the
        batch's tensors instead of a slice and a copy per feature (~0.2 ms of 26 features a step)."""
        nf, dev = len(self.names), self.topo.device
        lo, hi = per_key[a], per_key[a + nf]
        values = kjt.values()[lo:hi].to(dev, torch.int64)
        lengths = kjt.lengths()[a * batch:(a + nf) * batch].to(dev)
        weights = None
        if self.weighted:
            weights = kw[lo:hi].to(dev, self.weight_dtype) if kw is not None else \
                torch.zeros(0, dtype=self.weight_dtype, device=dev)
        return values, lengths, weights, [per_key[a + k + 1] - per_key[a + k] for k in range(nf)]

    def _units(self, values, lengths, weights, counts, batch):
        """Sort values by (unit, sample); return (rebased values, weights, unit lengths [U, B], the sort
        order or None when the input order already is (unit, sample))."""
        nf = len(self.routing.features)
        if self.routing.single_range:
            return values, weights, lengths.view(nf, batch), None
        bag = torch.repeat_interleave(torch.arange(nf * batch, device=values.device), lengths,
                                      output_size=values.numel())
        bucket, start = [], 0
        for fi, n in enumerate(counts):
            seg = values[start:start + n]
            bucket.append(torch.searchsorted(self.range_starts[fi], seg, right=True) - 1 + self.routing.unit_base[fi])
            start += n
        unit = torch.cat(bucket) if bucket else values
        key = unit * batch + bag % batch
        # int32 keys sort over twice as fast on CPU; the key space is units x batch, far below 2**31
        order = torch.sort(key.to(torch.int32) if self.routing.num_units * batch <= 2 ** 31 else key,
                           stable=True).indices
        rebased = (values - self.unit_start[unit]).index_select(0, order)
        weights = None if weights is None else weights.index_select(0, order)
        unit_lengths = torch.bincount(key, minlength=self.routing.num_units * batch)
        return rebased, weights, unit_lengths.view(self.routing.num_units, batch), order

    def route(self, kjt: KeyedJaggedTensor) -> tuple:
        """This rank's side of the input dist, no collective: (ids, lengths, weights, ids per slot,
        batch, sent) with ids and lengths ordered by destination rank; ``sent`` (with
        ``keep_positions``, else None) is (each sent id's input position, ids per slot)."""
        batch = kjt.stride()
        values, lengths, weights, counts = self._features(kjt)
        if self.bucketing is not None:   # row blocks, each sent to one rank: no sort (bucketing.py)
            send_ids, send_lengths, send_w, slot_len, pos = self.bucketing(values, lengths, weights, counts, batch,
                                                                           self.keep_positions)
            return send_ids, send_lengths, send_w, slot_len, batch, (pos, slot_len) if self.keep_positions else None
        values, weights, unit_lengths, order = self._units(values, lengths, weights, counts, batch)
        seg = unit_lengths.sum(1)
        slot_len = seg.index_select(0, self.slot_unit)
        slot_start = (_exclusive_cumsum(seg)).index_select(0, self.slot_unit)
        total = int(slot_len.sum().item()) if slot_len.numel() else 0
        if not self.keep_positions and len(self.shifts) <= _SLOT_LOOP:
            send_ids, send_w = self._copy_slots(values, weights, slot_start, slot_len, total)
            return send_ids, unit_lengths.index_select(0, self.slot_unit).flatten(), send_w, slot_len, batch, None
        idx = torch.repeat_interleave(slot_start - _exclusive_cumsum(slot_len), slot_len, output_size=total)
        idx = idx + torch.arange(total, device=idx.device)
        send_ids = values.index_select(0, idx) + torch.repeat_interleave(self.slot_shift, slot_len,
                                                                         output_size=total)
        send_w = None if weights is None else weights.index_select(0, idx)
        send_lengths = unit_lengths.index_select(0, self.slot_unit).flatten()
        sent = (idx if order is None else order.index_select(0, idx), slot_len) if self.keep_positions else None
        return send_ids, send_lengths, send_w, slot_len, batch, sent

    def _copy_slots(self, values, weights, starts: torch.Tensor, lens: torch.Tensor, total: int):
        """Each slot's ids, shifted to its box's buffer rows, copied into the send buffer: one pass
        over the ids (the index path makes six). On CPU one numba loop (a slice copy per slot cost
        ~0.2 ms for the 26 slots of a table-wise DLRM step)."""
        send_ids = values.new_empty(total)
        send_w = None if weights is None else weights.new_empty(total)
        copy = _shifted_copy() if values.device.type == "cpu" and values.dtype == torch.int64 else None
        if copy is not None:
            copy(values.numpy(), starts.numpy(), lens.numpy(), self.slot_shift.numpy(), send_ids.numpy())
            if send_w is None:
                return send_ids, send_w
        at = 0
        for s, n, shift in zip(starts.tolist(), lens.tolist(), self.shifts):
            if copy is None:
                torch.add(values[s:s + n], shift, out=send_ids[at:at + n])
            if send_w is not None:
                send_w[at:at + n] = weights[s:s + n]
            at += n
        return send_ids, send_w

    def _per_width(self, ids, lengths, weights, batch_sizes) -> Routed:
        me = self.topo.rank
        sizes = list(batch_sizes) if self.exchange else [batch_sizes[me]]
        n_slots = len(self.routing.slots[me])
        ranges = self.routing.width_ranges[me]
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        if not ranges:
            return Routed([], [])
        if len(ranges) == 1:
            per_source = [(hi - lo) * b for (_, lo, hi) in ranges for b in sizes]
            return Routed([(ids, offsets, weights)], [per_source])
        per_width, bags = [], []
        base = [0]
        for b in sizes:
            base.append(base[-1] + n_slots * b)
        cuts = [(base[k] + lo * b, base[k] + hi * b) for (_, lo, hi) in ranges for k, b in enumerate(sizes)]
        bounds = offsets.index_select(0, torch.tensor([c for pair in cuts for c in pair], device=ids.device))
        bounds = bounds.tolist()
        for wi, (_, lo, hi) in enumerate(ranges):
            part = range(wi * len(sizes), (wi + 1) * len(sizes))
            sel_ids = torch.cat([ids[bounds[2 * j]:bounds[2 * j + 1]] for j in part])
            sel_len = torch.cat([lengths[cuts[j][0]:cuts[j][1]] for j in part])
            sel_w = None if weights is None else torch.cat([weights[bounds[2 * j]:bounds[2 * j + 1]] for j in part])
            off = torch.zeros(sel_len.numel() + 1, dtype=torch.int64, device=ids.device)
            torch.cumsum(sel_len, 0, out=off[1:])
            per_width.append((sel_ids, off, sel_w))
            bags.append([(hi - lo) * b for b in sizes])
        return Routed(per_width, bags)


class GroupedLookup:
    """One fused embedding_bag (and fused optimizer backward) per local width buffer."""

    def __init__(self, store: ShardStore, anchor: torch.Tensor):
        self.store, self.anchor = store, anchor

    def __call__(self, routed: Routed) -> list[torch.Tensor]:
        return [FusedLookup.apply(self.anchor, self.store, w, ids, off, psw)
                for w, (ids, off, psw) in enumerate(routed.per_width)]


def _send_buffer(pooled: list[torch.Tensor], routed: Routed, n_sources: int, dtype, device):
    """Pooled blocks ordered (source, width, slot, sample, column), flattened, with sizes per source.

    torch.split (not slicing) so the backward is one cat instead of a zero-filled copy per slice.
    """
    per_width = [torch.split(p, routed.bags_per_source[w]) for w, p in enumerate(pooled)]
    pieces, sizes = [], [0] * n_sources
    for s in range(n_sources):
        for w, parts in enumerate(per_width):
            pieces.append(parts[s].reshape(-1))
            sizes[s] += parts[s].numel()
    send = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype, device=device)
    return send, sizes


def _blocks(recv: torch.Tensor, slots: list, batch: int) -> list[tuple[str, int, torch.Tensor]]:
    """Cut a received flat buffer into its [batch, columns] blocks, tagged (feature, first column)."""
    if not slots:
        return []
    parts = torch.split(recv, [batch * cs for _, _, cs in slots])
    return [(f, c0, part.view(batch, cs)) for (f, c0, cs), part in zip(slots, parts)]


class AllToAllOutputDist:
    """Pooled blocks back to their sample owners with one all-to-all.

    Returns [(feature, first column, [batch, columns] block)]; blocks of one feature and column
    range from several row blocks are partial sums the caller adds.
    """

    codecs = None   # QuantizedCommCodecs of the pooled all-to-all (qcomm), None: full precision

    def __init__(self, routing: Routing, topo: MeshTopology, anchor: torch.Tensor, dtype):
        self.routing, self.topo, self.anchor, self.dtype = routing, topo, anchor, dtype
        self.slots = routing.output_slots(range(topo.world_size))

    def set_qcomm(self, registry: Optional[dict]) -> None:
        """Take this stage's codecs from a qcomm registry (``{CommOp name: QuantizedCommCodecs}``)."""
        self.codecs = (registry or {}).get("POOLED_EMBEDDINGS_ALL_TO_ALL")

    def _recv_sizes(self, batch: int) -> list[int]:
        return [batch * sum(self.routing.boxes[i].col_size for i, _, _, _ in self.routing.slots[d])
                for d in range(self.topo.world_size)]

    def __call__(self, pooled, routed: Routed, batch: int, batch_sizes: Optional[list] = None):
        topo = self.topo
        send, send_sizes = _send_buffer(pooled, routed, topo.world_size, self.dtype, topo.device)
        recv = AllToAll.apply(self.anchor, send, send_sizes, self._recv_sizes(batch), topo.group, self.codecs)
        return _blocks(recv, self.slots, batch)


class ReduceScatterOutputDist(AllToAllOutputDist):
    """Row-wise partial sums reduced and scattered in one collective (NCCL's fast path).

    Needs a uniform slot pattern (every rank holds a block of every table) and equal batch sizes;
    otherwise, and on gloo where all-to-all is faster, it falls back to the all-to-all path.
    """

    def __init__(self, routing: Routing, topo: MeshTopology, anchor, dtype, force: Optional[bool] = None):
        super().__init__(routing, topo, anchor, dtype)
        fast_backend = topo.device.type == "cuda" if force is None else force
        self.enabled = fast_backend and routing.uniform()
        self.reduced_slots = routing.output_slots([0]) if routing.uniform() else []
        self.rs_codecs = None

    def set_qcomm(self, registry: Optional[dict]) -> None:
        super().set_qcomm(registry)   # the all-to-all fallback
        self.rs_codecs = (registry or {}).get("POOLED_EMBEDDINGS_REDUCE_SCATTER")

    def __call__(self, pooled, routed: Routed, batch: int, batch_sizes: Optional[list] = None):
        if not self.enabled or batch_sizes is None or len(set(batch_sizes)) != 1:
            return super().__call__(pooled, routed, batch, batch_sizes)
        topo = self.topo
        send, _ = _send_buffer(pooled, routed, topo.world_size, self.dtype, topo.device)
        mine = ReduceScatter.apply(self.anchor, send, topo.world_size, topo.group, self.rs_codecs)
        return _blocks(mine, self.reduced_slots, batch)


class LocalOutputDist(AllToAllOutputDist):
    """Data-parallel: the pooled blocks are already on the sample owner."""

    def __init__(self, routing: Routing, topo: MeshTopology, anchor: torch.Tensor, dtype):
        super().__init__(routing, topo, anchor, dtype)
        self.slots = routing.output_slots([topo.rank])

    def set_qcomm(self, registry: Optional[dict]) -> None:
        """Nothing travels: data-parallel output needs no codec."""

    def __call__(self, pooled, routed: Routed, batch: int, batch_sizes: Optional[list] = None):
        flat = [p.reshape(-1) for p in pooled]
        recv = torch.cat(flat) if len(flat) > 1 else (
            flat[0] if flat else torch.zeros(0, dtype=self.dtype, device=self.topo.device))
        return _blocks(recv, self.slots, batch)
