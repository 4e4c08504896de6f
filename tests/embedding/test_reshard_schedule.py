"""The reshard's gloo schedule: writes wait only for the reads of the memory they overwrite.

Local copies alone need no process group, so the ordering rules are checked here in one process
against plain tensor indexing; two ranks as two threads over a fake wire that behaves like gloo's
point-to-point check the waits between ranks; real gloo runs in the multi-rank reshard tests
(``test_reshard*.py``), which compare every moved byte and a fresh sharding.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, settings, strategies as st

from shardwise.embedding import reshard_schedule
from shardwise.embedding.reshard_schedule import COPY, RECV, SEND, run_schedule

pytestmark = pytest.mark.timeout(120)   # a wrong wait would spin; fail instead of holding CI


def _run(copies: list) -> None:
    run_schedule([(COPY, s, d) for s, d in copies], None, ring=1, patience=0.01)


def test_two_blocks_swapping_places_go_through_a_temporary():
    buf = torch.arange(8.0)
    want = torch.cat([buf[4:], buf[:4]])
    _run([(buf[:4], buf[4:]), (buf[4:], buf[:4])])    # each waits for the other's read: a cycle
    assert torch.equal(buf, want)


def test_a_shift_runs_in_an_order_that_reads_before_it_writes():
    buf = torch.arange(12.0)
    want = torch.cat([buf[4:8], buf[8:12], buf[8:12]])
    # block 1 -> 0 must run before block 2 -> 1 overwrites block 1; listed the other way round
    _run([(buf[8:12], buf[4:8]), (buf[4:8], buf[:4])])
    assert torch.equal(buf, want)


def test_rows_to_a_column_block_in_the_same_memory():
    n = 100
    buf = torch.arange(n * 64.0)
    rows = buf.view(n, 64)
    want = rows[:, :32].clone()
    _run([(rows[:, :32], buf[:n * 32].view(n, 32))])   # overlaps only its own source: moved like memmove
    assert torch.equal(buf[:n * 32].view(n, 32), want)


@settings(max_examples=60, deadline=None)
@given(perm=st.permutations(range(6)), shift=st.integers(0, 3), width=st.sampled_from([1, 3, 4]))
def test_any_permutation_of_blocks_within_one_buffer(perm, shift, width):
    """Blocks of one buffer permuted among themselves, destinations shifted by part of a block (so
    sources and destinations overlap in every way): the result is the permutation, bit for bit."""
    rows = 5
    buf = torch.arange(float((6 * rows + shift) * width)).view(-1, width)
    old = buf.clone()
    src = [buf[i * rows:(i + 1) * rows] for i in range(6)]
    dst = [buf[shift + p * rows:shift + (p + 1) * rows] for p in perm]
    _run([(s, d) for s, d in zip(src, dst)])
    for i, p in enumerate(perm):
        assert torch.equal(buf[shift + p * rows:shift + (p + 1) * rows], old[i * rows:(i + 1) * rows])


class _FakeWire:
    """Point-to-point between threads that behaves like gloo's: a send completes only once the
    matching receive is posted. ``group`` is the calling rank (how the fake tells ranks apart)."""

    def __init__(self):
        self.lock, self.sends, self.recvs = threading.Lock(), {}, {}

    class Work:
        def __init__(self):
            self.event = threading.Event()

        def wait(self):
            self.event.wait()
            return True

    def _match(self, src, send_work, dst, recv_work):
        dst.copy_(src.reshape(-1).view(dst.dtype).view(dst.shape))
        send_work.event.set()
        recv_work.event.set()

    def isend(self, buf, peer, group, tag):
        work, key = self.Work(), (group, peer, tag)
        with self.lock:
            if key in self.recvs:
                self._match(buf, work, *self.recvs.pop(key))
            else:
                self.sends[key] = (buf, work)
        return work

    def irecv(self, buf, peer, group, tag):
        work, key = self.Work(), (peer, group, tag)
        with self.lock:
            if key in self.sends:
                src, send_work = self.sends.pop(key)
                self._match(src, send_work, buf, work)
            else:
                self.recvs[key] = (buf, work)
        return work

    @staticmethod
    def get_global_rank(group, rank):
        return rank


def _two_ranks(monkeypatch, steps: list, packs: int = 4) -> None:
    wire = _FakeWire()
    monkeypatch.setattr(reshard_schedule, "dist", wire)
    monkeypatch.setattr(reshard_schedule, "_PACKS", packs)
    errors = []

    def rank(r):
        try:
            run_schedule(steps[r], r, ring=8, patience=0.01, scratch=[])
        except BaseException as exc:   # reported below
            errors.append(exc)
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert not any(t.is_alive() for t in threads), "the two ranks did not finish: a deadlock or livelock"
    assert not errors, errors


@pytest.mark.parametrize("rows,per", [(64, 4), (60, 7)])
def test_column_packs_and_held_back_receives_do_not_wait_on_each_other(monkeypatch, rows, per):
    """Row blocks become column blocks in their own memory, both ranks at once, with more packed
    chunks than pack buffers: each rank's receives wait for its own packs of later rows, and the
    peers wait for those receives (found in review as a livelock)."""
    olds = [torch.arange(2 * rows * 64.0).view(2 * rows, 64) + 1e5 * r for r in range(2)]
    want = [torch.cat([olds[0][:rows, 32 * r:32 * r + 32], olds[1][:rows, 32 * r:32 * r + 32]]) for r in range(2)]
    k = -(-rows // per)
    steps = []
    for r in range(2):
        old = olds[r]
        cw, x = old.view(-1)[:2 * rows * 32].view(2 * rows, 32), old[:rows]
        keep, give = (slice(0, 32), slice(32, 64)) if r == 0 else (slice(32, 64), slice(0, 32))
        sends = [(SEND, x[i:i + per, give], None, 1 - r, 1 + i // per + (0 if r == 0 else k)) for i in range(0, rows, per)]
        recvs = [(RECV, None, cw[(rows if r == 0 else 0) + i:][:min(per, rows - i)], 1 - r,
                  1 + i // per + (k if r == 0 else 0)) for i in range(0, rows, per)]
        steps.append([(COPY, x[:, keep], cw[:rows] if r == 0 else cw[rows:])] + sends + recvs if r == 0
                     else recvs + sends + [(COPY, x[:, keep], cw[rows:])])
    _two_ranks(monkeypatch, steps)
    for r in range(2):
        assert torch.equal(olds[r].view(-1)[:2 * rows * 32].view(2 * rows, 32), want[r])


def test_an_in_place_swap_through_the_ring(monkeypatch):
    """Each rank sends a region and receives the peer's into the same memory (more chunks than ring
    buffers): receives wait in the ring until the send that reads their memory is done."""
    n, per = 40, 2
    olds = [torch.arange(n * 8.0).view(n, 8) + 1e4 * r for r in range(2)]
    want = [o.clone() for o in reversed(olds)]
    steps = [[] for _ in range(2)]
    for r in range(2):
        for i in range(0, n, per):
            tag_out, tag_in = 1 + i // per + r * 100, 1 + i // per + (1 - r) * 100
            steps[r].append((SEND, olds[r][i:i + per], None, 1 - r, tag_out))
            steps[r].append((RECV, None, olds[r][i:i + per], 1 - r, tag_in))
    _two_ranks(monkeypatch, steps)
    assert all(torch.equal(olds[r], want[r]) for r in range(2))
