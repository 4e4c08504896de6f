"""Module-level rank functions for the distributed embedding tests (run by run_on_ranks)."""

from __future__ import annotations

import torch

from shardwise.embedding import shard
from shardwise.testing import worker_mesh

from . import common


def mesh_for(world: int, hosts: int):
    return worker_mesh((hosts, world // hosts)) if hosts > 1 else worker_mesh((world,))


def forward_all_plans(rank, world, hosts, plan_names, cases):
    """Max abs error of sharded vs unsharded forward for every (plan, weighted) case."""
    mesh = mesh_for(world, hosts)
    errors = {}
    for weighted in cases:
        ebc = common.make_ebc(seed=1, weighted=weighted)
        all_plans = common.plans(world, hosts)
        for name in plan_names:
            sharded = shard(ebc, all_plans[name], mesh=mesh)
            for step in range(2):
                kjt = common.rank_batches(world, step, weighted)[rank]
                got = sharded(kjt)
                want = ebc(kjt)
                assert got.keys() == want.keys()
                err = (got.values() - want.values()).abs().max().item() if want.values().numel() else 0.0
                errors[(name, weighted, step)] = err
    return errors


def train_all_plans(rank, world, hosts, plan_names, cases, steps=3):
    """Per (plan, optimizer, weighted): max abs weight error after ``steps`` fused steps vs the dense
    unsharded reference, and how far the reference moved (so a no-op update cannot pass)."""
    mesh = mesh_for(world, hosts)
    errors = {}
    for optimizer, weighted in cases:
        ebc = common.make_ebc(seed=2, weighted=weighted)
        want = common.reference_train(ebc, optimizer, world, steps, weighted)
        moved = max((w - ebc.embedding_bags[t].weight).abs().max().item() for t, w in want.items())
        for name in plan_names:
            sharded = shard(ebc, common.plans(world, hosts)[name], mesh=mesh, optimizer=optimizer)
            for step in range(steps):
                batches = common.rank_batches(world, step, weighted)
                tgts = common.targets(world, step, [b.stride() for b in batches],
                                      sum(d * len(f) for _, _, d, f, _ in common.TABLES))
                common.loss_fn(sharded(batches[rank]), tgts[rank]).backward()
            sd = sharded.state_dict()
            err = 0.0
            for table, w in want.items():
                full = sd[f"embedding_bags.{table}.weight"].full_tensor()
                err = max(err, (full - w).abs().max().item())
            errors[(name, optimizer.func.__name__, weighted)] = (err, moved)
    return errors
