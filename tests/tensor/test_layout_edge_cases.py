"""Three DTensor bugs found by PyTorch's own tests (issue 15), each against plain torch and PyTorch's
DTensor: complex all-to-all, the global stride of a non-contiguous local piece, and moves along a
mesh dimension of size 1 (which must run no collective)."""

from __future__ import annotations

import torch

from shardwise.testing import run_on_ranks, worker_mesh


def complex_all_to_all(rank, world):
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(0)
    full = torch.randn(6, 5, dtype=torch.complex64, generator=g)
    d = distribute_tensor(full, mesh, [Shard(0)]).redistribute(mesh, [Shard(1)])
    back = d.redistribute(mesh, [Shard(0)])
    return torch.equal(d.full_tensor(), full), torch.equal(back.full_tensor(), full), d.to_local().dtype


def test_complex_shard_to_shard():
    for after, back, dtype in run_on_ranks(complex_all_to_all, 2, timeout=60.0):
        assert after and back and dtype == torch.complex64


def non_contiguous_local(rank, world):
    import torch.distributed.tensor as tdt

    from shardwise.tensor import DTensor, Shard

    mesh = worker_mesh((world,))
    base = torch.arange(32.0).view(8, 4) + 100 * rank
    local = base.t()                                # [4, 8], stride (1, 4): not contiguous
    ours = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    theirs = tdt.DTensor.from_local(local, mesh, [tdt.Shard(0)], run_check=False)
    flat = ours.contiguous().view(-1)               # failed before: contiguous() kept the stride
    want_full = torch.cat([(torch.arange(32.0).view(8, 4) + 100 * r).t() for r in range(world)])
    return (ours.stride(), theirs.stride(), ours.contiguous().is_contiguous(),
            torch.equal(flat.full_tensor(), want_full.reshape(-1)))


def test_from_local_keeps_a_non_contiguous_layout():
    for ours, theirs, contiguous, values in run_on_ranks(non_contiguous_local, 2, timeout=60.0):
        assert ours == theirs == (1, 8)
        assert contiguous and values


def size_one_mesh_dim(rank, world):
    from shardwise.tensor import Partial, Replicate, Shard, distribute_tensor
    from shardwise.tensor.collectives import CollectiveCounter

    mesh = worker_mesh((1, world))
    full = torch.arange(24.0).view(6, 4)
    d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    with CollectiveCounter() as c:
        r = d.redistribute(mesh, [Replicate(), Shard(1)])      # only the size-1 mesh dim changes
        p = r.redistribute(mesh, [Partial(), Shard(1)]).redistribute(mesh, [Replicate(), Shard(1)])
    with CollectiveCounter() as c2:                            # the size-2 dim still communicates
        whole = p.redistribute(mesh, [Replicate(), Replicate()])
    return c.total, torch.equal(r.full_tensor(), full), torch.equal(p.full_tensor(), full), \
        c2.total > 0, torch.equal(whole.to_local(), full)


def test_moves_along_a_size_one_mesh_dim_run_no_collective():
    for none, r_ok, p_ok, some, whole in run_on_ranks(size_one_mesh_dim, 2, timeout=60.0):
        assert none == 0 and r_ok and p_ok and some and whole


def dtype_and_grad_placements(rank, world):
    from shardwise.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    full = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    w = torch.arange(24.0).view(4, 6)
    out = {}
    for bwd in (None, torch.float16):
        x = distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()
        y = x.redistribute(mesh, [Replicate()], forward_dtype=torch.bfloat16, backward_dtype=bwd)
        (y.to_local().float() * w).sum().backward()
        rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
        out[str(bwd)] = (y.dtype, torch.equal(y.to_local(), full.to(torch.bfloat16)), x.grad.dtype,
                         torch.allclose(x.grad.to_local(), w[rows].to(torch.bfloat16).float()))
    x = distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()
    (x.full_tensor(grad_placements=[Partial()]) * (rank + 1)).sum().backward()
    summed = x.grad.to_local()
    x2 = distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()
    (x2.full_tensor() * (rank + 1)).sum().backward()
    return out, summed.unique().tolist(), x2.grad.to_local().unique().tolist()


def test_redistribute_dtypes_and_full_tensor_grad_placements():
    for rank, (out, summed, own) in enumerate(run_on_ranks(dtype_and_grad_placements, 2, timeout=60.0)):
        for bwd, (ydt, values, gdt, grad_ok) in out.items():
            assert ydt == torch.bfloat16 and values and gdt == torch.float32 and grad_ok, bwd
        assert summed == [3.0]              # Partial gradient: every rank's contribution, summed
        assert own == [float(rank + 1)]     # default: the gradient is the same on every rank
