"""full_tensor under autograd (one fused Function, full.py) against the two-step path it replaces
(redistribute to Replicate, then to_local) and against unsharded PyTorch: values, gradient values and
gradient placements, grad_placements, donation and checked mode, on world 2 and 3."""

import pytest
import torch
import torch.nn.functional as F

from shardwise.tensor import (CollectiveCounter, DTensor, Partial, Replicate, Shard, distribute_tensor,
                              rank_checks)
from shardwise.testing import run_on_ranks, worker_mesh


def _two_step(x, grad_placements=None):
    full = [Replicate()] * x.device_mesh.ndim
    return x.redistribute(x.device_mesh, full).to_local(grad_placements=grad_placements)


def _grad_of(make_source, path, grad, grad_placements=None):
    """(output, leaf gradient DTensor or tensor, counter) of ``path`` applied to a fresh source."""
    leaf, x = make_source()
    with CollectiveCounter() as c:
        out = path(x, grad_placements)
        out.backward(grad)
    return out.detach(), leaf.grad, c


def _sources(mesh, rank, world):
    """(name, make_source, unsharded value, unsharded gradient of sum(out * grad)) per case."""
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(2 * world + 1, 3, generator=gen)  # uneven row blocks
    ids = torch.tensor([[0, 2 * world, 1], [world, world, 2]])
    grad = torch.randn(2, 3, 3, generator=gen)
    ref_w = table.clone().requires_grad_()
    F.embedding(ids, ref_w).backward(grad)

    def sharded():
        w = distribute_tensor(table, mesh, [Shard(0)]).requires_grad_()
        return w, w * 1.0  # non-leaf: the gradient passes through the multiply's backward

    def lookup():  # a pending MaskPartial sum; the table's gradient must come back Shard(0)
        w = distribute_tensor(table, mesh, [Shard(0)]).requires_grad_()
        return w, F.embedding(distribute_tensor(ids, mesh, [Replicate()]), w)

    def partial():  # a pending sum over a local piece: its gradient is replicated, back on the piece
        piece = torch.full((4,), float(rank + 1), requires_grad=True)
        return piece, DTensor.from_local(piece, mesh, [Partial()])

    pgrad = torch.randn(4, generator=gen)
    return [
        ("sharded", sharded, table, torch.ones_like(table), torch.ones_like(table)),
        ("lookup", lookup, F.embedding(ids, table), grad, ref_w.grad),
        ("partial", partial, torch.full((4,), world * (world + 1) / 2), pgrad, pgrad),
    ]


def _fused_matches_two_step(rank, world):
    mesh = worker_mesh((world,))
    checked = []
    for name, make, ref_out, grad, ref_grad in _sources(mesh, rank, world):
        fused = lambda x, gp: x.full_tensor(grad_placements=gp)  # noqa: E731
        out, g, _ = _grad_of(make, fused, grad)
        out2, g2, _ = _grad_of(make, _two_step, grad)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(out2, ref_out)
        assert type(g) is type(g2), (name, type(g), type(g2))
        if isinstance(g, DTensor):
            assert g.placements == g2.placements == (Shard(0),), (name, g.placements, g2.placements)
            assert g.dtype == g2.dtype and g.shape == g2.shape
            torch.testing.assert_close(g.to_local(), g2.to_local(), rtol=0, atol=0)
            g = g.full_tensor()
        torch.testing.assert_close(g, ref_grad)
        # the incoming gradient declared pending (each rank holds a share): reduced on the way back
        share = grad / world
        out, gp, _ = _grad_of(make, fused, share, [Partial()])
        _, gp2, _ = _grad_of(make, _two_step, share, [Partial()])
        gp, gp2 = (t.full_tensor() if isinstance(t, DTensor) else t for t in (gp, gp2))
        torch.testing.assert_close(gp, gp2, rtol=0, atol=0)
        torch.testing.assert_close(gp, ref_grad)
        checked.append(name)
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_fused_full_tensor_matches_two_step_path(world):
    for checked in run_on_ranks(_fused_matches_two_step, world):
        assert checked == ["sharded", "lookup", "partial"]


def _donation_under_autograd(rank, world):
    mesh = worker_mesh((world,))
    table = torch.randn(5, 2, generator=torch.Generator().manual_seed(3))
    ids = distribute_tensor(torch.tensor([4, 0, 2]), mesh, [Replicate()])
    w = distribute_tensor(table, mesh, [Shard(0)]).requires_grad_()
    with CollectiveCounter() as temp:
        y = F.embedding(ids, w).full_tensor()  # a temporary: reduced in its own buffer
    with CollectiveCounter() as named:
        out = F.embedding(ids, w)
        held = out.to_local().clone()
        z = out.full_tensor()  # named: copied, and out's piece is intact
    torch.testing.assert_close(out.to_local(), held, rtol=0, atol=0)
    (y.sum() + 2 * z.sum()).backward()
    want = torch.zeros_like(table)
    want.index_add_(0, torch.tensor([4, 0, 2]), torch.full((3, 2), 3.0))
    torch.testing.assert_close(w.grad.full_tensor(), want)
    assert w.grad.placements == (Shard(0),)
    return temp.donated, named.donated, temp.counts, named.counts


@pytest.mark.parametrize("world", [2, 3])
def test_fused_full_tensor_donates_only_temporaries(world):
    for donated, kept, c1, c2 in run_on_ranks(_donation_under_autograd, world):
        assert (donated, kept) == (1, 0)
        assert c1 == c2 == {"all_reduce": 1}


def _checked(rank, world):
    mesh = worker_mesh((world,))
    x = distribute_tensor(torch.arange(6.0).view(3, 2), mesh, [Shard(0)]).requires_grad_()
    with rank_checks(True):
        try:
            # the last rank asks for another layout than full_tensor's all-Replicate
            y = x.redistribute(mesh, [Shard(1)]) if rank == world - 1 else x.full_tensor()
            return None, y.shape
        except ValueError as e:
            return str(e), None


def test_fused_full_tensor_keeps_the_checked_mode_agreement():
    errs = run_on_ranks(_checked, 2)
    assert errs[0][0] is not None and errs[0][0] == errs[1][0]
    assert "(S(0)) -> (R)" in errs[0][0] and "(S(0)) -> (S(1))" in errs[0][0]


def _compiled(rank, world):
    # aot_eager: dynamo and AOT autograd trace the Function; inductor would only add compile time
    torch._dynamo.reset()
    mesh = worker_mesh((world,))
    table = torch.arange(40.0).view(10, 4)
    ids = torch.tensor([1, 7, 3, 7])
    w = distribute_tensor(table, mesh, [Shard(0)]).requires_grad_()
    f = torch.compile(lambda i: F.embedding(i, w).full_tensor() * 2, fullgraph=True, backend="aot_eager")
    y = f(distribute_tensor(ids, mesh, [Replicate()]))
    y.sum().backward()
    ref_w = table.clone().requires_grad_()
    (F.embedding(ids, ref_w) * 2).sum().backward()
    torch.testing.assert_close(y, F.embedding(ids, table) * 2)
    torch.testing.assert_close(w.grad.full_tensor(), ref_w.grad)
    return w.grad.placements


def test_fused_full_tensor_compiles_in_one_graph():
    for placements in run_on_ranks(_compiled, 2):
        assert placements == (Shard(0),)
