"""The move of a reshard: every piece from the old stores into the new ones, one way for every backend:
messages of at most ``chunk_bytes``, one ``all_to_all_single`` per round, two rounds on the wire, two
round buffers per direction. Why, and the ordering check: docs/reshard.md, "How it works", step 4.

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
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from .pieces import cut, itemsize, piece_numel

__all__ = ["CHUNK_BYTES", "Item", "Segment", "Message", "Moves", "cut_messages", "plan_moves", "exchange"]

CHUNK_BYTES = 4 << 20   # per message: half the time of 16 MiB on the 2-core box (docs/reshard.md), less memory
NEVER = float("inf")


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


class Segment(NamedTuple):
    """Rows ``rows`` = [r0, r1) of ``item``, ``nbytes`` bytes at byte ``offset`` of a message."""

    item: Item
    rows: tuple
    offset: int
    nbytes: int

    def view(self, side: str) -> torch.Tensor:
        return (self.item.src_view if side == "src" else self.item.dst_view)[self.rows[0]:self.rows[1]]


@dataclass
class Message:
    """Segments travelling together; ``pack``: the send goes through a round buffer even when it is
    one contiguous view (its memory is received into while it is on the wire)."""

    segments: list = field(default_factory=list)
    nbytes: int = 0
    pack: bool = False

    def next_offset(self) -> int:
        return -(-self.nbytes // 8) * 8       # 8-byte aligned, so any dtype can view its segment

    def add(self, item: Item, r0: int, r1: int) -> None:
        self.segments.append(Segment(item, (r0, r1), self.next_offset(), (r1 - r0) * item.row_bytes))
        self.nbytes = self.segments[-1].offset + self.segments[-1].nbytes


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
                out.append(Message())
                out[-1].add(it, r, r1)
                continue
            if small.segments and small.next_offset() + (r1 - r) * it.row_bytes > chunk_bytes:
                out.append(small)
                small = Message()
            small.add(it, r, r1)
    return out + ([small] if small.segments else [])


def _direct(msg: Message, side: str) -> Optional[torch.Tensor]:
    """The message's bytes in place on ``side`` ('src' or 'dst'): one contiguous segment and, for a
    send, not marked ``pack``. None: it goes through a round buffer."""
    if len(msg.segments) != 1 or (side == "src" and msg.pack):
        return None
    v = msg.segments[0].view(side)
    return v.reshape(-1).view(torch.uint8) if v.is_contiguous() else None


class Moves(NamedTuple):
    """One rank's part of a move, planned and not yet run: ``rounds`` [(sends {peer: Message},
    receives {peer: Message})], local copies [(src view, dst view)] run ``early`` (before round 0 is
    posted) or ``late`` (while it travels), and ``conflicts``: storages (data pointers) where a write
    would land before a read of the old bytes under it (empty when every new store is fresh memory)."""

    rounds: list
    early: list
    late: list
    conflicts: set


def plan_moves(pieces: list, kinds: list, views, me: int, world: int, dtype,
               chunk_bytes: int = CHUNK_BYTES) -> Moves:
    """This rank's messages and local copies for ``pieces`` (no communication).

    ``views(box, what, old)`` returns the rows of ``box`` in an old (``old=True``) or new store for
    the weights (``what=None``) or a state tensor; ``dtype``: the weights' dtype. Every rank cuts
    every pair's messages alike: the items of other ranks' pairs carry sizes only. A local copy from a
    view onto itself (a kept box in a buffer the new store took over) is dropped: it is in place.
    """
    pairs, local = {}, []
    for p in pieces:
        for what, kind in kinds:
            if not piece_numel(p, kind) or (p.src == p.dst and p.src != me):
                continue
            src = cut(views(p.src_box, what, old=True), p.src_box, p, kind) if p.src == me else None
            dst = cut(views(p.dst_box, what, old=False), p.dst_box, p, kind) if p.dst == me else None
            if p.src != p.dst:
                row_bytes = itemsize(what, dtype) * (p.c1 - p.c0 if kind == "elem" else 1)
                pairs.setdefault((p.src, p.dst), []).append(Item(p.src, p.dst, p.r1 - p.r0, row_bytes, src, dst))
            elif (src.data_ptr(), src.shape, src.stride()) != (dst.data_ptr(), dst.shape, dst.stride()):
                local.append((src, dst))
    rounds = _rounds(pairs, me, world, chunk_bytes)
    return Moves(rounds, *_order(rounds, local))


def _rounds(pairs: dict, me: int, world: int, chunk_bytes: int) -> list:
    """[(sends {peer: Message}, receives {peer: Message})] per round, the same list on every rank.

    The ranks are paired off world-1 times (world times for an odd world, one rank idle each time) so
    that every two meet once: a round-robin tournament (circle method). Per pairing, as many rounds as
    its longest direction has messages; message m of both directions of every pair travels in round m
    (a swap's two directions together)."""
    n, rounds = world + world % 2, []
    for i in range(n - 1):
        pairing = [(i, n - 1)] + [((i + k) % (n - 1), (i - k) % (n - 1)) for k in range(1, n // 2)]
        cuts = {(a, b): cut_messages(pairs.get((a, b), []), chunk_bytes) for x, y in pairing
                if x < world and y < world for a, b in ((x, y), (y, x))}
        peer = next((b for a, b in cuts if a == me), None)
        out, into = cuts.get((me, peer), []), cuts.get((peer, me), [])
        for m in range(max((len(c) for c in cuts.values()), default=0)):
            rounds.append(({peer: out[m]} if m < len(out) else {}, {peer: into[m]} if m < len(into) else {}))
    return rounds


def _span(t: torch.Tensor) -> tuple:
    """(storage, first byte, end byte) of the memory a view touches (a column slice's other columns
    included: conservative)."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.untyped_storage().data_ptr(), t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _first_overlap(timed: list):
    """``first(span)``: the earliest time among ``timed`` [(span, time)] whose span overlaps ``span``
    (NEVER if none). Sorted per storage, so a lookup stays fast with thousands of small pieces in one
    buffer: only spans starting in (lo - longest span, hi) can overlap [lo, hi)."""
    spans: dict = {}
    for (store, lo, hi), when in timed:
        spans.setdefault(store, []).append((lo, hi, when))
    for v in spans.values():
        v.sort()
    starts = {store: [a for a, _, _ in v] for store, v in spans.items()}
    longest = {store: max(b - a for a, b, _ in v) for store, v in spans.items()}

    def first(span: tuple) -> float:
        store, lo, hi = span
        if store not in spans:
            return NEVER
        i, j = bisect.bisect_right(starts[store], lo - longest[store]), bisect.bisect_left(starts[store], hi)
        return min((w for a, b, w in spans[store][i:j] if lo < b), default=NEVER)
    return first


def _order(rounds: list, local: list) -> tuple:
    """Check every read of old bytes against the writes that land on them, in :func:`exchange`'s order.

    Times: round j is packed at 4j, posted at 4j+1, done by 4j+6 (its wait comes after round j+1 is
    posted) and unpacked at 4j+7; early local copies run at -2, the others at 2. A direct send reads
    during [4j+1, 4j+6], a packed one at 4j; a direct receive writes from 4j+1, an unpacked one at
    4j+7. Marks the sends that must be packed; returns (early copies, late copies, conflicting storages)."""
    first_write = _first_overlap([(_span(s.view("dst")), 4 * k + (1 if _direct(msg, "dst") is not None else 7))
                                  for k, (_, recvs) in enumerate(rounds) for msg in recvs.values()
                                  for s in msg.segments])
    reads = [_span(src) for src, _ in local]
    conflicts = set()
    for j, (sends, _) in enumerate(rounds):
        for msg in sends.values():
            spans = [_span(s.view("src")) for s in msg.segments]
            firsts = [first_write(sp) for sp in spans]
            reads.extend(spans)
            if min(firsts, default=NEVER) <= 4 * j + 6 and _direct(msg, "src") is not None:
                msg.pack = True           # read before the round is posted instead of during it
            conflicts.update(sp[0] for sp, when in zip(spans, firsts) if when <= 4 * j)
    first_read = _first_overlap([(sp, 0) for sp in reads])
    early, late = [], []
    for src, dst in local:
        if first_read(_span(dst)) < NEVER:
            conflicts.add(_span(dst)[0])  # it would overwrite old bytes another part still reads
        (early if first_write(_span(src)) < NEVER else late).append((src, dst))
    return early, late, conflicts


def _stage(msg: Message, side: str, buf: torch.Tensor) -> None:
    """Pack a send into ``buf`` (``side='src'``) or unpack a receive from it (``'dst'``)."""
    for s in msg.segments:
        view = s.view(side)
        part = buf[s.offset:s.offset + s.nbytes].view(view.dtype).view(view.shape)
        if side == "src":
            part.copy_(view)
        else:
            view.copy_(part)


def _post(k: int, rounds: list, buffers: dict, group, world: int, empty: torch.Tensor):
    """Pack round ``k``'s send and post the round (async)."""
    tensors, splits = {"src": empty, "dst": empty}, {"src": [0] * world, "dst": [0] * world}
    for side, msgs in zip(("src", "dst"), rounds[k]):
        for peer, msg in msgs.items():
            buf = _direct(msg, side)
            if buf is None:
                buf = buffers[side, k % 2][:msg.nbytes]
                if side == "src":
                    _stage(msg, side, buf)
            tensors[side], splits[side][peer] = buf, msg.nbytes
    return dist.all_to_all_single(tensors["dst"], tensors["src"], splits["dst"], splits["src"], group=group,
                                  async_op=True)


@torch.no_grad()
def exchange(moves: Moves, group, device) -> int:
    """Run a planned move; collective over ``group`` (every rank runs its own plan of the same pieces).
    Round k+1 is packed and posted before round k is waited for and unpacked, so the wire never idles.
    Returns the bytes of round buffers this rank allocated (all alive until the move ends)."""
    assert not moves.conflicts, f"exchange: writes would clobber unread bytes in storages {moves.conflicts}"
    world, rounds = dist.get_world_size(group), moves.rounds
    # one buffer per (side, round parity) for the messages packed or unpacked, sized for the largest:
    # round k+2 reuses round k's, since a fresh buffer per round would pay first-touch page faults
    sizes: dict = {}
    for k, messages in enumerate(rounds):
        for side, msgs in zip(("src", "dst"), messages):
            for msg in (m for m in msgs.values() if _direct(m, side) is None):
                sizes[side, k % 2] = max(sizes.get((side, k % 2), 0), msg.nbytes)
    buffers = {key: torch.empty(n, dtype=torch.uint8, device=device) for key, n in sizes.items()}
    empty = torch.empty(0, dtype=torch.uint8, device=device)
    for src, dst in moves.early:          # they read memory that round 0 may receive into
        dst.copy_(src)
    work = _post(0, rounds, buffers, group, world, empty) if rounds else None
    for src, dst in moves.late:           # while round 0 is on the wire
        dst.copy_(src)
    for k in range(len(rounds)):
        done = work
        if k + 1 < len(rounds):
            work = _post(k + 1, rounds, buffers, group, world, empty)   # on the wire behind round k
        done.wait()
        for msg in rounds[k][1].values():
            if _direct(msg, "dst") is None:
                _stage(msg, "dst", buffers["dst", k % 2])
    return sum(sizes.values())
