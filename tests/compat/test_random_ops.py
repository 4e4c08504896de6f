"""Random ops on DTensors (dropout, bernoulli_, uniform_/normal_ initialisers, rand_like & co.) on real
gloo ranks, against the same calls on full tensors in plain PyTorch with the same seed, and on
replicated inputs against PyTorch's own DTensor in the same process group.

A sharded result is the unsharded draw's slice on each rank (so shards differ), a replicated one the
whole draw on every rank, and every rank's generator ends where the unsharded call leaves it.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from shardwise.testing.harness import run_on_ranks, worker_mesh

_SHAPES = [(7, 5), (3, 2, 6), (1, 4)]  # uneven shards, and a dim smaller than the mesh (empty shards)
_CALLS = {
    "dropout": lambda t: F.dropout(t, 0.4, training=True),
    "native_dropout": lambda t: torch.native_dropout(t, 0.3, True)[0],
    "native_dropout_mask": lambda t: torch.native_dropout(t, 0.3, True)[1],
    "bernoulli_": lambda t: t.clone().bernoulli_(0.35),
    "uniform_": lambda t: torch.nn.init.uniform_(t.clone(), -2.0, 3.0),
    "normal_": lambda t: torch.nn.init.normal_(t.clone(), 1.0, 0.5),
    "exponential_": lambda t: t.clone().exponential_(2.0),
    "random_": lambda t: t.clone().random_(-3, 9),
    "rand_like": torch.rand_like,
    "randn_like": torch.randn_like,
    "randint_like": lambda t: torch.randint_like(t, 0, 5),
    "bernoulli_p": lambda t: torch.bernoulli(t, 0.5),
    "kaiming_uniform_": lambda t: torch.nn.init.kaiming_uniform_(t.clone()) if t.ndim > 1 else t.clone(),
}


def _placements(mesh_ndim: int, ndim: int):
    from shardwise.tensor import Replicate, Shard

    if mesh_ndim == 1:
        return [[Shard(d)] for d in range(ndim)] + [[Replicate()]]
    return [[Shard(0), Shard(ndim - 1)], [Shard(0), Shard(0)], [Replicate(), Shard(ndim - 1)],
            [Shard(ndim - 1), Replicate()], [Replicate(), Replicate()]]


def _draw_matches(mesh, name, call, shape, placements, seed) -> tuple[bool, bool, torch.Tensor]:
    """(full result equals the unsharded one, next draws agree too, this rank's local piece)."""
    from shardwise.tensor import distribute_tensor

    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) + 2.0
    torch.manual_seed(seed)
    ref = call(x)
    ref_next = torch.rand(3)
    torch.manual_seed(seed)
    out = call(distribute_tensor(x, mesh, placements))
    after = torch.rand(3)
    return torch.equal(out.full_tensor(), ref), torch.equal(after, ref_next), out.to_local()


def random_calls(rank, world):
    results, pieces = {}, {}
    for mesh_shape in ((world,), (2, world // 2)):
        mesh = worker_mesh(mesh_shape)
        for si, shape in enumerate(_SHAPES):
            for pl in _placements(len(mesh_shape), len(shape)):
                for ci, (name, call) in enumerate(_CALLS.items()):
                    key = f"{name} {shape} {mesh_shape} {[str(p) for p in pl]}"
                    same, synced, piece = _draw_matches(mesh, name, call, shape, pl, 100 * si + ci)
                    results[key] = (same, synced)
                    pieces[key] = piece
    return results, pieces


def test_random_ops_draw_the_unsharded_values_on_every_layout():
    out = run_on_ranks(random_calls, 4)
    for results, _ in out:
        bad = {k: v for k, v in results.items() if v != (True, True)}
        assert not bad, f"(full result equal, generator in step) per case: {bad}"
    pieces = [p for _, p in out]
    for key in pieces[0]:
        if "S(" not in key:  # replicated: the same whole draw on every rank
            assert all(torch.equal(p[key], pieces[0][key]) for p in pieces), key
    # sharded: distinct values per shard (here the two halves of a 1-D Shard(0) layout)
    key = "uniform_ (7, 5) (4,) ['S(0)']"
    assert not torch.equal(pieces[0][key][:1], pieces[1][key][:1]), "shards must not repeat one draw"


def dropout_grad_calls(rank, world):
    """A module with dropout on a sequence-sharded input (SequenceParallel's layout) trains like the
    unsharded module: same output and input gradient with the same seed."""
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(3))
    w = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(4))
    drop = torch.nn.Dropout(0.5)
    ref_x = x.clone().requires_grad_()
    torch.manual_seed(11)
    ref = drop(ref_x)
    (ref * w).sum().backward()
    dx = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
    torch.manual_seed(11)
    out = drop(dx)
    placements = tuple(out.placements)
    (out.full_tensor() * w).sum().backward()
    return (torch.equal(out.full_tensor(), ref), torch.equal(dx.grad.full_tensor(), ref_x.grad),
            placements == (Shard(1),))


def test_dropout_on_a_sequence_sharded_input_trains_like_one_process():
    for r in run_on_ranks(dropout_grad_calls, 2):
        assert r == (True, True, True), r


def torch_dtensor_calls(rank, world):
    """Replicated inputs: the same values as PyTorch's DTensor (on CPU it runs the op on each local
    piece with the rank's generator); both advance the generator alike."""
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import distribute_tensor as t_distribute

    from shardwise.tensor import Replicate, distribute_tensor

    mesh = worker_mesh((world,))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)) + 2.0
    agree = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that its random ops are partial on CPU meshes
        for name, call in _CALLS.items():
            if name in ("random_", "bernoulli_p"):  # PyTorch's DTensor has no rule for these two
                continue
            torch.manual_seed(5)
            theirs = call(t_distribute(x, mesh, [TR()])).to_local()
            theirs_next = torch.rand(2)
            torch.manual_seed(5)
            ours = call(distribute_tensor(x, mesh, [Replicate()])).to_local()
            agree[name] = torch.equal(ours, theirs) and torch.equal(torch.rand(2), theirs_next)
    return agree


def test_replicated_random_ops_match_torch_dtensor():
    for agree in run_on_ranks(torch_dtensor_calls, 2):
        assert all(agree.values()), agree


def value_dependent_calls(rank, world):
    """bernoulli(probabilities) draws from the values: a sharded input is gathered, every rank draws the
    whole (replicated) result, equal to the unsharded call."""
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    probs = torch.rand(6, 3, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(9)
    ref = torch.bernoulli(probs)
    torch.manual_seed(9)
    out = torch.bernoulli(distribute_tensor(probs, mesh, [Shard(0)]))
    return torch.equal(out.full_tensor(), ref), [str(p) for p in out.placements]


def test_bernoulli_of_sharded_probabilities_matches_one_process():
    for same, placements in run_on_ranks(value_dependent_calls, 2):
        assert same and placements == ["R"], (same, placements)
