"""Sequence (unpooled) stages, for any sharding type: one embedding row per id, returned to the rank
that owns the sample, in the input's order.

input dist:  the pooled input dist (:class:`InputDist` with ``keep_positions``): the same units, slots
             and all-to-alls, plus where each sent id sits in the input.
lookup:      ``F.embedding`` per local width buffer; the backward sums the gradient rows of repeated
             ids and applies the fused optimizer to those rows (no weight gradient).
output dist: one all-to-all of the rows back to the ranks that sent the ids (none for data-parallel);
             each row lands at its id's position, column blocks side by side.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .kinds.base import Stages
from .comm import AllToAll
from .routing import Routing
from .stages import InputDist, Routed
from .store import ShardStore
from ..topology import MeshTopology

__all__ = ["SequenceLookup", "GroupedSequenceLookup", "SequenceOutputDist", "build_sequence"]


class SequenceLookup(torch.autograd.Function):
    """Rows of one shard buffer, one per id; the backward updates the touched rows in place."""

    @staticmethod
    def forward(ctx, anchor, store: ShardStore, w: int, ids):
        ctx.store, ctx.w = store, w
        ctx.save_for_backward(ids)
        return F.embedding(ids, store.buffers[w])

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        # every id is a bag of one: the same per-unique-row sum as the pooled backward
        single = torch.arange(ids.numel() + 1, device=ids.device)
        ctx.store.apply_bag_gradient(ctx.w, ids, single, None, grad)
        return None, None, None, None


class GroupedSequenceLookup:
    """One :class:`SequenceLookup` per local width buffer."""

    def __init__(self, store: ShardStore, anchor: torch.Tensor):
        self.store, self.anchor = store, anchor

    def __call__(self, routed: Routed) -> list[torch.Tensor]:
        return [SequenceLookup.apply(self.anchor, self.store, w, ids)
                for w, (ids, _, _) in enumerate(routed.per_width)]


class SequenceOutputDist:
    """Rows back to the ranks that sent the ids; returns this rank's ``[ids, dim]`` in input order.

    The receiver's rows are ordered (source, width, slot, sample, id): per source that is the order
    the source sent them in (slots to one rank are ordered by width first), so one all-to-all needs
    no index exchange. The sender knows each sent id's input position (``routed.sent``) and each
    slot's (first column, columns), all from the shared routing.
    """

    codecs = None   # QuantizedCommCodecs of the sequence all-to-all (qcomm), None: full precision

    def __init__(self, routing: Routing, topo: MeshTopology, anchor: torch.Tensor, exchange: bool = True):
        self.routing, self.topo, self.anchor, self.exchange = routing, topo, anchor, exchange
        dests, keys, cols = [], [], []
        for d in sorted(routing.slots):          # the order of InputDist's slot tensors
            for i, _, _, _ in routing.slots[d]:
                b = routing.boxes[i]
                dests.append(d)
                keys.append((b.col_offset, b.col_size))
                cols.append(b.col_size)
        self.slot_dest = torch.tensor(dests, dtype=torch.int64, device=topo.device)
        self.cols = cols
        self.slot_cols = torch.tensor(cols, dtype=torch.int64, device=topo.device)
        self.key_slots: dict = {}
        for k, key in enumerate(keys):
            self.key_slots.setdefault(key, []).append(k)
        spans = sorted(self.key_slots)
        self.dim = routing.spec.tables[0].embedding_dim
        # column blocks that tile the row exactly (every table split alike): they go side by side;
        # otherwise (e.g. one table column-wise, one whole) each block is padded to the row and added
        self.tiled = [c0 for c0, _ in spans] == [sum(cs for _, cs in spans[:j]) for j in range(len(spans))] \
            and sum(cs for _, cs in spans) == self.dim

    def set_qcomm(self, registry: Optional[dict]) -> None:
        """Take this stage's codecs from a qcomm registry (``{CommOp name: QuantizedCommCodecs}``)."""
        self.codecs = (registry or {}).get("SEQUENCE_EMBEDDINGS_ALL_TO_ALL") if self.exchange else None

    def _send(self, rows: list, routed: Routed, n_sources: int):
        """Flat buffer of rows ordered (source, width) and its element count per source."""
        per_width = []
        for w, r in enumerate(rows):
            offsets, bags = routed.per_width[w][1], routed.bags_per_source[w]
            cuts = torch.tensor([0] + bags, device=offsets.device).cumsum(0)
            bounds = offsets.index_select(0, cuts).tolist()
            per_width.append(torch.split(r, [bounds[s + 1] - bounds[s] for s in range(n_sources)]))
        pieces, sizes = [], [0] * n_sources
        for s in range(n_sources):
            for parts in per_width:
                pieces.append(parts[s].reshape(-1))
                sizes[s] += parts[s].numel()
        dtype = rows[0].dtype if rows else self.anchor.dtype
        send = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype, device=self.topo.device)
        return send, sizes

    def __call__(self, rows: list, routed: Routed, n_ids: int, dtype) -> torch.Tensor:
        topo = self.topo
        positions, slot_len = routed.sent
        n_sources = topo.world_size if self.exchange else 1
        send, send_sizes = self._send(rows, routed, n_sources)
        slot_elems = slot_len * self.slot_cols
        if self.exchange:
            per_dest = torch.zeros(topo.world_size, dtype=torch.int64, device=slot_len.device)
            recv_sizes = per_dest.index_add_(0, self.slot_dest, slot_elems).tolist()
            recv = AllToAll.apply(self.anchor, send.to(dtype), send_sizes, recv_sizes, topo.group,
                                  self.codecs)
        else:
            recv = send.to(dtype)
        counts = slot_len.tolist()
        pieces = [p.view(n, c) for p, n, c in zip(torch.split(recv, slot_elems.tolist()), counts, self.cols)]
        where = torch.split(positions, counts)
        blocks = []
        for (c0, cs), members in sorted(self.key_slots.items()):
            got = torch.cat([pieces[k] for k in members]) if members else recv.new_zeros(0, cs)
            pos = torch.cat([where[k] for k in members])
            # every id of these slots has exactly one row in this column block: a scatter by position
            blocks.append((c0, cs, got.new_zeros(n_ids, cs).index_copy(0, pos, got)))
        if self.tiled:
            return blocks[0][2] if len(blocks) == 1 else torch.cat([b for _, _, b in blocks], dim=1)
        return sum(F.pad(b, (c0, self.dim - c0 - cs)) for c0, cs, b in blocks)


def build_sequence(sharder, routing: Routing, topo: MeshTopology, store: ShardStore, anchor: torch.Tensor,
                   dtype) -> Stages:
    """The sequence stages of one group of any sharding type (its routing comes from its boxes)."""
    exchange = not sharder.local_only
    return Stages(InputDist(routing, topo, weighted=False, exchange=exchange, dtype=dtype, keep_positions=True),
                  GroupedSequenceLookup(store, anchor),
                  SequenceOutputDist(routing, topo, anchor, exchange=exchange))
