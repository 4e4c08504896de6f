"""The op families added as data (structure, indexing, losses, spatial, replicate-only) on gloo ranks:
values and gradients equal the single-tensor ops; a replicate-only op's gather is a planned, counted
redistribute; in-place shape ops keep the DTensor's metadata true; geqrf (no meta kernel) runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh


def _as(v, t):
    """``t`` laid out to mix with ``v``: replicated on its mesh when ``v`` is a DTensor."""
    from shardwise.tensor import DTensor, Replicate, distribute_tensor

    return distribute_tensor(t, v.device_mesh, [Replicate()]) if isinstance(v, DTensor) else t


def _cases(g):
    x = torch.randn(8, 6, generator=g)
    img = torch.randn(4, 6, 5, 5, generator=g)
    idx = torch.randint(0, 8, (3, 6), generator=g)
    return [
        ("tril", lambda v: v.tril(1), x), ("flip", lambda v: v.flip(0), x), ("roll", lambda v: v.roll(2, 1), x),
        ("repeat", lambda v: v.repeat(2, 1), x), ("diagonal", lambda v: v.diagonal(), x),
        ("tile", lambda v: v.tile((1, 2)), x), ("glu", lambda v: F.glu(v, 1), x),
        ("pad", lambda v: F.pad(v, (1, 2)), x),
        ("gather", lambda v: v.gather(0, _as(v, idx)), x), ("index_select", lambda v: v.index_select(0, _as(v, idx[0])), x),
        ("mse", lambda v: F.mse_loss(v, (v * 0.5).detach()), x),
        ("bce_logits", lambda v: F.binary_cross_entropy_with_logits(v, (v > 0).float()), x),
        ("conv2d", lambda v: F.conv2d(v, _as(v, torch.ones(3, 6, 3, 3) / 9)), img),
        ("max_pool", lambda v: F.max_pool2d(v, 2), img), ("avg_pool", lambda v: F.avg_pool2d(v, 2), img),
        ("interpolate", lambda v: F.interpolate(v, scale_factor=2), img),
        ("batch_norm", lambda v: F.batch_norm(v, None, None, training=True), img),
        ("group_norm", lambda v: F.group_norm(v, 3), img),
        ("cross_entropy_4d", lambda v: F.cross_entropy(v, _as(v, torch.zeros(4, 5, 5, dtype=torch.long))), img),
        ("det", lambda v: torch.linalg.det(v[:6, :6] + _as(v, 3 * torch.eye(6))), x),
    ]


def families_on_ranks(rank, world):
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    bad = []
    for name, fn, full in _cases(torch.Generator().manual_seed(0)):
        for pl in (Shard(0), Shard(1)):
            want_x = full.clone().requires_grad_()
            want = fn(want_x)
            want.sum().backward()
            d = distribute_tensor(full, mesh, [pl]).requires_grad_()
            got = fn(d)
            got.full_tensor().sum().backward()
            if not torch.allclose(got.full_tensor(), want, atol=1e-5):
                bad.append((name, str(pl), "forward"))
            elif not torch.allclose(d.grad.full_tensor(), want_x.grad, atol=1e-5):
                bad.append((name, str(pl), "backward"))
    return bad


def test_families_match_full_tensor_ops_forward_and_backward():
    assert run_on_ranks(families_on_ranks, 2) == [[], []]


def details_on_ranks(rank, world):
    from shardwise.tensor import CollectiveCounter, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    out = {}
    x = torch.randn(6, 1, 4, generator=torch.Generator().manual_seed(1))
    d = distribute_tensor(x, mesh, [Shard(2)])
    d.squeeze_(1)  # in-place: the DTensor's shape, placements and local piece change together
    out["squeeze_"] = (tuple(d.shape), str(d.placements[0]), tuple(d.to_local().shape), torch.equal(d.full_tensor(), x.squeeze(1)))
    w = distribute_tensor(torch.randn(4, 5), mesh, [Shard(0)])
    out["linear_1d"] = torch.allclose(F.linear(torch.ones(5), w.full_tensor()),
                                      F.linear(distribute_tensor(torch.ones(5), mesh, [Replicate()]), w).full_tensor())
    a = torch.randn(5, 3, generator=torch.Generator().manual_seed(2))
    with CollectiveCounter() as counter:
        qr = torch.geqrf(distribute_tensor(a, mesh, [Shard(0)]))
    out["geqrf"] = all(torch.allclose(q.full_tensor(), e) for q, e in zip(qr, torch.geqrf(a)))
    out["geqrf_gather"] = counter.counts.get("all_gather", 0)
    s = distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])
    out["one_element_plain"] = torch.allclose((s * torch.tensor([2.0])).full_tensor(), s.full_tensor() * 2)
    return out


def test_in_place_shape_ops_geqrf_and_one_element_plain_tensors():
    for r in run_on_ranks(details_on_ranks, 2):
        assert r["squeeze_"] == ((6, 4), "S(1)", (6, 2), True)
        assert r["linear_1d"] and r["geqrf"] and r["one_element_plain"]
        assert r["geqrf_gather"] == 1  # the replicate-only rule's planned gather, counted
