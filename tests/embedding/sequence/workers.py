"""Module-level rank functions for the EmbeddingCollection tests (run by run_on_ranks)."""

from __future__ import annotations

import torch

from shardwise.embedding import shard

from ..workers import mesh_for
from . import common


def forward_all_plans(rank, world, hosts, plan_names):
    """Per (plan, step): max abs error of the sharded rows vs the unsharded module's; asserts keys,
    lengths and offsets are the input's."""
    mesh = mesh_for(world, hosts)
    ec = common.make_ec(seed=1)
    errors = {}
    for name in plan_names:
        sharded = shard(ec, common.plans(world, hosts)[name], mesh=mesh)
        for step in range(2):
            kjt = common.rank_batches(world, step)[rank]
            got, want = sharded(kjt), ec(kjt)
            assert list(got) == list(want) == common.FEATURES
            err = 0.0
            for f in want:
                assert torch.equal(got[f].lengths(), want[f].lengths()), (name, f)
                assert torch.equal(got[f].offsets(), want[f].offsets()), (name, f)
                assert got[f].weights_or_none() is None and want[f].weights_or_none() is None
                assert got[f].values().shape == want[f].values().shape, (name, f)
                if want[f].values().numel():
                    err = max(err, (got[f].values() - want[f].values()).abs().max().item())
            errors[(name, step)] = err
    return errors


def train_all_plans(rank, world, hosts, plan_names, optimizers, steps=3, divided=True):
    """Per (plan, optimizer): (max weight error after ``steps`` fused steps vs the dense unsharded
    reference, how far the reference moved)."""
    mesh = mesh_for(world, hosts)
    errors = {}
    for optimizer in optimizers:
        ec = common.make_ec(seed=2)
        want = common.reference_train(ec, optimizer, world, steps, divided=divided)
        start = {f"embeddings.{n}.weight": ec.embeddings[n].weight.detach() for n in common.NAMES}
        moved = common.max_diff(want, start)
        for name in plan_names:
            sharded = shard(ec, common.plans(world, hosts)[name], mesh=mesh, optimizer=optimizer,
                            gradient_division=divided)
            common.train(sharded, rank, world, steps)
            errors[(name, optimizer.func.__name__)] = (common.max_diff(common.full_weights(sharded), want), moved)
    return errors
