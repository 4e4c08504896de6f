"""Meta-device initialisation of sharded parameters: a module built on the meta device, its parameters
distributed (Shard(0), Shard(1), Replicate, uneven shards), ``to_empty`` and torch's initialisers give
every rank its slice of what the same initialiser gives one process with the same seed."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from shardwise.testing import run_on_ranks, worker_mesh

INITS = {
    "trunc_normal_": functools.partial(nn.init.trunc_normal_, std=0.5, a=-0.6, b=0.9),
    "normal_": functools.partial(nn.init.normal_, mean=0.1, std=0.3),
    "uniform_": functools.partial(nn.init.uniform_, a=-2.0, b=0.5),
    "zeros_": nn.init.zeros_,
    "ones_": nn.init.ones_,
    "constant_": functools.partial(nn.init.constant_, val=0.25),
    "kaiming_uniform_": functools.partial(nn.init.kaiming_uniform_, a=5 ** 0.5),
    "kaiming_normal_": functools.partial(nn.init.kaiming_normal_, mode="fan_out"),
    "xavier_uniform_": nn.init.xavier_uniform_,
    "xavier_normal_": nn.init.xavier_normal_,
}
SHAPE = (7, 5)  # uneven on 2 ranks either way


def meta_init(rank, world, placement: str):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    pl = Replicate() if placement == "R" else Shard(int(placement[1:]))
    errs = {}
    for name, init in INITS.items():
        with torch.device("meta"):
            layer = nn.Linear(SHAPE[1], SHAPE[0], bias=False)
        layer.weight = nn.Parameter(distribute_tensor(layer.weight, mesh, [pl]))
        layer.to_empty(device="cpu")
        torch.manual_seed(3)
        with torch.no_grad():
            init(layer.weight)
        next_draw = torch.rand(3)  # the generator is left where the single-process call leaves it
        torch.manual_seed(3)
        ref = init(torch.empty(SHAPE))
        next_ref = torch.rand(3)
        w = layer.weight
        ok_layout = w.placements == (pl,) and w.to_local().device.type == "cpu"
        errs[name] = (w.full_tensor() - ref).abs().max().item() if ok_layout else float("inf")
        errs[name + " (next draw)"] = (next_draw - next_ref).abs().max().item()
    return errs


@pytest.mark.parametrize("placement", ["S0", "S1", "R"])
def test_meta_init_equals_single_process(placement):
    for errs in run_on_ranks(meta_init, 2, placement):
        assert all(e == 0.0 for e in errs.values()), errs
