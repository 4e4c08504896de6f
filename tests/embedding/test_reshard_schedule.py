"""The reshard's gloo schedule: writes wait only for the reads of the memory they overwrite.

Local copies alone need no process group, so the ordering rules are checked here in one process
against plain tensor indexing; the messages' side runs in the multi-rank reshard tests
(``test_reshard*.py``), which compare every moved byte and a fresh sharding.
"""

from __future__ import annotations

import torch
import pytest
from hypothesis import given, settings, strategies as st

from shardwise.embedding.reshard_schedule import COPY, run_schedule

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
