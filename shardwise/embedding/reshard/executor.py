"""The move of a reshard: every piece from the old stores into the new ones, one way for every backend.

What crosses the wire (weights and every optimizer-state tensor of the moved rows) is cut, per
(source, destination) pair, into messages of at most ``chunk_bytes``, in the order of the shared
piece list, so both ends cut alike. Rounds go by pairings: the ranks are paired off so that every
two meet once (a round-robin tournament), and message m of both directions of every pair of a
pairing travels in one round, one ``all_to_all_single`` with split sizes (gloo's point-to-point path
took about 1.3x its all-to-all for the same bytes; NCCL runs the same code). Every rank computes the
same round list from the shared pieces, so each round is one collective on every rank. In a round a
rank exchanges with one peer only, so a message that is one contiguous view goes straight from the
old store or into the new store; anything else -- column slices, several small pieces -- is packed
into a round buffer or unpacked from one.

Two rounds are on the wire at once: round k+1 is packed and posted before round k is waited for and
unpacked, so the wire never idles between rounds. The round buffers are two per direction (one per
round parity), allocated once per move: transient memory is at most 2 rounds x 2 directions x
``chunk_bytes`` whatever the size of the move. No helper thread: the order of the calls in
:func:`exchange` is the whole schedule.

A new store may take over an old buffer of the same shape (``reuse.py``: kept boxes then stay where
they are and received rows land in memory already faulted in). A write into such a buffer must come
after every read of the old bytes under it; :func:`plan_moves` checks this against the fixed order of
the loop (a send whose region is received into while it is on the wire is packed first, so it reads
before the round is posted; a local copy reading received-into memory runs before round 0) and reports
the buffers where the order cannot hold (``Moves.conflicts``): the caller gives those fresh memory.

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

from .pieces import cut, itemsize, piece_numel

__all__ = ["CHUNK_BYTES", "Item", "Segment", "Message", "Moves", "cut_messages", "plan_moves", "exchange",
           "local_index"]

# Per message. Per-round latency is noise at this size; on the 2-core CPU box, 102.4 MB in 4 MiB
# all-to-all rounds took about half the time of 16 MiB rounds (paired, loaded machine; a table swap
# 0.71x vs 1.65x the one-shot floor, a column-block swap no different), and it bounds memory lower.
CHUNK_BYTES = 4 << 20


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


class _Staging:
    """Round buffers for the messages that are packed or unpacked: one per (direction, round parity),
    sized for the largest such message and allocated once per move. Round k+2 reuses round k's memory
    (k's sends are done and its receives unpacked by then): a fresh buffer per round would pay
    first-touch page faults on every round, which on CPU cost about as much as the wire."""

    def __init__(self, rounds: list, device):
        sizes: dict = {}
        for k, (sends, recvs) in enumerate(rounds):
            for what, msgs in (("send", sends), ("recv", recvs)):
                for msg in msgs.values():
                    if _staged(msg, what):
                        sizes[what, k % 2] = max(sizes.get((what, k % 2), 0), msg.nbytes)
        self.buffers = {key: torch.empty(n, dtype=torch.uint8, device=device) for key, n in sizes.items()}
        self.nbytes = sum(sizes.values())
        self.none = torch.empty(0, dtype=torch.uint8, device=device)


def _staged(msg: Message, what: str) -> bool:
    if what == "send":
        return msg.pack or _direct(msg, "src") is None
    return _direct(msg, "dst") is None


def _segment_bytes(buf: torch.Tensor, s: Segment, like: torch.Tensor) -> torch.Tensor:
    return buf[s.offset:s.offset + s.nbytes].view(like.dtype).view(like.shape)


class _Round:
    """Round k on this rank: at most one message out and one in, packed, on the wire, unpacked."""

    def __init__(self, k: int, sends: dict, recvs: dict, staging: _Staging):
        self.k, self.sends, self.recvs, self.staging = k, sends, recvs, staging
        self.work, self.unpack = None, None

    def _buffer(self, what: str, msg: Message) -> torch.Tensor:
        if not _staged(msg, what):
            return _direct(msg, "src" if what == "send" else "dst")
        return self.staging.buffers[what, self.k % 2][:msg.nbytes]

    def start(self, group, world: int) -> None:
        """Pack the send, post the round (async)."""
        send = recv = self.staging.none
        ins, outs = [0] * world, [0] * world
        for peer, msg in self.sends.items():
            send, ins[peer] = self._buffer("send", msg), msg.nbytes
            if _staged(msg, "send"):
                for s in msg.segments:
                    v = s.view("src")
                    _segment_bytes(send, s, v).copy_(v)
        for peer, msg in self.recvs.items():
            recv, outs[peer] = self._buffer("recv", msg), msg.nbytes
            self.unpack = (recv, msg) if _staged(msg, "recv") else None
        self.work = dist.all_to_all_single(recv, send, outs, ins, group=group, async_op=True)

    def finish(self) -> None:
        """Wait for the round, unpack the receive."""
        self.work.wait()
        if self.unpack is not None:
            buf, msg = self.unpack
            for s in msg.segments:
                v = s.view("dst")
                v.copy_(_segment_bytes(buf, s, v))
        self.work = self.unpack = None


def _items(pieces: list, kinds: list, me: int, views, dtype) -> tuple[dict, list]:
    """({(src, dst): [Item]} for every pair -- views on this rank's side only; the others' items
    carry sizes, so every rank cuts every pair alike -- and [(src view, dst view)] local copies)."""
    pairs, local = {}, []
    sizes = {what: itemsize(what, dtype) for what, _ in kinds}
    for p in pieces:
        for what, kind in kinds:
            if not piece_numel(p, kind) or (p.src == p.dst and p.src != me):
                continue
            src = cut(views(p.src_box, what, old=True), p.src_box, p, kind) if p.src == me else None
            dst = cut(views(p.dst_box, what, old=False), p.dst_box, p, kind) if p.dst == me else None
            if p.src == p.dst:
                local.append((src, dst))
                continue
            row_bytes = sizes[what] * (p.c1 - p.c0 if kind == "elem" else 1)
            pairs.setdefault((p.src, p.dst), []).append(Item(p.src, p.dst, p.r1 - p.r0, row_bytes, src, dst))
    return pairs, local


def _pairings(world: int) -> list:
    """The ranks paired off, world-1 times (world times for an odd world, one rank idle each time),
    so that every two ranks meet once: a round-robin tournament (circle method)."""
    n = world + world % 2
    out = []
    for i in range(n - 1):
        pairs = [(i, n - 1)] + [((i + k) % (n - 1), (i - k) % (n - 1)) for k in range(1, n // 2)]
        out.append([(a, b) for a, b in pairs if a < world and b < world])
    return out


def _rounds(pairs: dict, me: int, world: int, chunk_bytes: int) -> list:
    """[(sends {peer: Message}, receives {peer: Message})] per round, the same list of rounds on every
    rank: per pairing, as many rounds as its longest direction has messages; message m of both
    directions of every pair travels in round m (a swap's two directions together)."""
    rounds: list = []
    for pairing in _pairings(world):
        cuts = {(a, b): cut_messages(pairs.get((a, b), []), chunk_bytes) for x, y in pairing
                for a, b in ((x, y), (y, x))}
        peer = next((b for a, b in cuts if a == me), None)
        for m in range(max((len(c) for c in cuts.values()), default=0)):
            out = cuts.get((me, peer), [])
            into = cuts.get((peer, me), [])
            rounds.append(({peer: out[m]} if m < len(out) else {}, {peer: into[m]} if m < len(into) else {}))
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

    Times in :func:`exchange`'s order: round j is packed at 4j, posted at 4j+1, done by 4j+6 (its
    wait comes after round j+1 is posted) and unpacked at 4j+7; early local copies run at -2, the
    others at 2. A direct send reads during [4j+1, 4j+6], a packed one at 4j; a direct receive writes
    from 4k+1, an unpacked one at 4k+7. Returns (early copies, late copies, conflicting storages) and
    marks the sends that must be packed."""
    writes: dict = {}
    for k, (_, recvs) in enumerate(rounds):
        for msg in recvs.values():
            when = 4 * k + 1 if _direct(msg, "dst") is not None else 4 * k + 7
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
            if first <= 4 * j + 6 and not msg.pack and _direct(msg, "src") is not None:
                msg.pack = True          # read before the round is posted instead of during it
            if first <= 4 * j:
                conflicts.update(sp[0] for sp in spans if _first_write(sp, writes) <= 4 * j)
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


def plan_moves(pieces: list, kinds: list, views, me: int, world: int, dtype,
               chunk_bytes: int = CHUNK_BYTES) -> Moves:
    """This rank's messages and local copies for ``pieces`` (no communication).

    ``views(box, what, old)`` returns the rows of ``box`` in an old (``old=True``) or new store for
    the weights (``what=None``) or a state tensor; ``dtype``: the weights' dtype. A local copy from a
    view onto itself (a kept box in a buffer the new store took over) is dropped: its bytes are
    already in place.
    """
    pairs, local = _items(pieces, kinds, me, views, dtype)
    local = [(src, dst) for src, dst in local if not _same(src, dst)]
    rounds = _rounds(pairs, me, world, chunk_bytes)
    early, late, conflicts = _order(rounds, local)
    return Moves(rounds, early + late, len(early), conflicts)


@torch.no_grad()
def exchange(moves: Moves, group, device) -> dict:
    """Run a planned move; collective over ``group`` (every rank runs its own plan of the same pieces).

    Returns ``{"bytes_local": ..., "transient_peak": ...}``: bytes copied without the wire and the
    bytes of round buffers this rank allocated (all alive until the move ends).
    """
    assert not moves.conflicts, f"exchange: writes would clobber unread bytes in storages {moves.conflicts}"
    world = dist.get_world_size(group)
    staging = _Staging(moves.rounds, device)
    rounds = [_Round(k, s, r, staging) for k, (s, r) in enumerate(moves.rounds)]
    for src, dst in moves.local[:moves.early]:    # they read memory that round 0 may receive into
        dst.copy_(src)
    if rounds:
        rounds[0].start(group, world)
    for src, dst in moves.local[moves.early:]:    # while round 0 is on the wire
        dst.copy_(src)
    for k, rnd in enumerate(rounds):
        if k + 1 < len(rounds):
            rounds[k + 1].start(group, world)     # on the wire behind round k: the wire never idles
        rnd.finish()
    local_bytes = sum(s.numel() * s.element_size() for s, _ in moves.local)
    return {"bytes_local": local_bytes, "transient_peak": staging.nbytes}


def local_index(groups) -> dict:
    """{my box: (store, index in store)} over ``groups``."""
    out = {}
    for g in groups:
        for i in g.store.loc:
            out[g.store.boxes[i]] = (g.store, i)
    return out
