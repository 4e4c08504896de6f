"""The gloo side of a reshard's move: every send, receive and local copy in one schedule driven by the
memory each of them reads and writes.

New buffers reuse old memory (``reshard_memory.carve``), so a write may land on bytes that a send, a
pack or a local copy still has to read. Each op that writes (a receive, a local copy) waits for
exactly the reads of the memory it overwrites -- nothing else -- and the main thread does whatever
is ready, receives first, then local work in plan order:

* sends of contiguous old memory are posted at once; their read is done when the send is;
* column slices are packed chunk by chunk in plan order, each chunk sent as soon as it is packed, so
  the wire starts after the first chunk and packing overlaps the transfer;
* a receive goes straight into its place as soon as nothing reads that memory any more; a receive
  that would have to wait for that sits in a small ring of reused buffers (posted early, so the
  peer's sends keep flowing) and is copied into place once its memory is free;
* a local copy runs once its destination is free; one overlapping only its own source moves in
  place block by block (like ``memmove``); copies waiting on each other in a cycle read their source
  into a temporary first.

Sends, packed sends and receives are waited for on three helper threads (gloo's point-to-point works
cannot be polled and have no futures, and each must be waited exactly once), which wake the main
thread. If nothing moves for a while, the ring grows by a buffer when receives are still unposted
(the peers' sends may wait for them), and packs still waiting for a pooled buffer go out through
temporaries (our held-back receives may wait for them while the peers wait for those receives): no
pair of ranks waits on each other. Which messages go where never depends on the schedule -- only
when each is posted and where it lands first.
"""

from __future__ import annotations

import bisect
import heapq
import queue
import threading
from collections import deque
from typing import Optional

import torch
import torch.distributed as dist

from .reshard_memory import fresh, fresh_copy, span

__all__ = ["run_schedule", "move_in_place", "SEND", "RECV", "COPY"]


class _Waiter:
    """Waits, on a helper thread, for works in the order they are added; ``done`` counts those finished."""

    def __init__(self, cond: threading.Condition, name: str):
        self.done, self.posted, self.error = 0, 0, None
        self._cond, self._q = cond, queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, work) -> int:
        self._q.put(work)
        self.posted += 1
        return self.posted - 1

    def _run(self) -> None:
        while (work := self._q.get()) is not None:
            try:
                work.wait()
            except BaseException as exc:   # re-raised on the main thread
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self.done += 1
                self._cond.notify_all()

    def close(self, timeout: Optional[float] = None) -> None:
        """Wait for every work added (``timeout``: give up after that many seconds -- only after a
        failure, when a peer may never answer; the thread is a daemon)."""
        self._q.put(None)
        self._thread.join(timeout)
        if self.error is not None and timeout is None:
            raise self.error


SEND, RECV, COPY = "send", "recv", "copy"
_PACKS = 4      # pooled buffers for packed sends in flight (beyond that, after a stall: temporaries)


class _Op:
    """One send, receive or local copy, at position ``index`` of the plan. ``src``: old memory it reads;
    ``dst``: new memory it writes."""

    __slots__ = ("index", "kind", "src", "dst", "peer", "tag", "waiting", "blocks", "after", "read",
                 "queued", "finished", "buf", "slot", "posted")

    def __init__(self, index: int, kind: str, src, dst, peer=None, tag=0):
        self.index, self.kind, self.src, self.dst, self.peer, self.tag = index, kind, src, dst, peer, tag
        self.waiting = 0          # reads of dst's memory by other ops not done yet
        self.blocks: list = []    # writers waiting for this op's read
        self.after: list = []     # the readers this op waits for
        self.read = src is None   # this op's read of old memory is done
        self.queued = self.finished = False
        self.buf = None           # where the data sits before it lands (ring slot view or temporary)
        self.slot = None          # the pooled buffer behind a ring receive or a packed send
        self.posted = -1          # receive: index in the receive waiter

    def __lt__(self, other: "_Op") -> bool:
        return self.index < other.index


def _link(ops: list) -> None:
    """Make every writer wait for the other ops reading the memory it overwrites."""
    readers = sorted(((span(op.src), op) for op in ops if op.src is not None and op.src.numel()),
                     key=lambda x: (x[0], x[1].index))
    starts = [s[0] for s, _ in readers]
    longest = max((s1 - s0 for (s0, s1), _ in readers), default=0)
    for op in ops:
        if op.dst is None or not op.dst.numel():
            continue
        lo, hi = span(op.dst)
        first = bisect.bisect_left(starts, lo - longest)     # no reader starting earlier reaches lo
        for (_, s1), r in readers[first:bisect.bisect_left(starts, hi)]:
            if s1 > lo and r is not op:
                r.blocks.append(op)
                op.after.append(r)
                op.waiting += 1


def _cyclic(copies: list) -> list:
    """Local copies that wait, directly or not, on another copy in a cycle of waits (Kahn's algorithm
    over copy-to-copy waits: whatever cannot be ordered)."""
    mine = {id(op) for op in copies}
    need = {id(op): 0 for op in copies}
    for op in copies:
        for w in op.blocks:
            if id(w) in mine:
                need[id(w)] += 1
    free, ordered = [op for op in copies if need[id(op)] == 0], set()
    while free:
        op = free.pop()
        ordered.add(id(op))
        for w in op.blocks:
            if id(w) in mine:
                need[id(w)] -= 1
                if need[id(w)] == 0:
                    free.append(w)
    return [op for op in copies if id(op) not in ordered]


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


def move_in_place(src: torch.Tensor, dst: torch.Tensor) -> bool:
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


def _remote(ops: list) -> set:
    """ids of the writers whose memory becomes free only once some send has finished, i.e. through
    the peers' progress rather than this rank's own local work."""
    out: set = set()
    for op in ops:     # a copy only waits for readers earlier or later in the plan: resolve to a fixpoint
        if op.kind == SEND and op.src.is_contiguous():
            out.add(id(op))
    changed = True
    while changed:
        changed = False
        for op in ops:
            if id(op) not in out and op.dst is not None and any(
                    id(r) in out for r in op.after if not r.read):
                out.add(id(op))
                changed = True
    return out


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1



class _Pool:
    """Byte buffers of one size for packed sends and ring receives, at most ``caps[use]`` in use each.

    Buffers come from ``scratch`` (a list the caller keeps) and new ones are added to it: a reshard
    reuses the previous one's buffers instead of faulting fresh pages in again (here that costs about
    as much as copying the same bytes twice)."""

    def __init__(self, scratch: list, nbytes: int, device, ring: int, packs: int):
        usable = [b for b in scratch if b.numel() >= nbytes and b.device == torch.device(device)]
        scratch[:] = usable      # buffers too small for this move would never be used again
        # new ones as big as the kept ones: a later move that needs less reuses them all
        self.scratch, self.device = scratch, device
        self.nbytes = max([nbytes] + [b.numel() for b in usable])
        self.free = list(usable)
        self.caps, self.used = {"ring": ring, "pack": packs}, {"ring": 0, "pack": 0}

    def take(self, use: str):
        if self.used[use] >= self.caps[use]:
            return None
        if not self.free:
            buf = fresh((self.nbytes,), torch.uint8, self.device)
            self.scratch.append(buf)
            self.free.append(buf)
        self.used[use] += 1
        return self.free.pop()

    def give(self, buf, use: str) -> None:
        self.used[use] -= 1
        self.free.append(buf)

    def grow(self) -> None:
        self.caps["ring"] += 1

    def trim(self, keep: int) -> None:
        """Keep at most ``keep`` buffers for the next call (a stall may have grown the ring)."""
        del self.scratch[keep:]


def _view(slot: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return slot[:like.numel() * like.element_size()].view(like.dtype).view(like.shape)


class _Schedule:
    def __init__(self, steps: list, group, ring: int, patience: float, scratch: list):
        self.group, self.patience = group, patience
        self.ops = [_Op(i, *s) for i, s in enumerate(steps)]
        _link(self.ops)
        nbytes = max((t.numel() * t.element_size() for op in self.ops for t in (op.src, op.dst)
                      if t is not None and (op.kind == RECV or op.kind == SEND and not t.is_contiguous())),
                     default=0)
        device = next((t.device for op in self.ops for t in (op.src, op.dst) if t is not None), "cpu")
        self.pool = _Pool(scratch, nbytes, device, ring, _PACKS)
        self.cond = threading.Condition()
        self.sends, self.recvs = _Waiter(self.cond, "reshard-sends"), _Waiter(self.cond, "reshard-recvs")
        # packed sends are waited for on their own thread: a pack buffer comes back as soon as its
        # send is done, not after every contiguous send posted before it
        self.packs = _Waiter(self.cond, "reshard-packs")
        self.posted_sends, self.posted_recvs, self.posted_packs = [], [], []
        self.seen = (0, 0, 0)
        self.keep = ring + _PACKS
        self.ready: list = []              # heap of local work (packs, copies) ready to run
        self.unposted: deque = deque()     # receives not posted yet, plan order
        self.arrived: list = []            # ring receives arrived whose memory is free
        self.blocked: list = []            # packs waiting for a buffer
        self.left = 0

    # -- events --------------------------------------------------------------------------------------
    def _read_done(self, op: _Op) -> None:
        op.read = True
        for w in op.blocks:
            w.waiting -= 1
            if w.waiting == 0:
                self._free_to_write(w)

    def _queue(self, op: _Op) -> None:
        if not op.queued:
            op.queued = True
            heapq.heappush(self.ready, op)

    def _free_to_write(self, op: _Op) -> None:
        if op.kind == COPY:
            self._queue(op)
        elif op.posted < 0:
            if op.dst.is_contiguous():
                self._recv(op, op.dst)
        elif op.posted < self.seen[1]:
            self.arrived.append(op)

    def _counts(self) -> tuple:
        return self.sends.done, self.recvs.done, self.packs.done

    def _absorb(self) -> None:
        """Sends and receives finished since last time (under the lock)."""
        sends, recvs, packs = self._counts()
        for op in self.posted_sends[self.seen[0]:sends]:
            self._read_done(op)
        for op in self.posted_packs[self.seen[2]:packs]:
            if op.slot is not None:      # its pack buffer is free again
                self.pool.give(op.slot, "pack")
                op.slot = None
                for b in self.blocked:
                    self._queue(b)
                self.blocked.clear()
        for op in self.posted_recvs[self.seen[1]:recvs]:
            if op.slot is not None and op.waiting == 0:
                self.arrived.append(op)
        self.seen = (sends, recvs, packs)
        for w in (self.sends, self.recvs, self.packs):
            if w.error is not None:
                raise w.error

    # -- actions -------------------------------------------------------------------------------------
    def _peer(self, op: _Op) -> int:
        return dist.get_global_rank(self.group, op.peer)

    def _send(self, op: _Op, buf: torch.Tensor) -> None:
        work = dist.isend(buf, self._peer(op), self.group, op.tag)
        if buf is op.src:
            self.sends.add(work)
            self.posted_sends.append(op)
        else:
            self.packs.add(work)
            self.posted_packs.append(op)
            self._read_done(op)      # packed: its old memory is read already
        if not op.finished:
            op.finished = True
            self.left -= 1

    def _recv(self, op: _Op, buf: torch.Tensor) -> None:
        op.buf, op.posted = buf, self.recvs.add(dist.irecv(buf, self._peer(op), self.group, op.tag))
        self.posted_recvs.append(op)
        if buf is op.dst:
            op.finished = True
            self.left -= 1

    def _run_local(self, op: _Op) -> None:
        if op.kind == SEND:
            op.slot = self.pool.take("pack")
            if op.slot is None:          # every pack buffer is still being sent: try again later
                op.queued = False
                self.blocked.append(op)
                return
            buf = _view(op.slot, op.src)
            buf.copy_(op.src)
            self._send(op, buf)
            return
        if op.buf is not None:
            op.dst.copy_(op.buf)
        elif not _overlap(op.src, op.dst):
            op.dst.copy_(op.src)
        elif not move_in_place(op.src, op.dst):
            op.buf = fresh_copy(op.src)
            self._read_done(op)
            op.dst.copy_(op.buf)
        op.buf, op.finished = None, True
        self.left -= 1
        if not op.read:
            self._read_done(op)

    def _fill_ring(self) -> bool:
        moved = False
        while self.unposted:
            op = self.unposted[0]
            if op.posted >= 0:
                self.unposted.popleft()
                continue
            op.slot = self.pool.take("ring")
            if op.slot is None:
                break
            self._recv(op, _view(op.slot, op.dst))
            self.unposted.popleft()
            moved = True
        return moved

    def _land(self) -> bool:
        moved = bool(self.arrived)
        for op in self.arrived:
            op.dst.copy_(op.buf)
            self.pool.give(op.slot, "ring")
            op.buf = op.slot = None
            op.finished = True
            self.left -= 1
        self.arrived.clear()
        return moved

    # -- driver --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Post what can go now; a receive whose memory this rank frees by its own work alone waits for
        it (and lands without a copy), one that waits for the peers' progress takes the ring."""
        self.left = len(self.ops)
        staged = _cyclic([op for op in self.ops if op.kind == COPY])
        for op in self.ops:
            if op.kind == SEND and op.src.is_contiguous():
                self._send(op, op.src)
        for op in staged:
            op.buf = fresh_copy(op.src)
            self._read_done(op)
        remote = _remote(self.ops)
        for op in self.ops:
            if op.kind == RECV and op.posted < 0:
                if op.waiting == 0 and op.dst.is_contiguous():
                    self._recv(op, op.dst)
                elif id(op) in remote or not op.dst.is_contiguous():
                    self.unposted.append(op)
            elif op.kind == SEND and not op.finished or op.kind == COPY and op.waiting == 0:
                self._queue(op)

    def run(self) -> None:
        while self.left:
            with self.cond:
                self._absorb()
                seen = self.seen
            moved = self._fill_ring() | self._land()
            if self.ready:
                self._run_local(heapq.heappop(self.ready))
                continue
            if moved:
                continue
            with self.cond:
                progress = self.cond.wait_for(lambda: self._counts() != seen or any(
                    w.error for w in (self.sends, self.recvs, self.packs)), self.patience)
            if not progress:
                self._unstick()

    def _unstick(self) -> None:
        """Nothing moved for a while. Receives waiting for a ring buffer may be what the peers' sends
        wait for: grow the ring. Packs waiting for a buffer may be what our own held-back receives
        wait for, while the peers wait for those: pack them into temporaries now (transient memory of
        moved data; the pool stays small)."""
        if self.unposted:
            self.pool.grow()
        for op in self.blocked:
            buf = fresh_copy(op.src)
            self._send(op, buf)
        if not self.unposted and not self.blocked and all(
                w.done == w.posted for w in (self.sends, self.recvs, self.packs)):
            # nothing in flight and nothing local can run: a bug in the waits, never the peers' fault
            raise AssertionError(f"reshard schedule stuck with {self.left} steps left and no message in flight")
        self.blocked.clear()

    def close(self, failed: bool) -> None:
        """Wait for every message; after a failure only briefly (a peer may never answer), and drop
        the pool, whose buffers gloo may still be writing into."""
        timeout = 1.0 if failed else None
        try:
            for w in (self.sends, self.recvs, self.packs):
                w.close(timeout)
        finally:
            if failed:
                self.pool.scratch.clear()
            else:
                self.pool.trim(self.keep)


def run_schedule(steps: list, group, *, ring: int, patience: float, scratch: Optional[list] = None) -> None:
    """Carry out ``steps`` in plan order: ``(SEND, src, None, peer, tag)``, ``(RECV, None, dst, peer,
    tag)`` or ``(COPY, src, dst)`` (peers are group ranks), each write waiting only for the reads of
    the memory it overwrites. ``ring``: receive buffers to start with; ``patience``: seconds without
    progress before the ring grows; ``scratch``: a list of buffers to reuse and to leave the buffers
    in for the next call (None: fresh ones, dropped afterwards)."""
    sched = _Schedule(steps, group, ring, patience, [] if scratch is None else scratch)
    try:
        sched.start()
        sched.run()
    except BaseException:
        sched.close(failed=True)
        raise
    sched.close(failed=False)
