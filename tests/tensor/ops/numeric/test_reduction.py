"""Reductions, scans and orderings on real gloo ranks against the same ops on the full tensor.

Covers the pending forms a sharded reduced dim becomes (any -> P(max) and all -> P(min) on bools, which
gloo reduces as bytes; prod -> P(product)), the replicate-first cases (index results, var/std) and the
scans and sorts along a replicated dim with other dims sharded."""

from __future__ import annotations

import torch

from shardwise.testing import run_on_ranks, worker_mesh


def _cases():
    t = torch.Generator().manual_seed(3)
    x = torch.randn(7, 6, generator=t)
    b = x > 0.8
    return x, b, [
        ("any", lambda v: v.any(), "b"), ("all", lambda v: (v < 2.5).all(), "x"),
        ("any.dim", lambda v: v.any(dim=0), "b"), ("all.dims", lambda v: torch.all(v > -3, dim=(0, 1)), "x"),
        ("argmax", lambda v: v.argmax(), "x"), ("argmin.dim", lambda v: v.argmin(dim=1, keepdim=True), "x"),
        ("max.dim", lambda v: torch.cat([v.max(dim=0).values, v.max(dim=0).indices.float()]), "x"),
        ("var", lambda v: v.var(dim=0, correction=0), "x"), ("std", lambda v: v.std(), "x"),
        ("prod", lambda v: (v.abs() + 0.5).prod(dim=0), "x"), ("amax", lambda v: v.amax(dim=(0, 1)), "x"),
        ("norm", lambda v: torch.linalg.vector_norm(v, 3, dim=0), "x"),
        ("topk", lambda v: v.topk(2, dim=0).values, "x"), ("sort", lambda v: v.sort(dim=1).indices, "x"),
        ("cumsum", lambda v: v.cumsum(0), "x"), ("cummax", lambda v: v.cummax(1).values, "x"),
        ("logsumexp", lambda v: v.logsumexp(1), "x"),
    ]


def reductions_on_ranks(rank, world):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x, b, cases = _cases()
    bad = []
    for pl in (Shard(0), Shard(1), Replicate()):
        dx, db = distribute_tensor(x, mesh, [pl]), distribute_tensor(b, mesh, [pl])
        for name, fn, which in cases:
            full, dist = (x, dx) if which == "x" else (b, db)
            want, got = fn(full), fn(dist).full_tensor()
            if got.dtype != want.dtype or not torch.allclose(got.double(), want.double(), atol=1e-5):
                bad.append((name, str(pl)))
    return bad


def test_reductions_match_full_tensor_ops_on_two_ranks():
    assert run_on_ranks(reductions_on_ranks, 2) == [[], []]


def trunc_normal_on_ranks(rank, world):
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    w = distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)])
    torch.manual_seed(0)
    torch.nn.init.trunc_normal_(w, std=0.02)  # its argument checks call any/all on the DTensor
    return bool(torch.equal(w, w)), tuple(w.to_local().shape)


def test_trunc_normal_runs_on_a_sharded_parameter():
    assert run_on_ranks(trunc_normal_on_ranks, 2) == [(True, (8, 3)), (True, (8, 3))]
