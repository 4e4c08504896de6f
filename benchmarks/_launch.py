"""Shared benchmark plumbing: spawn N gloo ranks, time blocks of calls, print JSON lines."""

from __future__ import annotations

import gc
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Imported before any process group exists, on purpose: torch.distributed.nn's functions take
# ``group=group.WORLD`` defaults, evaluated when the module is first imported (shardwise and TorchRec
# import it). Imported inside a rank, after init_process_group, those defaults pin the rank's default
# group forever, so destroy_process_group cannot free it and gloo's worker threads outlive the rank's
# code; if one of them drops a finished work (its tensors belong to Python) while the interpreter is
# finalizing, it is killed inside a C++ destructor and the rank aborts with "terminate called without
# an active exception".
import torch.distributed.nn  # noqa: E402,F401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = fn(rank, world, *args)
        if rank == 0:
            queue.put(out)
    finally:
        dist.barrier()
        # Modules in reference cycles (forward hooks) still hold the group; with them collected,
        # destroy_process_group drops its last reference and the group's destructor joins gloo's
        # worker threads while the interpreter is fully alive.
        gc.collect()
        dist.destroy_process_group()


def spawn(fn, world: int, *args):
    """Run ``fn(rank, world, *args)`` on ``world`` gloo ranks; return rank 0's result."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_entry, args=(world, free_port(), fn, args, queue), nprocs=world, join=True,
                       start_method="spawn")
    return queue.get()


def time_us(fn, *, warmup: int = 20, reps: int = 7, inner: int = 50, sync=None, clock=time.perf_counter) -> float:
    """Median over ``reps`` blocks of ``inner`` back-to-back calls, in microseconds per call.
    ``clock=time.thread_time`` counts this thread's CPU time only: for calls that never wait on another
    process, it leaves out the time the thread was descheduled on a loaded machine."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if sync is not None:
            sync()
        t0 = clock()
        for _ in range(inner):
            fn()
        samples.append((clock() - t0) / inner * 1e6)
    return statistics.median(samples)


def interleaved(fns: dict, rounds: int, inner: int, sync=None, clock=time.perf_counter) -> tuple[dict, dict]:
    """(median us per call of each fn, per-round samples). One block of each fn per round, the order
    rotating from round to round, so load from other processes hits every variant alike; the first
    round is warm-up."""
    samples = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds + 1):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t = time_us(fns[k], warmup=inner if r == 0 else 0, reps=1, inner=inner, sync=sync, clock=clock)
            if r:
                samples[k].append(t)
    return {k: statistics.median(v) for k, v in samples.items()}, samples


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


# torch's CPU allocator reads it once per process: tensors of 2 MiB or more then get huge pages
# (``shardwise train`` starts its workers with 1); benchmarks set it for both libraries' ranks alike
THP_ENV = "THP_MEM_ALLOC_ENABLE"


def _status_bytes(field: str):
    """A size field of /proc/self/status (``VmHWM``, ``VmRSS``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) * 1024
    except (OSError, StopIteration):
        return None


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux VmHWM; ru_maxrss elsewhere)."""
    peak = _status_bytes("VmHWM")
    if peak is None:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak


def rss_bytes() -> int:
    """This process's resident set size now (Linux VmRSS), 0 where unknown."""
    return _status_bytes("VmRSS") or 0


def gather_ints(*values: int) -> list:
    """Every rank's ``values``: [[rank 0's], [rank 1's], ...]. A collective on the default group."""
    mine = torch.tensor([int(v) for v in values], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [e.tolist() for e in every]


def rss_per_rank(held_bytes: int) -> dict:
    """Every rank's peak RSS next to the bytes that rank must hold (its shards, optimizer state,
    batches), as JSON fields. A collective: call it on every rank of the default group."""
    every = gather_ints(peak_rss_bytes(), held_bytes)
    mib = 1 << 20
    return {"peak_rss_mib_per_rank": [round(e[0] / mib, 1) for e in every],
            "held_mib_per_rank": [round(e[1] / mib, 1) for e in every]}
