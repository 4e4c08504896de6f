"""DTensor on real gloo ranks: round trips, every redistribute transition (forward and backward), errors.

Ground truth is always the full tensor in plain single-process PyTorch.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from shardwise.testing import run_on_ranks, worker_mesh

PLACEMENT_NAMES = ["S0", "S1", "R", "Psum", "Pmax"]


def _pl(name):
    from shardwise.tensor import Partial, Replicate, Shard

    return {"S0": Shard(0), "S1": Shard(1), "R": Replicate(), "Psum": Partial("sum"), "Pavg": Partial("avg"),
            "Pmax": Partial("max"), "Pmin": Partial("min")}[name]


SHAPES = [(7, 5), (8, 4), (1, 3), (3, 2)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]


def _full(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def round_trips(rank, world, mesh_shape):
    from shardwise.tensor import distribute_tensor

    mesh = worker_mesh(mesh_shape)
    names = PLACEMENT_NAMES + ["Pmin"]
    failures = []
    for shape, dtype, combo in itertools.product(SHAPES, DTYPES, itertools.product(names, repeat=len(mesh_shape))):
        x = _full(shape, dtype, seed=7)
        d = distribute_tensor(x, mesh, [_pl(n) for n in combo], src_data_rank=None)
        back = d.full_tensor()
        if d.shape != x.shape or not torch.equal(back, x):
            failures.append((shape, str(dtype), combo))
    return failures


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (2, 2)])
def test_distribute_full_tensor_round_trip_bit_exact(mesh_shape):
    world = 1
    for s in mesh_shape:
        world *= s
    results = run_on_ranks(round_trips, world, mesh_shape)
    assert results[0] == [], f"round trips differ: {results[0][:5]}"


def transitions(rank, world, mesh_shape, shape):
    """Every (src, dst) pair: forward value, backward gradient and gradient placements."""
    from shardwise.tensor import Partial, Replicate, distribute_tensor

    mesh = worker_mesh(mesh_shape)
    x = _full(shape, torch.float64, 3)
    w = _full(shape, torch.float64, 4)
    bad = []
    names = ["S0", "S1", "R", "Psum"] + (["Pavg"] if len(mesh_shape) == 1 else [])
    pairs = itertools.product(itertools.product(names, repeat=len(mesh_shape)), repeat=2)
    for src, dst in pairs:
        src_pl = [_pl(n) for n in src]
        d = distribute_tensor(x.clone().requires_grad_(), mesh, src_pl, src_data_rank=None)
        y = d.redistribute(mesh, [_pl(n) for n in dst])
        if tuple(str(p) for p in y.placements) != tuple(str(_pl(n)) for n in dst):
            bad.append((src, dst, "placements", y.placements))
        if not torch.allclose(y.full_tensor(), x, atol=1e-12):
            bad.append((src, dst, "forward"))
            continue
        (y.full_tensor() * w).sum().backward()
        expect_pl = tuple(Replicate() if isinstance(p, Partial) else p for p in src_pl)
        if tuple(d.grad.placements) != expect_pl:
            bad.append((src, dst, "grad placements", d.grad.placements))
        if not torch.allclose(d.grad.full_tensor(), w, atol=1e-12):
            bad.append((src, dst, "backward"))
    return bad


@pytest.mark.parametrize("mesh_shape,shape", [((2,), (5, 7)), ((3,), (5, 2)), ((4,), (6, 3)), ((2, 2), (5, 3))])
def test_every_redistribute_transition_forward_and_backward(mesh_shape, shape):
    world = 1
    for s in mesh_shape:
        world *= s
    results = run_on_ranks(transitions, world, mesh_shape, shape, timeout=240)
    assert results[0] == [], results[0][:6]


def collective_choice(rank, world):
    """The planner uses the cheapest collective for each transition (counted)."""
    from shardwise.tensor import CollectiveCounter, Partial, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x = torch.randn(8, 6)
    out = {}
    for src, dst in [(Shard(0), Replicate()), (Partial(), Replicate()), (Partial(), Shard(0)),
                     (Replicate(), Shard(1)), (Shard(0), Shard(1)), (Replicate(), Partial())]:
        d = distribute_tensor(x, mesh, [src])
        with CollectiveCounter() as c:
            d.redistribute(mesh, [dst])
        out[f"{src}->{dst}"] = dict(c.counts)
    return out


def test_redistribute_issues_one_collective_of_the_right_kind():
    got = run_on_ranks(collective_choice, 2)[0]
    assert got == {
        "S(0)->R": {"all_gather": 1}, "P(sum)->R": {"all_reduce": 1}, "P(sum)->S(0)": {"reduce_scatter": 1},
        "R->S(1)": {}, "S(0)->S(1)": {"all_to_all": 1}, "R->P(sum)": {},
    }


def test_plan_is_printable_data():
    from shardwise.tensor import Partial, Replicate, Shard, plan_redistribute

    steps = plan_redistribute((Shard(0), Partial()), (Replicate(), Shard(0)), (2, 2), 2)
    text = [str(s) for s in steps]
    assert text == ["mesh[0] S(0) -> R (all_gather)", "mesh[1] P(sum) -> S(0) (reduce_scatter)"] or text == [
        "mesh[0] S(0) -> R (all_gather)", "mesh[1] P(sum) -> R (all_reduce)", "mesh[1] R -> S(0) (local_slice)"]
