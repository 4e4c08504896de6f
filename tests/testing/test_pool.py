"""The process pool: results, reuse, and each way a distributed call can fail."""

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from shardwise.testing import simulate
from shardwise.testing.errors import (
    RankDivergenceError,
    RankTimeoutError,
    RemoteTraceback,
    WorkerDiedError,
)
from shardwise.testing.pool import ProcessPool, run_distributed

WORLD = 2


# -- functions run on the ranks (module level: ranks import them by name) ----------------------

def all_reduce_inputs(ctx, xs):
    t = xs[ctx.rank].to(ctx.device)
    dist.all_reduce(t, group=ctx.group)
    return {"rank": ctx.rank, "world": ctx.world_size, "device": ctx.device.type,
            "backend": ctx.backend, "seed": ctx.seed, "sum": t}


def raise_value_error(ctx):
    raise ValueError(f"size=7 on world {ctx.world_size}: must divide; use size=8")


def raise_on_rank0_only(ctx):
    if ctx.rank == 0:
        raise ValueError("rank 0 disagrees")
    return "fine"


def raise_then_others_block(ctx):
    if ctx.rank == 0:
        raise ValueError("raised before the collective")
    t = torch.zeros(1, device=ctx.device)
    dist.all_reduce(t, group=ctx.group)  # rank 0 never joins: blocks


def exit_on_rank1(ctx):
    if ctx.rank == 1:
        os._exit(7)
    return ctx.rank


def return_unpicklable(ctx):
    return threading.Lock()


def hash_of_string(ctx):
    return hash("shardwise")


def random_draws(ctx):
    return torch.rand(4)


def leave_global_state(ctx):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)


def read_global_state(ctx):
    return torch.get_default_dtype(), torch.is_grad_enabled()


def sleep_long(ctx, seconds):
    time.sleep(seconds)
    return ctx.rank


def rank_plus(ctx, offset, *, scale=1):
    return (ctx.rank + offset) * scale


# -- tests ---------------------------------------------------------------------------------------

def test_run_returns_rank_results_and_matches_single_process(dist_pools):
    pool = dist_pools.get(WORLD)
    xs = simulate.per_rank_randn(WORLD, (3, 5), seed=4)
    out = pool.run(all_reduce_inputs, xs, seed=11)
    expected = xs[0] + xs[1]
    for rank, res in enumerate(out):
        assert (res["rank"], res["world"], res["seed"]) == (rank, WORLD, 11)
        assert res["backend"] == pool.backend
        assert res["device"] == ("cuda" if pool.backend == "nccl" else "cpu")
        torch.testing.assert_close(res["sum"], expected)


def test_args_and_kwargs_reach_every_rank(dist_pools):
    assert dist_pools.get(WORLD).run(rank_plus, 10, scale=3) == [30, 33]


def test_pool_is_reused_across_calls(dist_pools):
    pool = dist_pools.get(WORLD)
    starts = pool.starts
    for _ in range(5):
        pool.run(rank_plus, 0)
    assert dist_pools.get(WORLD) is pool and pool.starts == starts and pool.alive


def test_same_error_on_every_rank_is_reraised_and_keeps_pool(dist_pools):
    pool = dist_pools.get(WORLD)
    starts = pool.starts
    with pytest.raises(ValueError, match="size=7 on world 2: must divide") as info:
        pool.run(raise_value_error)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback) and "raise_value_error" in cause.text
    assert pool.run(rank_plus, 0) == [0, 1] and pool.starts == starts


def test_ranks_that_disagree_raise_divergence_and_pool_recovers(dist_pools):
    pool = dist_pools.get(WORLD)
    with pytest.raises(RankDivergenceError) as info:
        pool.run(raise_on_rank0_only)
    message = str(info.value)
    assert "rank 0: raised ValueError: rank 0 disagrees" in message
    assert "rank 1: returned 'fine'" in message
    assert pool.run(rank_plus, 0) == [0, 1]


def test_rank_stuck_in_collective_is_reported_with_its_stack(dist_pools):
    pool = dist_pools.get(WORLD)
    started = time.monotonic()
    with pytest.raises(RankTimeoutError) as info:
        pool.run(raise_then_others_block, error_grace_s=1.0)
    assert time.monotonic() - started < 15  # the grace period, not the 60 s call timeout
    message = str(info.value)
    assert "ranks [1] did not finish" in message
    assert "rank 0: raised ValueError: raised before the collective" in message
    assert "raise_then_others_block" in message and "all_reduce" in message  # rank 1's stack
    assert pool.run(rank_plus, 0) == [0, 1]


def test_whole_call_timeout_applies_without_errors(dist_pools):
    pool = dist_pools.get(WORLD)
    with pytest.raises(RankTimeoutError, match=r"ranks \[0, 1\] did not finish"):
        pool.run(sleep_long, 30, timeout_s=1.0)
    assert pool.run(rank_plus, 0) == [0, 1]


def test_dead_rank_is_reported(dist_pools):
    pool = dist_pools.get(WORLD)
    with pytest.raises(WorkerDiedError, match="rank 1: process died with exit code 7"):
        pool.run(exit_on_rank1)
    assert pool.run(rank_plus, 0) == [0, 1]


def test_unpicklable_function_is_refused_before_sending(dist_pools):
    pool = dist_pools.get(WORLD)
    starts = pool.starts
    with pytest.raises(TypeError, match="define fn at module level"):
        pool.run(lambda ctx: 0)
    with pytest.raises(TypeError, match="not callable"):
        pool.run(42)
    assert pool.run(rank_plus, 0) == [0, 1] and pool.starts == starts


def test_unpicklable_result_raises_type_error_on_every_rank(dist_pools):
    with pytest.raises(TypeError, match="return_unpicklable returned cannot be pickled"):
        dist_pools.get(WORLD).run(return_unpicklable)


def test_ranks_get_distinct_hash_seeds(dist_pools):
    # Code whose collectives depend on hash() of strings must diverge under the harness.
    first, second = dist_pools.get(WORLD).run(hash_of_string)
    assert first != second


def test_every_call_is_seeded_identically_on_all_ranks(dist_pools):
    pool = dist_pools.get(WORLD)
    torch.manual_seed(5)
    expected = torch.rand(4)
    for draw in pool.run(random_draws, seed=5) + pool.run(random_draws, seed=5):
        assert torch.equal(draw, expected)
    assert not torch.equal(pool.run(random_draws, seed=6)[0], expected)


def test_global_torch_modes_do_not_leak_between_calls(dist_pools):
    pool = dist_pools.get(WORLD)
    pool.run(leave_global_state)
    assert pool.run(read_global_state) == [(torch.float32, True)] * WORLD


def test_interrupted_call_kills_the_pool(dist_pools):
    pool = dist_pools.get(WORLD)

    class Interrupted(Exception):
        pass

    def on_signal(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGUSR2, on_signal)
    main = threading.main_thread().ident
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGUSR2))
    timer.start()
    try:
        with pytest.raises(Interrupted):
            pool.run(sleep_long, 30)
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR2, previous)
    assert not pool.alive  # its replies were still in flight: it must not be reused as is
    assert pool.run(rank_plus, 0) == [0, 1]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"world_size": 0}, "world_size=0: must be an int >= 1"),
        ({"world_size": "2"}, "world_size='2'"),
        ({"world_size": 2, "backend": "mpi"}, "backend='mpi': must be one of"),
    ],
)
def test_bad_pool_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProcessPool(**kwargs)


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="needs fewer GPUs than ranks")
def test_nccl_without_a_gpu_per_rank_is_refused():
    with pytest.raises(ValueError, match="NCCL needs one GPU per rank"):
        ProcessPool(64, "nccl")


def test_run_distributed_one_shot():
    xs = simulate.per_rank_randn(1, (2,))
    (res,) = run_distributed(all_reduce_inputs, 1, xs)
    torch.testing.assert_close(res["sum"], xs[0])
