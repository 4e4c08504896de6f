"""The DTensor dispatcher's state is per thread, as PyTorch's is (4 gloo ranks where a mesh is needed):
a thread learning a fast-path call records only its own ops, a collective counter counts only its own
thread's collectives, the propagation cache survives racing evictions, and implicit_replication applies
to the thread that entered it."""

from __future__ import annotations

import threading

import torch

from shardwise.testing.harness import run_on_ranks, worker_mesh


def recording_calls(rank, world):
    from shardwise.tensor import Shard, distribute_tensor, fast_path
    from shardwise.tensor.dtensor import _DISPATCHER

    mesh = worker_mesh((world,))
    d = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    recorded: list = []
    token = _DISPATCHER.recording.set(recorded)  # what the fast path does while it learns a call
    try:
        def other():
            with fast_path(False):
                (d * 3).relu()

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the thread's ops did not finish in 30 s"
    finally:
        _DISPATCHER.recording.reset(token)
    return len(recorded)


def test_a_thread_learning_a_fast_path_call_records_only_its_own_ops():
    assert run_on_ranks(recording_calls, 4) == [0] * 4


def test_plan_cache_eviction_from_many_threads():
    from shardwise.tensor.callpath.plan_cache import PropagationCache

    cache, errors = PropagationCache(max_size=8), []

    def fill(k):
        try:
            for i in range(3000):
                cache.put((k, i), i)
        except Exception as e:  # noqa: BLE001 (any error from a racing eviction fails the test)
            errors.append(repr(e))

    threads = [threading.Thread(target=fill, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(cache.plans) <= 8


def test_implicit_replication_is_per_thread():
    from shardwise.tensor.dispatch import IMPLICIT_REPLICATION
    from shardwise.tensor.experimental import implicit_replication

    seen = []
    with implicit_replication():
        t = threading.Thread(target=lambda: seen.append(IMPLICIT_REPLICATION.get()))
        t.start()
        t.join(10)
        inside = IMPLICIT_REPLICATION.get()
    assert inside is True and seen == [False] and IMPLICIT_REPLICATION.get() is False


def counter_calls(rank, world):
    from shardwise.tensor import CollectiveCounter, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    d = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    in_thread: list = []

    def other():
        with CollectiveCounter() as mine:
            d.redistribute(mesh, [Replicate()])
        in_thread.append(mine.counts)

    with CollectiveCounter() as outer:
        t = threading.Thread(target=other)   # the only collective while it runs: ranks stay in step
        t.start()
        t.join(30)
        assert not t.is_alive(), "the thread's redistribute did not finish in 30 s"
        d.redistribute(mesh, [Replicate()])
    return outer.counts, in_thread


def test_a_backward_on_an_autograd_device_thread_counts_into_the_callers_counter():
    # on CUDA the engine runs backward on its own threads, whose Python context is empty; torch stashes the
    # caller's context in its thread-local state (propagated to them), as this thread does by hand
    import contextvars

    from shardwise.tensor import CollectiveCounter

    seen = []
    with CollectiveCounter() as caller:
        ctx = contextvars.copy_context()

        def device_thread():
            torch._C._stash_obj_in_tls("context", ctx)
            try:
                CollectiveCounter.record("all_reduce")
            finally:
                torch._C._remove_obj_from_tls("context")
            seen.append(True)

        t = threading.Thread(target=device_thread)
        t.start()
        t.join(30)
    assert seen == [True] and caller.counts == {"all_reduce": 1}


def test_a_collective_counter_counts_its_own_threads_collectives_only():
    for outer, in_thread in run_on_ranks(counter_calls, 4):
        assert outer == {"all_gather": 1} and in_thread == [{"all_gather": 1}], (outer, in_thread)
