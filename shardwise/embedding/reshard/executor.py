"""The move of a reshard: every piece from the old stores into the new ones, one way for every backend.

What crosses the wire (weights and every optimizer-state tensor of the moved rows) is cut, per
(source, destination) pair, into messages of at most ``chunk_bytes``, in the order of the shared
piece list, so both ends cut alike. Message k of every pair travels in round k: one
``batch_isend_irecv`` per round, on gloo and NCCL alike. A message that is one contiguous view on
its side goes straight from the old store (send) or into the new store (receive); anything else --
column slices, several small pieces -- is packed into a round buffer or unpacked from one.

Round k+1 is packed while round k is on the wire, and round k is unpacked while round k+1 is, so at
most two rounds of buffers exist at once: transient memory is bounded by 2 rounds x 2 directions x
peers x ``chunk_bytes`` whatever the size of the move. No helper thread: the order of the calls below
is the whole schedule.

A new store may take over an old buffer of the same shape (``reuse.py``: kept boxes then stay where
they are and received rows land in memory already faulted in). A write into such a buffer must come
after every read of the old bytes under it; :func:`plan_moves` checks this against the fixed order of
the loop (a send whose region is received into in the same round is packed first, so it reads before
the round is posted; a local copy reading received-into memory runs before round 0) and reports the
buffers where the order cannot hold (``Moves.conflicts``): the caller gives those fresh memory.

Example (the cut is plain data; pieces from :func:`~shardwise.embedding.reshard.pieces.plan_pieces`):
    >>> import torch
    >>> a = torch.zeros(3, 4)
    >>> msgs = cut_messages([Item(0, 1, 3, 16, a, None), Item(0, 1, 1, 2, a[0, :1], None)], chunk_bytes=32)
    >>> [(m.nbytes, [s.rows for s in m.segments]) for m in msgs]
    [(32, [(0, 2)]), (16, [(2, 3)]), (2, [(0, 1)])]
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from .pieces import cut, piece_numel

__all__ = ["CHUNK_BYTES", "Item", "Segment", "Message", "Moves", "cut_messages", "plan_moves", "exchange",
           "local_index"]

CHUNK_BYTES = 16 << 20   # per message: large enough that per-message latency is noise, small enough to bound memory


@dataclass
class Item:
    """``rows`` rows of ``row_bytes`` bytes each going from ``src`` to ``dst``; ``src_view`` /
    ``dst_view`` are the tensors on this rank's side (None on the other side)."""

    src: int
    dst: int
    rows: int
    row_bytes: int
    src_view: Optional[torch.Tensor]
    dst_view: Optional[torch.Tensor]


@dataclass
class Segment:
    item: Item
    rows: tuple            # [r0, r1) of the item
    offset: int            # byte offset in the message

    def view(self, side: str) -> torch.Tensor:
        t = self.item.src_view if side == "src" else self.item.dst_view
        return t[self.rows[0]:self.rows[1]]

    @property
    def nbytes(self) -> int:
        return (self.rows[1] - self.rows[0]) * self.item.row_bytes


@dataclass
class Message:
    segments: list = field(default_factory=list)
    nbytes: int = 0
    pack: bool = False     # send: copy into a round buffer even when direct (its memory is received into)

    def add(self, item: Item, r0: int, r1: int) -> None:
        offset = -(-self.nbytes // 8) * 8 if self.segments else 0   # 8-byte aligned for any dtype view
        self.segments.append(Segment(item, (r0, r1), offset))
        self.nbytes = offset + (r1 - r0) * item.row_bytes


def cut_messages(items: list, chunk_bytes: int) -> list:
    """Messages of one (source, destination) pair, a pure function of shared data: each item's rows
    in order, at most ``chunk_bytes`` per message (a single row larger than that travels alone).
    Parts of at least an eighth of a chunk travel alone, so a contiguous view goes out and lands
    without a copy; smaller parts share packed messages."""
    out, small = [], Message()
    for it in items:
        per = max(1, chunk_bytes // max(1, it.row_bytes))
        for r in range(0, it.rows, per):
            r1 = min(it.rows, r + per)
            if (r1 - r) * it.row_bytes * 8 >= chunk_bytes:
                alone = Message()
                alone.add(it, r, r1)
                out.append(alone)
                continue
            start = -(-small.nbytes // 8) * 8 if small.segments else 0
            if small.segments and start + (r1 - r) * it.row_bytes > chunk_bytes:
                out.append(small)
                small = Message()
            small.add(it, r, r1)
    if small.segments:
        out.append(small)
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _direct(msg: Message, side: str) -> Optional[torch.Tensor]:
    """The message's bytes in place (one contiguous segment), else None."""
    if len(msg.segments) != 1:
        return None
    v = msg.segments[0].view(side)
    return _bytes(v) if v.is_contiguous() else None


class _Round:
    """One round's sends and receives on this rank: buffers packed, ops posted, then unpacked."""

    def __init__(self, k: int, sends: dict, recvs: dict, device):
        self.k, self.sends, self.recvs, self.device = k, sends, recvs, device
        self.buffers, self.unpack, self.reqs, self.bytes = {}, [], [], 0

    def pack(self) -> None:
        for peer, msg in self.sends.items():
            buf = None if msg.pack else _direct(msg, "src")
            if buf is None:
                buf = torch.empty(msg.nbytes, dtype=torch.uint8, device=self.device)
                self.bytes += msg.nbytes
                for s in msg.segments:
                    v = s.view("src")
                    buf[s.offset:s.offset + s.nbytes].view(v.dtype).view(v.shape).copy_(v)
            self.buffers[("send", peer)] = buf
        for peer, msg in self.recvs.items():
            buf = _direct(msg, "dst")
            if buf is None:
                buf = torch.empty(msg.nbytes, dtype=torch.uint8, device=self.device)
                self.bytes += msg.nbytes
                self.unpack.append((buf, msg))
            self.buffers[("recv", peer)] = buf

    def post(self, group) -> None:
        ops = [dist.P2POp(dist.isend if what == "send" else dist.irecv, buf, dist.get_global_rank(group, peer),
                          group, self.k)
               for (what, peer), buf in sorted(self.buffers.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
        self.reqs = dist.batch_isend_irecv(ops) if ops else []

    def wait(self) -> None:
        for req in self.reqs:
            req.wait()
        self.reqs = []

    def finish(self) -> None:
        for buf, msg in self.unpack:
            for s in msg.segments:
                v = s.view("dst")
                v.copy_(buf[s.offset:s.offset + s.nbytes].view(v.dtype).view(v.shape))
        self.buffers.clear()
        self.unpack.clear()


def _items(pieces: list, kinds: list, me: int, views) -> tuple[dict, list]:
    """({(src, dst): [Item]} for the pairs this rank is in, [(src view, dst view)] local copies)."""
    pairs, local = {}, []
    for p in pieces:
        if me not in (p.src, p.dst):
            continue
        for what, kind in kinds:
            if not piece_numel(p, kind):
                continue
            src = cut(views(p.src_box, what, old=True), p.src_box, p, kind) if p.src == me else None
            dst = cut(views(p.dst_box, what, old=False), p.dst_box, p, kind) if p.dst == me else None
            if p.src == p.dst:
                local.append((src, dst))
                continue
            t = src if src is not None else dst
            row_bytes = t.element_size() * (t[0].numel() if t.dim() > 1 else 1)
            pairs.setdefault((p.src, p.dst), []).append(Item(p.src, p.dst, p.r1 - p.r0, row_bytes, src, dst))
    return pairs, local


def _rounds(pairs: dict, me: int, chunk_bytes: int) -> list:
    """[(sends {peer: Message}, receives {peer: Message})] per round."""
    rounds: list = []
    for (src, dst), items in sorted(pairs.items()):
        for k, msg in enumerate(cut_messages(items, chunk_bytes)):
            while len(rounds) <= k:
                rounds.append(({}, {}))
            if src == me:
                rounds[k][0][dst] = msg
            else:
                rounds[k][1][src] = msg
    return rounds


@dataclass
class Moves:
    """One rank's part of a move, planned and not yet run: ``rounds`` [(sends {peer: Message},
    receives {peer: Message})], ``local`` copies [(src view, dst view)] of which the first ``early``
    run before round 0 is posted, and ``conflicts``: storages (data pointers) where a write would land
    before a read of the old bytes under it (empty when every new store is fresh memory)."""

    rounds: list
    local: list
    early: int
    conflicts: set


def _span(t: torch.Tensor) -> tuple:
    """(storage, first byte, end byte) of the memory a view touches (whole rows of a column slice
    included: conservative)."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.untyped_storage().data_ptr(), t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _index(writes: dict) -> dict:
    """{storage: (starts, [(start, end, time)] sorted by start, longest span)}: a lookup that stays
    fast with thousands of small pieces in one buffer."""
    out = {}
    for store, spans in writes.items():
        spans.sort()
        out[store] = ([a for a, _, _ in spans], spans, max(b - a for a, b, _ in spans))
    return out


def _first_write(span: tuple, writes: dict) -> float:
    """When the earliest write overlapping ``span`` starts (inf if none)."""
    store, lo, hi = span
    if store not in writes:
        return float("inf")
    starts, spans, longest = writes[store]
    # only writes starting in (lo - longest, hi) can overlap [lo, hi)
    i, j = bisect.bisect_right(starts, lo - longest), bisect.bisect_left(starts, hi)
    return min((w for a, b, w in spans[i:j] if lo < b), default=float("inf"))


def _order(rounds: list, local: list) -> tuple:
    """Check every read of old bytes against the writes that land on them, in the loop's fixed order.

    Times in :func:`exchange`'s order: round j is packed at 4j-3, posted at 4j-1 and waited for at
    4j+2; its buffers are unpacked at 4j+4; early local copies run at -2, the others at -0.5. A
    direct send reads during [4j-1, 4j+2], a packed one at 4j-3; a direct receive writes from 4k-1,
    an unpacked one at 4k+4. Returns (early copies, late copies, conflicting storages) and marks the
    sends that must be packed."""
    writes: dict = {}
    for k, (_, recvs) in enumerate(rounds):
        for msg in recvs.values():
            when = 4 * k - 1 if _direct(msg, "dst") is not None else 4 * k + 4
            for s in msg.segments:
                store, lo, hi = _span(s.view("dst"))
                writes.setdefault(store, []).append((lo, hi, when))
    writes = _index(writes)
    reads = [_span(src) for src, _ in local]
    conflicts = set()
    for j, (sends, _) in enumerate(rounds):
        for msg in sends.values():
            spans = [_span(s.view("src")) for s in msg.segments]
            reads.extend(spans)
            first = min((_first_write(sp, writes) for sp in spans), default=float("inf"))
            if first <= 4 * j + 2 and not msg.pack and _direct(msg, "src") is not None:
                msg.pack = True          # read before the round is posted instead of during it
            if first <= 4 * j - 3:
                conflicts.update(sp[0] for sp in spans if _first_write(sp, writes) <= 4 * j - 3)
    by_store: dict = {}
    for store, lo, hi in reads:
        by_store.setdefault(store, []).append((lo, hi))
    early, late = [], []
    for src, dst in local:
        store, lo, hi = _span(dst)
        if any(a < hi and lo < b for a, b in by_store.get(store, ())):
            conflicts.add(store)         # it would overwrite old bytes another part still reads
        (early if _first_write(_span(src), writes) < float("inf") else late).append((src, dst))
    return early, late, conflicts


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def plan_moves(pieces: list, kinds: list, views, me: int, chunk_bytes: int = CHUNK_BYTES) -> Moves:
    """This rank's messages and local copies for ``pieces`` (no communication).

    ``views(box, what, old)`` returns the rows of ``box`` in an old (``old=True``) or new store for
    the weights (``what=None``) or a state tensor. A local copy from a view onto itself (a kept box
    in a buffer the new store took over) is dropped: its bytes are already in place.
    """
    pairs, local = _items(pieces, kinds, me, views)
    local = [(src, dst) for src, dst in local if not _same(src, dst)]
    rounds = _rounds(pairs, me, chunk_bytes)
    early, late, conflicts = _order(rounds, local)
    return Moves(rounds, early + late, len(early), conflicts)


@torch.no_grad()
def exchange(moves: Moves, group, device) -> dict:
    """Run a planned move; collective over ``group`` (every rank runs its own plan of the same pieces).

    Returns ``{"bytes_local": ..., "transient_peak": ...}``: bytes copied without the wire and the
    most bytes of round buffers alive at once on this rank.
    """
    assert not moves.conflicts, f"exchange: writes would clobber unread bytes in storages {moves.conflicts}"
    rounds = [_Round(k, s, r, device) for k, (s, r) in enumerate(moves.rounds)]
    for src, dst in moves.local[:moves.early]:    # they read memory that round 0 may receive into
        dst.copy_(src)
    peak = 0
    if rounds:
        rounds[0].pack()
        rounds[0].post(group)
        peak = rounds[0].bytes
    for src, dst in moves.local[moves.early:]:    # while round 0 is on the wire
        dst.copy_(src)
    for k, rnd in enumerate(rounds):
        nxt = rounds[k + 1] if k + 1 < len(rounds) else None
        if nxt is not None:
            nxt.pack()             # while round k is on the wire
            peak = max(peak, rnd.bytes + nxt.bytes)
        rnd.wait()
        if nxt is not None:
            nxt.post(group)
        rnd.finish()               # unpack round k while round k+1 is on the wire
    local_bytes = sum(s.numel() * s.element_size() for s, _ in moves.local)
    return {"bytes_local": local_bytes, "transient_peak": peak}


def local_index(groups) -> dict:
    """{my box: (store, index in store)} over ``groups``."""
    out = {}
    for g in groups:
        for i in g.store.loc:
            out[g.store.boxes[i]] = (g.store, i)
    return out
