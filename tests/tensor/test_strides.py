"""A DTensor's stride equals the stride the same op sequence gives on the full tensor, and its local
tensor is laid out in the same dim order, so view-versus-copy decisions made on the DTensor's strides
(``reshape``, autograd's layout checks) hold for the local tensor too. Inputs sharded on several dims
and replicated; sequences through redistributions, the gather fallback and attention."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

B, S, H, E = 2, 8, 4, 8


def _fallback_then_reshape(x, ctx):
    # the reported bug: Shard(2) -> heads view -> an op under the gather fallback -> back to (B, S, H*E)
    from shardwise.tensor import gather_fallback

    a = x.view(B, S, H, E).transpose(1, 2)
    with gather_fallback(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warns that it gathers
        b = ctx.fallback_op(a)
    return [a, b, b.transpose(1, 2), b.transpose(1, 2).reshape(B, S, H * E)]


def _redistribute_then_view(x, ctx):
    a = x.view(B, S, H, E).transpose(1, 2)
    b = ctx.redistribute(a, "R")
    return [b, b.transpose(1, 2).reshape(B, S, -1)]


def _all_to_all(x, ctx):
    a = x.view(B, S, H, E).permute(0, 2, 3, 1)
    b = ctx.redistribute(a, "S1")
    return [a, b, b.permute(0, 3, 1, 2).reshape(B, S, -1) * 2]


def _attention(x, ctx):
    q = x.view(B, S, H, E).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return [q, o, o.transpose(1, 2), o.transpose(1, 2).reshape(B, S, -1)]


def _transposed_matmul(x, ctx):
    a = x.reshape(B * S, H * E).t()
    w = ctx.replicate(torch.arange(B * S * 3, dtype=torch.float32).view(B * S, 3))
    return [a, a @ w, (a * 2).contiguous().view(-1)]


SEQUENCES = [_fallback_then_reshape, _redistribute_then_view, _all_to_all, _attention, _transposed_matmul]


class _Full:
    fallback_op = staticmethod(torch.special.i0)

    def redistribute(self, t, to):
        return t

    def replicate(self, t):
        return t


class _Dist(_Full):
    def __init__(self, mesh):
        self.mesh = mesh

    def redistribute(self, t, to):
        from shardwise.tensor import Replicate, Shard

        return t.redistribute(self.mesh, [Replicate() if to == "R" else Shard(int(to[1:]))])

    def replicate(self, t):
        from shardwise.tensor import Replicate, distribute_tensor

        return distribute_tensor(t, self.mesh, [Replicate()])


def _dim_order(t: torch.Tensor, sizes) -> list[int]:
    dims = [d for d in range(t.ndim) if sizes[d] > 1]
    return sorted(dims, key=lambda d: -t.stride(d))


def strides_case(rank, world, placement: str):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    full = torch.randn(B, S, H * E, generator=torch.Generator().manual_seed(1))
    pl = Replicate() if placement == "R" else Shard(int(placement[1:]))
    bad = []
    for seq in SEQUENCES:
        want = seq(full, _Full())
        got = seq(distribute_tensor(full, mesh, [pl]), _Dist(mesh))
        for i, (w, g) in enumerate(zip(want, got)):
            local = g.to_local()
            if g.stride() != w.stride():
                bad.append(f"{seq.__name__}[{i}]: DTensor stride {g.stride()} != full {w.stride()}")
            if _dim_order(local, local.shape) != _dim_order(w, local.shape):
                bad.append(f"{seq.__name__}[{i}]: local stride {local.stride()} ({g.placements}) is laid out "
                           f"unlike the full tensor's {w.stride()}")
            if not torch.allclose(g.full_tensor(), w, atol=1e-5):
                bad.append(f"{seq.__name__}[{i}]: values differ")
    return bad


@pytest.mark.parametrize("placement", ["S2", "S0", "R"])
def test_dtensor_strides_equal_full_tensor_strides(placement):
    for bad in run_on_ranks(strides_case, 2, placement):
        assert not bad, "\n".join(bad)
