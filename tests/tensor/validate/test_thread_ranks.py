"""Ranks as threads with simulated collectives: each simulated collective matches its definition, and a
failing rank stops the others instead of hanging them."""

from __future__ import annotations

import pytest
import torch

from shardwise.tensor.collectives import all_gather_dim, all_reduce, all_to_all_dims, reduce_scatter_dim
from shardwise.tensor.validate.thread_ranks import _Dist, run_ranks


def test_simulated_collectives_match_their_definitions():
    full = torch.arange(35.0).reshape(7, 5)

    def kernel(rank, mesh):
        mine = torch.chunk(full, 3, dim=1)[rank]  # 2, 2, 1 columns
        gathered = all_gather_dim(mine.contiguous(), 1, 5, mesh, 0)
        scattered = reduce_scatter_dim(full * (rank + 1), "sum", 0, mesh, 0, rank)
        swapped = all_to_all_dims(mine.contiguous(), 1, 0, 5, mesh, 0, rank)
        return gathered, scattered, swapped, all_reduce(torch.tensor([rank]), "avg", mesh, 0)

    for rank, (gathered, scattered, swapped, avg) in enumerate(run_ranks(3, kernel)):
        assert torch.equal(gathered, full)
        assert torch.equal(scattered, torch.chunk(full * 6, 3, dim=0)[rank])
        assert torch.equal(swapped, torch.chunk(full, 3, dim=0)[rank])
        assert avg.item() == 1


def test_simulated_c10d_collectives_match_their_definitions():
    d = _Dist(torch.distributed)
    full = torch.arange(12.0).reshape(6, 2)

    def kernel(rank, mesh):
        g, mine = mesh.get_group(0), full[2 * rank:2 * rank + 2]
        red = mine.clone()
        d.all_reduce(red, torch.distributed.ReduceOp.MAX, group=g)
        gathered = torch.empty(6, 2)
        d.all_gather_into_tensor(gathered, mine, group=g)
        scattered = torch.empty(2, 2)
        d.reduce_scatter_tensor(scattered, full * (rank + 1), group=g)
        swapped = torch.empty(6, 2)
        d.all_to_all_single(swapped, full + 100 * rank, group=g)
        return red, gathered, scattered, swapped

    for rank, (red, gathered, scattered, swapped) in enumerate(run_ranks(3, kernel)):
        assert torch.equal(red, full[4:6]) and torch.equal(gathered, full)
        assert torch.equal(scattered, full[2 * rank:2 * rank + 2] * 6)
        assert torch.equal(swapped, torch.cat([full[2 * rank:2 * rank + 2] + 100 * src for src in range(3)]))


def test_a_failing_simulated_rank_does_not_hang():
    def kernel(rank, mesh):
        if rank == 1:
            raise ZeroDivisionError("rank 1")
        return all_reduce(torch.ones(1), "sum", mesh, 0)

    with pytest.raises(ZeroDivisionError, match="rank 1"):
        run_ranks(3, kernel)


def _real_collective_while_thread_ranks_run(rank, world):
    import threading

    from shardwise.testing.harness import worker_mesh

    mesh = worker_mesh((world,), "cpu")
    inside, release = threading.Event(), threading.Event()

    def kernel(sim_rank, sim_mesh):
        out = all_reduce(torch.tensor([float(sim_rank)]), "sum", sim_mesh, 0)
        if sim_rank == 0:
            inside.set()
            release.wait(30)
        return out

    results = []
    t = threading.Thread(target=lambda: results.append(run_ranks(3, kernel)))
    t.start()
    try:
        assert inside.wait(30)
        # the simulation is running in other threads: a real collective here still goes to gloo
        real = all_reduce(torch.tensor([float(rank + 1)]), "sum", mesh, 0).item()
    finally:
        release.set()
        t.join(30)
    return real, [x.item() for x in results[0]]


def test_thread_ranks_leave_real_collectives_alone():
    from shardwise.testing.harness import run_on_ranks

    for real, simulated in run_on_ranks(_real_collective_while_thread_ranks_run, 2):
        assert real == 3.0 and simulated == [3.0, 3.0, 3.0]
