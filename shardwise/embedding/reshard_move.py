"""The moving part of a reshard: memory for the rebuilt groups, then every piece into place.

Pieces (see ``reshard.plan_pieces``) that stay on a rank -- including whole boxes of unmoved tables in
a rebuilt group -- are copied locally, or not at all when the new buffer was carved so that they are
already where they belong (``reshard_memory.carve``). Remote pieces travel as point-to-point messages
of at most ``_CHUNK_BYTES``, straight from the old shard views into the new ones, with the tag of each
message its position in the shared list of chunks. On gloo, ``reshard_schedule`` runs them so that a
write waits only for the reads of the memory it overwrites; other backends take one batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .reshard_memory import NewBuffer, Spans, carve, fresh, fresh_copy, span
from .reshard_schedule import COPY, RECV, SEND, run_schedule
from .sharding import SHARDERS
from .shards import local_layout

__all__ = ["new_layouts", "new_memory", "exchange", "piece_numel", "cut"]

_CHUNK_BYTES = 4 << 20   # message size: big enough for the wire, small enough for a ring buffer in cache
_RING_BUFFERS = 8        # receive buffers in flight for receives that cannot land in place yet
_PATIENCE_S = 0.02       # how long to wait for our own sends before adding a ring buffer


def piece_numel(p, kind: str) -> int:
    if kind == "row":
        # per-row state travels once per row, with the piece holding the box's first column
        return (p.r1 - p.r0) if p.c0 == p.dst_box.col_offset else 0
    return (p.r1 - p.r0) * (p.c1 - p.c0)


def cut(view: torch.Tensor, box, p, kind: str) -> torch.Tensor:
    rows = slice(p.r0 - box.row_offset, p.r1 - box.row_offset)
    if kind == "row":
        return view[rows]
    return view[rows, p.c0 - box.col_offset:p.c1 - box.col_offset]


def local_index(groups) -> dict:
    """{my box: (store, index in store)} over ``groups``."""
    out = {}
    for g in groups:
        for i in g.store.loc:
            out[g.store.boxes[i]] = (g.store, i)
    return out


def new_layouts(module, plan: dict, types) -> dict:
    """{sharding type: (non-empty boxes, widths, {box index: (width index, base row)})} on this rank for
    the groups about to be rebuilt -- the layout their ShardStores will have (``local_layout``)."""
    out = {}
    for st in types:
        tables = [t for t in module._tables if plan[t.name].sharding_type == st]
        boxes = [b for t in tables for b in SHARDERS[st].layout(t, plan[t.name], module._topo)]
        boxes = [b for b in boxes if b.row_size > 0 and b.col_size > 0]
        if tables:
            out[st] = (boxes, *local_layout(boxes, module._topo.rank))
    return out


def _buffers(layouts: dict, what) -> tuple[dict, dict]:
    """({(st, what, w): NewBuffer}, {box: (st, w, base row)}) for one kind."""
    buffers, where = {}, {}
    for st, (boxes, widths, loc) in layouts.items():
        rows = [0] * len(widths)
        for i, (w, base) in loc.items():
            rows[w] = max(rows[w], base + boxes[i].row_size)
            where[boxes[i]] = (st, w, base)
        for w, width in enumerate(widths):
            buffers[(st, what, w)] = NewBuffer((st, what, w), rows[w], width)
    return buffers, where


def new_memory(layouts: dict, local: list, kinds: list, old_index: dict, old_groups: list) -> dict:
    """{(sharding type, what, width index): tensor} carved out of the old stores of ``old_groups``
    (weights and element-wise state; per-row state is small and always fresh). Buffers missing here
    get fresh memory."""
    out = {}
    for what, kind in kinds:
        if kind != "elem":
            continue
        buffers, where = _buffers(layouts, what)
        for p in local:
            st, w, base = where[p.dst_box]
            full = p.c0 == p.dst_box.col_offset and p.c1 - p.c0 == p.dst_box.col_size
            store, j = old_index[p.src_box]
            view = cut(store.box_view(j, what), p.src_box, p, kind)
            if full and view.is_contiguous() and view.numel():
                buffers[(st, what, w)].in_place.append((view, base + p.r0 - p.dst_box.row_offset))
        owned = [g.store.buffers[w] if what is None else g.store.states[w][what]
                 for g in old_groups for w in range(len(g.store.widths))]
        out.update(carve(list(buffers.values()), owned))
    return out


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and (
        a.stride() == b.stride() or (a.is_contiguous() and b.is_contiguous()))


def _plan(module, pieces: list, kept: list, kinds: list, indexes: tuple, chunk_bytes: int) -> tuple:
    """(steps in plan order, moved bytes kept on this rank). A step is ``(SEND, src, None, peer, tag)``,
    ``(RECV, None, dst, peer, tag)`` or ``(COPY, src, dst)``.

    Remote pieces travel in row blocks of at most ``chunk_bytes`` (at least one row), cut from the
    piece's geometry, so both ends cut alike; a message's tag is its position in that shared list.
    Copies whose source already is their destination are left out.
    """
    me, (old_index, new_index) = module._topo.rank, indexes
    item = torch.empty(0, dtype=module._dtype).element_size()
    steps, tag, local_bytes = [], 0, 0
    for p in pieces:
        for what, kind in kinds:
            if not piece_numel(p, kind):
                continue
            src = dst = None
            if p.src == me:
                store, j = old_index[p.src_box]
                src = cut(store.box_view(j, what), p.src_box, p, kind)
            if p.dst == me:
                store, i = new_index[p.dst_box]
                dst = cut(store.box_view(i, what), p.dst_box, p, kind)
            if p.src == p.dst:
                if src is not None:
                    steps.append((COPY, src, dst))
                    local_bytes += src.numel() * item
                continue
            rows = p.r1 - p.r0
            per = max(1, chunk_bytes // (item * (1 if kind == "row" else p.c1 - p.c0)))
            for r in range(0, rows, per):
                tag += 1
                if src is not None:
                    steps.append((SEND, src[r:r + per], None, p.dst, tag))
                elif dst is not None:
                    steps.append((RECV, None, dst[r:r + per], p.src, tag))
    for p in kept:
        for what, kind in kinds:
            (s_store, j), (d_store, i) = old_index[p.src_box], new_index[p.dst_box]
            steps.append((COPY, s_store.box_view(j, what), d_store.box_view(i, what)))
    return [s for s in steps if s[0] != COPY or not _same_memory(s[1], s[2])], local_bytes



def _in_one_batch(steps: list, group) -> None:
    """Every message in one ``batch_isend_irecv`` in the shared order. For backends other than gloo:
    NCCL matches point-to-point messages by their order rather than their tag and wants them in one
    group, so the gloo schedule's out-of-order posting is not for it (and its caching allocator has no
    page-fault cost). Sends are packed first; receives and local copies that would overwrite memory
    still to be read go through temporaries and land after every message."""
    reads = Spans([span(s[1]) for s in steps if s[0] in (SEND, COPY)])
    ops, direct, later = [], [], []
    for kind, src, dst, *peer_tag in steps:
        if kind == COPY:
            if reads.meets(span(dst)):
                later.append((fresh_copy(src), dst))
            else:
                direct.append((src, dst))
            continue
        buf = src.contiguous() if kind == SEND else dst
        if kind == RECV and (not dst.is_contiguous() or reads.meets(span(dst))):
            buf = fresh(dst.shape, dst.dtype, dst.device)
            later.append((buf, dst))
        op = dist.isend if kind == SEND else dist.irecv
        ops.append(dist.P2POp(op, buf, dist.get_global_rank(group, peer_tag[0]), group, peer_tag[1]))
    reqs = dist.batch_isend_irecv(ops) if ops else []
    for src, dst in direct:     # while the messages travel; before anything lands on their sources
        dst.copy_(src)
    for req in reqs:
        req.wait()
    for src, dst in later:
        dst.copy_(src)


@torch.no_grad()
def exchange(module, pieces: list, kept: list, kinds: list, indexes: tuple) -> int:
    """Move ``pieces`` and the unmoved boxes ``kept`` from the old stores (``indexes[0]``) into the new
    ones (``indexes[1]``); returns the bytes of moved tables that stayed on this rank.

    On gloo every send, receive and local copy runs in one schedule where a write waits only for the
    reads of the memory it overwrites (``reshard_schedule``).
    """
    steps, local_bytes = _plan(module, pieces, kept, kinds, indexes, _CHUNK_BYTES)
    group = module._topo.group
    if dist.get_backend(group) != "gloo":
        _in_one_batch(steps, group)
    else:
        # the module keeps the schedule's buffers for its next reshard (release_reshard_buffers)
        run_schedule(steps, group, ring=_RING_BUFFERS, patience=_PATIENCE_S, scratch=module._reshard_scratch)
    return local_bytes
