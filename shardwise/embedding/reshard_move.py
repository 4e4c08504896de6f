"""The moving part of a reshard: memory for the rebuilt groups, then every piece into place.

Pieces (see ``reshard.plan_pieces``) that stay on a rank -- including whole boxes of unmoved tables in
a rebuilt group -- are copied locally, or not at all when the new buffer was carved so that they are
already where they belong (``reshard_memory.carve``). Remote pieces travel in one batch of
point-to-point messages, straight from the old shard views into the new ones, with the tag of each
message its position in the shared piece list. A write that would clobber bytes still to be read
(a send in flight or a local copy's source, possible once new buffers reuse old memory) goes to a
temporary and lands after every read is done.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from .reshard_memory import NewBuffer, Spans, carve, fresh, span
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
    """(messages [(send?, view, peer, tag, chunk index)] in piece order, local copies [(src, dst)],
    moved bytes kept).

    Remote pieces travel in row blocks of at most ``chunk_bytes`` (at least one row), cut from the
    piece's geometry, so both ends cut alike; a message's tag is its position in that shared list.
    """
    me, (old_index, new_index) = module._topo.rank, indexes
    item = torch.empty(0, dtype=module._dtype).element_size()
    msgs, copies, tag, local_bytes = [], [], 0, 0
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
                    copies.append((src, dst))
                    local_bytes += src.numel() * item
                continue
            rows = p.r1 - p.r0
            per = max(1, chunk_bytes // (item * (1 if kind == "row" else p.c1 - p.c0)))
            for r in range(0, rows, per):
                tag += 1
                if src is not None:
                    msgs.append((True, src[r:r + per], p.dst, tag, r // per))
                elif dst is not None:
                    msgs.append((False, dst[r:r + per], p.src, tag, r // per))
    for p in kept:
        for what, kind in kinds:
            (s_store, j), (d_store, i) = old_index[p.src_box], new_index[p.dst_box]
            copies.append((s_store.box_view(j, what), d_store.box_view(i, what)))
    return msgs, [(s, d) for s, d in copies if not _same_memory(s, d)], local_bytes


class _SendTracker:
    """Waits for this rank's sends, in order, on a helper thread, so that the main thread can ask with
    a timeout whether the sends reading some region are done (gloo's send works cannot be polled)."""

    def __init__(self, works: list):
        self.done, self.error = 0, None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(works,), name="reshard-sends", daemon=True)
        self._thread.start()

    def _run(self, works: list) -> None:
        try:
            for w in works:
                w.wait()
                with self._cond:
                    self.done += 1
                    self._cond.notify_all()
        except BaseException as exc:   # re-raised on the main thread
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def wait(self, count: int, timeout: Optional[float] = None) -> bool:
        """Whether the first ``count`` sends are done, waiting up to ``timeout`` s (None: until they are)."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self.done >= count or self.error is not None, timeout)
        if self.error is not None:
            raise self.error
        return ok

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error


def _sends_reading(send_spans: list, s: tuple) -> int:
    """How many of the sends (in posting order) must be done before span ``s`` may be overwritten."""
    return max((k + 1 for k, (lo, hi) in enumerate(send_spans) if lo < s[1] and s[0] < hi), default=0)


@dataclass
class _Staged:
    """A receive that cannot be posted into its destination yet: sends 0..need-1 still read it."""

    dst: torch.Tensor
    peer: int
    tag: int
    need: int
    defer: bool      # wait for the memory rather than take a ring buffer


def _receive_staged(staged: list, tracker: _SendTracker, group, slot_numel: int) -> list:
    """Receive ``staged`` through a ring of reused buffers, each copied into its destination once the
    sends still reading that memory are done; a deferred one is instead posted straight into its
    destination once that memory is free. Returns the works of those direct receives.

    Waiting on a posted receive always ends (every rank posted all its sends first). Waiting on our
    own sends needs the peer to post the matching receives, so while receives remain unposted that
    wait is bounded: when it runs out, a deferred receive falls back to the ring and the ring grows
    by one buffer, so the peer's sends keep flowing and no two ranks wait on each other.
    """
    ring, later = deque(x for x in staged if not x.defer), deque(x for x in staged if x.defer)
    pending, free, direct = deque(), [], []
    limit, made = _RING_BUFFERS, 0
    while ring or later or pending:
        while later and tracker.done >= later[0].need:
            x = later.popleft()
            direct.append(dist.irecv(x.dst, dist.get_global_rank(group, x.peer), group, x.tag))
        while ring and (free or made < limit):
            x = ring.popleft()
            if not free:
                free.append(fresh((slot_numel,), x.dst.dtype, x.dst.device))
                made += 1
            slot = free.pop()
            buf = slot[:x.dst.numel()].view(x.dst.shape)
            pending.append([dist.irecv(buf, dist.get_global_rank(group, x.peer), group, x.tag), buf, slot, x])
        if not pending:
            if later and not tracker.wait(later[0].need, _PATIENCE_S):
                ring.append(later.popleft())
            continue
        work, buf, slot, x = pending[0]
        if work is not None:
            work.wait()
            pending[0][0] = None   # a gloo receive must be waited once: a second wait blocks for good
        # wake up as soon as either the head's memory or the next deferred receive's memory is free:
        # the peer may be waiting for that deferred receive
        target = min(x.need, later[0].need) if later else x.need
        if not tracker.wait(target, _PATIENCE_S if (ring or later) else None):
            if later:
                ring.appendleft(later.popleft())
            limit += 1
            continue
        if tracker.done < x.need:
            continue
        x.dst.copy_(buf)
        free.append(slot)
        pending.popleft()
    return direct


def _blocks(n: int, src: tuple, dst: tuple, width: int):
    """Row blocks [(a, b)] that copy ``n`` rows (start address, row stride in bytes) from ``src`` to an
    overlapping ``dst`` without a block overwriting rows still to be read -- front to back or back to
    front, whichever works (like memmove); None if neither does. A row that is already in place is a
    block of its own."""
    (s0, ss), (d0, ds) = src, dst
    out, a = [], 0
    while a < n:      # front to back: a block's last byte stays below the first source byte unread
        b = n if ds <= 0 else min(n, (s0 + a * ss - d0 - width) // ds + 1)
        b = a + 1 if b <= a and s0 + a * ss == d0 + a * ds else b
        if b <= a:
            break
        out.append((a, b))
        a = b
    if a >= n:
        return out
    out, b = [], n
    while b > 0:      # back to front: a block's first byte stays above the last source byte unread
        a = max(0, -(-(s0 - d0 + (b - 1) * ss + width) // ds)) if ds > 0 else b
        a = b - 1 if a >= b and s0 + (b - 1) * ss == d0 + (b - 1) * ds else a
        if a >= b:
            return None
        out.append((a, b))
        b = a
    return out


def _move_in_place(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Copy ``src`` into the overlapping ``dst`` block by block (:func:`_blocks`); False, with nothing
    written, if their layout allows no safe order."""
    if src.dim() != 2 or src.shape != dst.shape or src.stride(1) != 1 or dst.stride(1) != 1:
        return False
    item = src.element_size()
    blocks = _blocks(src.shape[0], (src.data_ptr(), src.stride(0) * item), (dst.data_ptr(), dst.stride(0) * item),
                     src.shape[1] * item)
    if blocks is None:
        return False
    for a, b in blocks:
        if src[a:b].data_ptr() != dst[a:b].data_ptr() or src.stride(0) != dst.stride(0) and b - a > 1:
            dst[a:b].copy_(src[a:b])
    return True


def _stage_local(staged: list, send_spans: list, copies: list) -> list:
    """Local copies whose destination overlaps memory still to be read: moved in place when only their
    own source is in the way, else read into a temporary now (receives may land on the source) and
    returned as [(temporary, destination)] to write last."""
    later = []
    for src, dst in staged:
        others = Spans(send_spans + [span(s) for s, _ in copies if s is not src])
        if others.meets(span(dst)) or not _move_in_place(src, dst):
            later.append((_copy(src), dst))
    return later


def _copy(t: torch.Tensor) -> torch.Tensor:
    out = fresh(t.shape, t.dtype, t.device)
    out.copy_(t)
    return out


def _packed(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else _copy(t)


def _in_one_batch(msgs: list, packed: list, unread: Spans, direct: list, later: list, group) -> None:
    """Every message in one ``batch_isend_irecv`` in the shared order; receives that would clobber
    unsent data land in temporaries. For backends other than gloo: NCCL matches point-to-point
    messages by their order rather than their tag, and wants them in one group, so the ring's
    out-of-order posting is not for it (and its caching allocator has no page-fault cost)."""
    ops, sent = [], iter(packed)
    for send, t, peer, tag, _ in msgs:
        buf = next(sent) if send else t
        if not send and (not t.is_contiguous() or unread.meets(span(t))):
            buf = fresh(t.shape, t.dtype, t.device)
            later.append((buf, t))
        op = dist.isend if send else dist.irecv
        ops.append(dist.P2POp(op, buf, dist.get_global_rank(group, peer), group, tag))
    reqs = dist.batch_isend_irecv(ops) if ops else []
    for src, dst in direct:
        dst.copy_(src)
    for req in reqs:
        req.wait()


@torch.no_grad()
def exchange(module, pieces: list, kept: list, kinds: list, indexes: tuple) -> int:
    """Move ``pieces`` and the unmoved boxes ``kept`` from the old stores (``indexes[0]``) into the new
    ones (``indexes[1]``); returns the bytes of moved tables that stayed on this rank.

    Order: column slices to send are packed; local copies that overwrite only their own source move
    in place, other ones that would overwrite something still to be read are read into temporaries;
    every send is posted; receives go straight into their final place unless a send in flight or a
    local copy still reads it; local copies run while the messages travel; the other receives pass
    through a small ring of buffers (:func:`_receive_staged`); the deferred local writes land last.
    """
    topo = module._topo
    msgs, copies, local_bytes = _plan(module, pieces, kept, kinds, indexes, _CHUNK_BYTES)
    sends = [(t, peer, tag) for send, t, peer, tag, _ in msgs if send]
    send_spans = [span(t) if t.is_contiguous() else (0, 0) for t, _, _ in sends]
    unread = Spans(send_spans + [span(s) for s, _ in copies])
    staged = [(s, d) for s, d in copies if unread.meets(span(d))]
    direct = [(s, d) for s, d in copies if not unread.meets(span(d))]
    packed = [_packed(t) for t, _, _ in sends]   # column slices are read before anything is overwritten
    later = _stage_local(staged, send_spans, copies)
    unread = Spans(send_spans + [span(s) for s, _ in direct])
    group = topo.group
    if dist.get_backend(group) != "gloo":
        _in_one_batch(msgs, packed, unread, direct, later, group)
    else:
        _post_and_receive(msgs, packed, (send_spans, unread), direct, group, topo.rank)
    for buf, dst in later:
        dst.copy_(buf)
    return local_bytes


def _post_and_receive(msgs: list, packed: list, spans: tuple, direct: list, group, rank: int) -> None:
    """gloo: all sends posted first, receives in place where nothing still reads their memory, the
    others through the ring or deferred (:func:`_receive_staged`), local copies in between."""
    send_spans, unread = spans
    sends = [(peer, tag) for send, _, peer, tag, _ in msgs if send]
    tracker = _SendTracker([dist.isend(buf, dist.get_global_rank(group, peer), group, tag)
                            for buf, (peer, tag) in zip(packed, sends)])
    works, ring = [], []
    for send, t, peer, tag, k in msgs:
        if send:
            continue
        if t.is_contiguous() and not unread.meets(span(t)):
            works.append(dist.irecv(t, dist.get_global_rank(group, peer), group, tag))
        else:
            # every other chunk waits for its memory instead of taking a ring buffer; the peer, with
            # the other parity, buffers it: in a swap each side copies half the chunks, not all
            defer = t.is_contiguous() and (k + rank) % 2 == 1
            ring.append(_Staged(t, peer, tag, _sends_reading(send_spans, span(t)), defer))
    for src, dst in direct:
        dst.copy_(src)
    works += _receive_staged(ring, tracker, group, max((x.dst.numel() for x in ring), default=0))
    for w in works:
        w.wait()
    tracker.join()
