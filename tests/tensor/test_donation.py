"""Buffer donation: a temporary pending value is reduced in its own buffer; anything still visible
(a named DTensor, a held local tensor, a view, a tensor autograd saved) is copied and stays intact."""

import torch
import torch.nn.functional as F

from shardwise.tensor import CollectiveCounter, DTensor, Partial, Replicate, Shard, distribute_tensor
from shardwise.testing import run_on_ranks, worker_mesh


def _setup(world):
    mesh = worker_mesh((world,))
    full = torch.randn(13, 4, generator=torch.Generator().manual_seed(0))
    w = distribute_tensor(full, mesh, [Shard(0)])
    ids = torch.tensor([[0, 12, 5], [5, 3, 7]])
    return mesh, full, w, distribute_tensor(ids, mesh, [Replicate()]), F.embedding(ids, full)


def _temporaries(rank, world):
    mesh, full, w, ids, ref = _setup(world)
    with CollectiveCounter() as c:
        a = F.embedding(ids, w).full_tensor()
        b = F.embedding(ids, w).redistribute(mesh, [Replicate()]).to_local()
    torch.testing.assert_close(a, ref)
    torch.testing.assert_close(b, ref)
    assert a.data_ptr() != b.data_ptr()
    # with autograd: the temporary is still donated, the gradient is still right
    wg = w.detach().requires_grad_()
    grad = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    with CollectiveCounter() as cg:
        y = F.embedding(ids, wg).full_tensor()
    y.backward(grad)
    ref_w = full.clone().requires_grad_()
    F.embedding(ids.full_tensor(), ref_w).backward(grad)
    torch.testing.assert_close(wg.grad.full_tensor(), ref_w.grad)
    # Partial(avg) reduced in place is scaled in place too
    avg = DTensor.from_local(torch.full((3,), float(rank + 1)), mesh, [Partial("avg")]).full_tensor()
    torch.testing.assert_close(avg, torch.full((3,), (world + 1) / 2))
    return c.donated, cg.donated


def test_temporaries_are_reduced_in_place():
    for donated in run_on_ranks(_temporaries, 2):
        assert donated == (2, 1)


def _visible(rank, world):
    mesh, full, w, ids, ref = _setup(world)
    out = F.embedding(ids, w)
    held = out.to_local()
    before = held.clone()
    with CollectiveCounter() as c:
        a, b = out.full_tensor(), out.full_tensor()  # named: copied, out stays pending and valid
        s = out.redistribute(mesh, [Shard(0)]).full_tensor()
        # a temporary DTensor over a local tensor the caller still holds, or over a view
        loc = torch.full((2, 3), float(rank + 1))
        base = torch.full((4, 3), float(rank + 1))
        c1 = DTensor.from_local(loc, mesh, [Partial()]).full_tensor()
        c2 = DTensor.from_local(base[:2], mesh, [Partial()]).full_tensor()
        # saved by autograd: the wrapper has a C++ reference besides Python's
        x = DTensor.from_local(torch.full((2,), 2.0), mesh, [Partial()]).requires_grad_()
        z = x * x
        c3 = x.full_tensor()
    for t in (a, b, s):
        torch.testing.assert_close(t, ref)
    torch.testing.assert_close(held, before)
    assert out.placements != (Replicate(),)
    total = world * (world + 1) / 2
    torch.testing.assert_close(c1, torch.full((2, 3), total))
    torch.testing.assert_close(c2, torch.full((2, 3), total))
    torch.testing.assert_close(loc, torch.full((2, 3), float(rank + 1)))
    torch.testing.assert_close(base, torch.full((4, 3), float(rank + 1)))
    torch.testing.assert_close(c3, torch.full((2,), 2.0 * world))
    z.full_tensor().sum().backward()  # x's local was not overwritten: d(x*x)/dx uses it
    torch.testing.assert_close(x.grad.full_tensor(), torch.full((2,), 4.0 * world))
    return c.donated


def test_visible_buffers_are_never_overwritten():
    for donated in run_on_ranks(_visible, 2):
        assert donated == 0


def _traced(rank, world):
    from torch.fx.experimental.proxy_tensor import make_fx

    mesh = worker_mesh((2, 2))
    coord = mesh.get_coordinate()
    # [S(0), P] -> [R, R]: a gather, then a reduction of the gathered buffer, which eager code does in
    # place (nobody else sees that buffer)
    local = torch.eye(4)[2 * coord[0]:2 * coord[0] + 2] / 2 + 0.01 * (rank + 1)

    def move(t):
        x = DTensor.from_local(t, mesh, [Shard(0), Partial()])
        return x.redistribute(mesh, [Replicate(), Replicate()]).to_local()

    def op(t):  # the same two steps inside dispatch: linalg ops run replicated
        return torch.linalg.inv(DTensor.from_local(t, mesh, [Shard(0), Partial()])).to_local()

    with CollectiveCounter() as c:
        eager = move(local.clone()), op(local.clone())
    graphs = [make_fx(fn, tracing_mode="fake")(local.clone()) for fn in (move, op)]
    # only functional collectives, each with its wait: an in-place c10d all-reduce is recorded without
    # its wait, so the graph would read (and could free) the buffer while gloo still writes it
    inplace = [str(n.target) for g in graphs for n in g.graph.nodes
               if n.op == "call_function" and str(n.target).startswith("c10d.")]
    for g, e in zip(graphs, eager):
        torch.testing.assert_close(g(local.clone()), e)
    full = torch.eye(4) + 0.01 * (1 + 2) + 0.01 * 2 * torch.tensor([[0.0], [0.0], [2.0], [2.0]])
    torch.testing.assert_close(eager[0], full)
    return inplace, c.donated


def test_traced_moves_never_reduce_in_place():
    for inplace, donated in run_on_ranks(_traced, 4):
        assert inplace == [] and donated == 2  # eager still reduces in place
