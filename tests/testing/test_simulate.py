"""Simulated collectives: checked against torch.chunk and against real gloo/NCCL collectives."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.testing import run_on_ranks, simulate

WORLD = 2


@pytest.mark.parametrize(
    "n, world, sizes",
    [(10, 4, [3, 3, 3, 1]), (2, 4, [1, 1, 0, 0]), (0, 3, [0, 0, 0]), (8, 4, [2, 2, 2, 2]),
     (5, 1, [5]), (7, 3, [3, 3, 1])],
)
def test_chunk_sizes_examples(n, world, sizes):
    assert simulate.chunk_sizes(n, world) == sizes


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), world=st.integers(1, 9))
def test_chunk_sizes_follow_torch_chunk(n, world):
    sizes = simulate.chunk_sizes(n, world)
    torch_sizes = [len(c) for c in torch.chunk(torch.arange(n), world)] if n else []
    assert len(sizes) == world and sum(sizes) == n
    assert sizes[: len(torch_sizes)] == torch_sizes
    assert all(s == 0 for s in sizes[len(torch_sizes):])


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=3), world=st.integers(1, 5),
       data=st.data())
def test_shard_then_unshard_is_identity(shape, world, data):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    full = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    shards = simulate.shard(full, dim, world)
    assert len(shards) == world
    assert [s.shape[dim] for s in shards] == simulate.chunk_sizes(full.shape[dim], world)
    assert torch.equal(simulate.unshard(shards, dim), full)


def test_reduce_scatter_and_all_to_all_uneven_by_definition():
    xs = [torch.arange(10.0).reshape(5, 2) * (r + 1) for r in range(3)]
    total = xs[0] + xs[1] + xs[2]
    got = simulate.reduce_scatter(xs, dim=0)
    for g, w in zip(got, [total[0:2], total[2:4], total[4:5]], strict=True):
        assert torch.equal(g, w)
    # Shard(0) -> Shard(1) style exchange: rank d receives rows block d of every source,
    # placed side by side in source order.
    out = simulate.all_to_all(xs, split_dim=0, cat_dim=1)
    blocks = [(0, 2), (2, 4), (4, 5)]
    for d, (lo, hi) in enumerate(blocks):
        assert torch.equal(out[d], torch.cat([x[lo:hi] for x in xs], dim=1))


def test_inputs_are_not_modified():
    xs = simulate.per_rank_randn(2, (4,))
    copies = [x.clone() for x in xs]
    for fn in (simulate.all_reduce, simulate.all_gather, simulate.reduce_scatter):
        fn(xs)[0].add_(1)
    assert all(torch.equal(x, c) for x, c in zip(xs, copies))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: simulate.shard(torch.zeros(2, 3), 2, 2), ValueError, r"dim=2 on a 2-D tensor"),
        (lambda: simulate.shard(torch.tensor(1.0), 0, 2), ValueError, "0-D tensor"),
        (lambda: simulate.all_reduce([torch.zeros(2)], op="mean"), ValueError, "op='mean'"),
        (lambda: simulate.all_reduce([]), ValueError, "per_rank is empty"),
        (lambda: simulate.all_reduce([torch.zeros(2), torch.zeros(3)]), ValueError,
         r"same shape on every rank; got shapes \[\(2,\), \(3,\)\]"),
        (lambda: simulate.all_gather([torch.zeros(2), [1.0]]), TypeError,
         r"per_rank\[1\] is a list"),
        (lambda: simulate.broadcast([torch.zeros(2)], 1), ValueError, "src=1"),
        (lambda: simulate.chunk_sizes(4, 0), ValueError, "world_size=0"),
    ],
)
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def real_collectives(rank, world_size, xs):
    """Every collective the simulator models, run for real on this rank's input."""
    mine = xs[rank]
    out = {}
    for op in ("sum", "max", "min", "product"):
        t = mine.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()), group=None)
        out[op] = t
    gathered = torch.empty((world_size * mine.shape[0], *mine.shape[1:]), device=mine.device)
    dist.all_gather_single(gathered, mine, group=None)
    out["all_gather"] = gathered
    scattered = torch.empty((mine.shape[0] // world_size, *mine.shape[1:]), device=mine.device)
    dist.reduce_scatter_single(scattered, mine, group=None)
    out["reduce_scatter"] = scattered
    exchanged = torch.empty_like(mine)
    dist.all_to_all_single(exchanged, mine, group=None)
    out["all_to_all"] = exchanged
    bcast = mine.clone()
    dist.broadcast(bcast, src=1, group=None)
    out["broadcast"] = bcast
    return out


def test_simulation_matches_real_collectives():
    xs = simulate.per_rank_randn(WORLD, (4, 3), seed=3)
    results = run_on_ranks(real_collectives, WORLD, xs)
    expected = {op: simulate.all_reduce(xs, op) for op in ("sum", "max", "min", "product")}
    expected["all_gather"] = simulate.all_gather(xs, 0)
    expected["reduce_scatter"] = simulate.reduce_scatter(xs, 0)
    expected["all_to_all"] = simulate.all_to_all(xs, split_dim=0, cat_dim=0)
    expected["broadcast"] = simulate.broadcast(xs, 1)
    for rank, got in enumerate(results):
        for name, want in expected.items():
            torch.testing.assert_close(got[name], want[rank], msg=f"{name} on rank {rank}")
