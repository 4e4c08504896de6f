"""Real-process tests of shardwise.testing: results, reuse, failures, hangs."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from shardwise.testing import (
    DistributedTestError,
    DistributedTestTimeout,
    run_on_ranks,
    worker_mesh,
)


def _sum_of_ranks(rank, world_size, scale, *, offset=0.0):
    t = torch.tensor([float(rank) * scale + offset])
    dist.all_reduce(t)
    return {"rank": rank, "world": world_size, "sum": t.item(), "pid": os.getpid()}


def _pids(rank, world_size):
    return os.getpid()


def _raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 1 never joins: rank 0 is stuck here


def _hang_on_rank_zero(rank, world_size):
    if rank == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 skips it: never completes
    return rank


def _exit_on_rank_one(rank, world_size):
    if rank == 1:
        os._exit(3)
    return rank


def _meshes(rank, world_size):
    mesh = worker_mesh((2, 2))
    flat = worker_mesh(4)
    with pytest.raises(ValueError, match="has 6 ranks but the world has 4"):
        worker_mesh((2, 3))
    # A 1-D all_reduce along mesh dim 1 sums the 2 ranks of this row.
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mesh.get_group(1))
    return (tuple(mesh.shape), worker_mesh((2, 2)) is mesh, flat.ndim, t.item())


def _unpicklable_result(rank, world_size):
    return lambda: rank


def _nested():
    def inner(rank, world_size):
        return rank
    return inner


def _warm(world_size):
    """Start the pool outside any timed section; returns its pids."""
    return run_on_ranks(_pids, world_size)


def test_all_reduce_on_2_and_4_ranks_with_args_and_pool_reuse():
    first = run_on_ranks(_sum_of_ranks, 2, 10.0, offset=1.0)
    assert [r["rank"] for r in first] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 12.0 for r in first)  # (0+1) + (10+1)
    second = run_on_ranks(_sum_of_ranks, 2, 1.0)
    assert [r["pid"] for r in second] == [r["pid"] for r in first]  # same workers
    assert len({r["pid"] for r in first} | {os.getpid()}) == 3
    four = run_on_ranks(_sum_of_ranks, 4, 1.0)
    assert [r["sum"] for r in four] == [6.0] * 4
    assert run_on_ranks(_sum_of_ranks, 2, 1.0)[0]["pid"] == first[0]["pid"]  # ws=2 pool kept


def test_worker_mesh_is_cached_per_shape():
    results = run_on_ranks(_meshes, 4)
    assert [r[:3] for r in results] == [((2, 2), True, 1)] * 4
    assert [r[3] for r in results] == [1.0, 1.0, 5.0, 5.0]  # rows {0,1} and {2,3}


def test_worker_mesh_outside_workers_is_refused():
    with pytest.raises(RuntimeError, match="only works inside a function run by run_on_ranks"):
        worker_mesh((2,))


def test_rank_error_reports_traceback_and_kills_stuck_peer():
    before = _warm(2)
    start = time.monotonic()
    with pytest.raises(DistributedTestError) as info:
        run_on_ranks(_raise_on_rank_one, 2)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert elapsed < 20, elapsed  # grace period, not the 60 s collective timeout
    assert not isinstance(info.value, DistributedTestTimeout)
    assert set(info.value.failures) == {1}
    assert "rank 1 raised ValueError: boom on rank 1" in message
    assert "Traceback (most recent call last)" in message and "_raise_on_rank_one" in message
    assert "rank 0 did not finish" in message and "all_reduce" in info.value.stacks[0]
    after = _warm(2)  # the next call works, on a fresh pool
    assert set(after).isdisjoint(before)


def test_hang_raises_timeout_with_every_rank_stack():
    _warm(2)
    start = time.monotonic()
    # 3 s: rank 1 answers at once (milliseconds, its pool warmed above), so the wait is all rank 0's hang
    with pytest.raises(DistributedTestTimeout) as info:
        run_on_ranks(_hang_on_rank_zero, 2, timeout=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 13, elapsed
    message = str(info.value)
    assert "timed out after 3 s" in message and "unfinished: [0]" in message
    assert set(info.value.stacks) == {0, 1}
    assert "_hang_on_rank_zero" in info.value.stacks[0] and "all_reduce" in info.value.stacks[0]
    assert 'File "' in info.value.stacks[1]
    assert "rank 0 did not finish" in message and "rank 1 finished (idle)" in message
    assert run_on_ranks(_sum_of_ranks, 2, 1.0)[0]["sum"] == 1.0


def test_dead_worker_is_reported_and_replaced():
    with pytest.raises(DistributedTestError, match="rank 1 worker process .* exited with exit code 3"):
        run_on_ranks(_exit_on_rank_one, 2)
    pids = _warm(2)
    # A worker killed between calls is noticed and the pool replaced.
    os.kill(pids[1], signal.SIGKILL)
    time.sleep(0.2)
    assert set(_warm(2)).isdisjoint(pids)


def test_bad_calls_raise_before_any_work():
    with pytest.raises(ValueError, match="not importable by workers"):
        run_on_ranks(lambda rank, world_size: rank, 2)
    with pytest.raises(ValueError, match="not importable by workers"):
        run_on_ranks(_nested(), 2)
    with pytest.raises(TypeError, match="world_size must be an int"):
        run_on_ranks(_pids, "2")
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        run_on_ranks(_pids, 0)
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_on_ranks(_pids, 2, timeout=0)
    with pytest.raises(TypeError, match="cannot be pickled"):
        run_on_ranks(_sum_of_ranks, 2, lambda: 1)


def test_unpicklable_result_is_a_rank_error():
    with pytest.raises(DistributedTestError, match="rank 0 raised .*Error"):
        run_on_ranks(_unpicklable_result, 2)
