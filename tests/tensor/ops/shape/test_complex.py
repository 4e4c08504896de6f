"""Complex views on DTensors: rotary embedding through view_as_complex, a complex multiply and
view_as_real on head-sharded tensors, forward and backward, equal the plain computation, including the
imaginary parts (the backward multiplies by a conjugate: a lazy conj view on the local tensor)."""

from __future__ import annotations

import pytest
import torch

from shardwise.testing import run_on_ranks, worker_mesh


def _rotary(x, freqs):
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3)


def complex_case(rank, world, dim):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(4)
    x, grad = torch.randn(2, 6, 5, 8, generator=g), torch.randn(2, 6, 5, 8, generator=g)
    freqs = torch.polar(torch.ones(6, 4), torch.randn(6, 4, generator=g))
    ref_x = x.clone().requires_grad_()
    ref = _rotary(ref_x, freqs)
    ref.backward(grad)
    dx = distribute_tensor(x, mesh, [Shard(dim)]).requires_grad_()
    out = _rotary(dx, distribute_tensor(freqs, mesh, [Replicate()]))
    out.backward(distribute_tensor(grad, mesh, [Shard(dim)]))
    # a product with a conjugate, checked on both parts
    a = torch.complex(torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g))
    b = torch.complex(torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g))
    da, db = (distribute_tensor(t, mesh, [Shard(0)]) for t in (a, b))
    prod = torch.view_as_real((da * db.conj()).full_tensor()) - torch.view_as_real(a * b.conj())
    return (out.placements == (Shard(dim),), (out.full_tensor() - ref).abs().max().item(),
            (dx.grad.full_tensor() - ref_x.grad).abs().max().item(), prod.abs().max().item())


@pytest.mark.parametrize("dim", [0, 2], ids=["batch", "heads"])
def test_rotary_on_sharded_dtensors_equals_plain(dim):
    for kept, fwd, bwd, conj in run_on_ranks(complex_case, 2, dim):
        assert kept and fwd < 1e-6 and bwd < 1e-6 and conj < 1e-6, (kept, fwd, bwd, conj)
