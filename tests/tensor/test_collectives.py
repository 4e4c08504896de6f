"""collectives.py calls the functional collective ops directly (no AsyncCollectiveTensor) and, for an
input that records nothing, below autograd: the results are plain, waited tensors with unsharded
values, the input is untouched, and an input that requires grad still gets the ops' own backward."""

import torch

from shardwise.tensor import collectives as C
from shardwise.testing import run_on_ranks, worker_mesh


def _direct(rank, world):
    mesh = worker_mesh((world,))
    x = torch.arange(6.0).view(3, 2) + rank
    before = x.clone()
    total = sum(torch.arange(6.0).view(3, 2) + r for r in range(world))
    out = {
        "all_reduce": C.all_reduce(x, "sum", mesh, 0),
        "max": C.all_reduce(x, "max", mesh, 0),
        "gather": C.all_gather_dim(x, 0, 3 * world, mesh, 0),
        "scatter": C.reduce_scatter_dim(torch.ones(2 * world, 3), "sum", 0, mesh, 0, rank),
        "mesh_max": C.mesh_max(x, mesh),
    }
    torch.testing.assert_close(x, before, rtol=0, atol=0)
    torch.testing.assert_close(out["all_reduce"], total)
    torch.testing.assert_close(out["max"], before + world - 1 - rank)
    torch.testing.assert_close(out["gather"], torch.cat([torch.arange(6.0).view(3, 2) + r for r in range(world)]))
    torch.testing.assert_close(out["scatter"], torch.full((2, 3), float(world)))
    torch.testing.assert_close(out["mesh_max"], before + world - 1 - rank)
    kinds = {k: type(v).__name__ for k, v in out.items()}
    # recorded by autograd when the input asks for it (the ops' backward: the gradient all-reduced) ...
    w = torch.full((3,), float(rank + 1), requires_grad=True)
    y = C.all_reduce(w, "sum", mesh, 0)
    y.backward(torch.ones(3))
    recorded = (y.requires_grad, w.grad.tolist())
    # ... and not under no_grad, nor for an input that does not require grad
    with torch.no_grad():
        z = C.all_reduce(w, "sum", mesh, 0)
    return kinds, recorded, z.requires_grad, out["all_reduce"].requires_grad


def test_direct_functional_ops_match_unsharded_and_keep_autograd():
    for kinds, recorded, under_no_grad, plain in run_on_ranks(_direct, 2):
        assert set(kinds.values()) == {"Tensor"}, kinds
        assert recorded == (True, [2.0, 2.0, 2.0]), recorded
        assert under_no_grad is False and plain is False
