"""Sharded EmbeddingCollection state: meta construction under any plan, state dicts and DCP
checkpoints across world sizes and plans, live reshard -- all through the bag collection's code."""

from __future__ import annotations

import pytest
import torch

from shardwise.embedding import reshard, shard
from shardwise.embedding.checkpoint import load_sharded, save_sharded
from shardwise.testing import run_on_ranks

from ..reshard.test_reshard import full_state
from ..workers import mesh_for
from . import common


def meta_under_plans(rank, world, plan_names):
    """Full weights of a meta-built collection under each plan (and of the eager build); each rank's
    local storage is its shards only."""
    mesh = mesh_for(world, 1)
    eager = common.make_ec(seed=21)
    out = {"eager": {k: v.clone() for k, v in eager.state_dict().items()}}
    for name in plan_names:
        meta = common.make_ec(seed=21, device="meta")
        assert meta.is_meta and all(p.device.type == "meta" for p in meta.parameters())
        sharded = shard(meta, common.plans(world)[name], mesh=mesh, optimizer=common.ADAGRAD)
        out[name] = common.full_weights(sharded)
    return out


def test_meta_build_gives_the_same_weights_under_three_plans():
    plans = ["row_wise", "column_wise", "mixed"]
    for res in run_on_ranks(meta_under_plans, 2, plans, timeout=120.0):
        for name in plans:
            assert sorted(res[name]) == sorted(res["eager"])
            assert all(torch.equal(res[name][k], res["eager"][k]) for k in res["eager"]), name


def save_worker(rank, world, path, plan_name):
    mod = shard(common.make_ec(seed=5), common.plans(world)[plan_name], mesh=mesh_for(world, 1),
                optimizer=common.ADAGRAD)
    common.train(mod, rank, world, 2)
    save_sharded(path, mod)
    return {k: v.clone() for k, v in full_state(mod).items()}


def load_worker(rank, world, path, plan_name):
    # meta-built, so only the local shards ever exist; a no-op load would leave the seeded init
    mod = shard(common.make_ec(seed=6, device="meta"), common.plans(world)[plan_name], mesh=mesh_for(world, 1),
                optimizer=common.ADAGRAD)
    load_sharded(path, mod)
    loaded = {k: v.clone() for k, v in full_state(mod).items()}
    common.train(mod, rank, world, 1, first=2)
    trained = full_state(mod)
    return loaded, max((trained[k] - loaded[k]).abs().max().item() for k in loaded)


@pytest.mark.parametrize("src, dst", [((2, "mixed"), (3, "mixed2")), ((3, "column_wise"), (2, "row_wise"))])
def test_dcp_checkpoint_loads_on_another_world_size_and_plan(tmp_path, src, dst):
    path = str(tmp_path / "ckpt")
    saved = run_on_ranks(save_worker, src[0], path, src[1], timeout=120.0)[0]
    assert any(k.startswith("embeddings.s_a.weight/s_a.momentum1") for k in saved)   # Adagrad state travels too
    for rank, (loaded, moved) in enumerate(run_on_ranks(load_worker, dst[0], path, dst[1], timeout=120.0)):
        assert sorted(loaded) == sorted(saved)
        bad = [k for k in saved if not torch.equal(saved[k], loaded[k])]
        assert not bad, f"rank {rank}: not bit-exact: {bad}"
        assert moved > 1e-4


def state_dict_worker(rank, world):
    """Errors of load_state_dict from another plan's state dict and from plain tensors (the unsharded
    module's state dict), weights and optimizer state."""
    mesh = mesh_for(world, 1)
    plans = common.plans(world)
    a = shard(common.make_ec(seed=4), plans["mixed"], mesh=mesh, optimizer=common.ADAGRAD)
    common.train(a, rank, world, 1)
    want = full_state(a)
    b = shard(common.make_ec(seed=5), plans["mixed2"], mesh=mesh, optimizer=common.ADAGRAD)
    b.load_state_dict(a.state_dict())
    b.fused_optimizer.load_state_dict(a.fused_optimizer.state_dict())
    plain = common.make_ec(seed=7)
    plain.load_state_dict(common.full_weights(a))      # the unsharded module takes the same keys
    c = shard(common.make_ec(seed=8), plans["table_wise"], mesh=mesh)
    c.load_state_dict(plain.state_dict())
    errs = {"other plan": max((full_state(b)[k] - v).abs().max().item() for k, v in want.items()),
            "plain": common.max_diff(common.full_weights(c), common.full_weights(a))}
    common.train(a, rank, world, 1, first=1)
    common.train(b, rank, world, 1, first=1)
    errs["train on"] = common.max_diff(full_state(a), full_state(b))
    return errs, sorted(a.state_dict())


def test_state_dict_round_trip_into_another_plan():
    for errs, keys in run_on_ranks(state_dict_worker, 3, timeout=120.0):
        assert keys == [f"embeddings.{n}.weight" for n in sorted(common.NAMES)]
        assert errs["other plan"] == errs["plain"] == 0.0, errs     # copies are exact
        assert errs["train on"] < 1e-5, errs      # other plans sum repeated ids' gradients in another order


def reshard_worker(rank, world, pairs):
    """Per (from, to): max weight error vs the dense unsharded reference after 1 step on ``from``, a
    reshard to ``to`` (weights and Adagrad state move), then 2 more steps."""
    mesh = mesh_for(world, 1)
    ec = common.make_ec(seed=9)
    want = common.reference_train(ec, common.ADAGRAD, world, 3)
    plans = common.plans(world)
    out = {}
    for src, dst in pairs:
        mod = shard(ec, plans[src], mesh=mesh, optimizer=common.ADAGRAD)
        common.train(mod, rank, world, 1)
        stats = reshard(mod, plans[dst])
        assert stats.tables_moved, (src, dst)
        common.train(mod, rank, world, 2, first=1)
        assert {n: ps.sharding_type for n, ps in mod.sharding_plan().items()} == \
            {n: ps.sharding_type for n, ps in plans[dst].items()}
        out[(src, dst)] = common.max_diff(common.full_weights(mod), want)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_reshard_any_to_any_keeps_training_equal(world):
    names = ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed", "mixed2"]
    pairs = [(a, b) for a, b in zip(names, names[1:] + names[:1])] + [("mixed2", "column_wise")]
    for rank, errs in enumerate(run_on_ranks(reshard_worker, world, pairs, timeout=300.0)):
        assert len(errs) == len(pairs)
        bad = {k: v for k, v in errs.items() if v > 1e-5}
        assert not bad, f"rank {rank}: {bad}"


def digest_worker(rank, world):
    """Eager tables that differ across ranks raise on every rank; src_rank=0 broadcasts rank 0's;
    configs that differ across ranks raise before any routing is built."""
    from shardwise.embedding import EmbeddingCollection, EmbeddingConfig

    mesh = mesh_for(world, 1)
    plan = common.plans(world)["mixed"]
    out = {}
    try:
        shard(common.make_ec(seed=rank), plan, mesh=mesh)
    except ValueError as exc:
        out["differ"] = str(exc)
    sharded = shard(common.make_ec(seed=rank), plan, mesh=mesh, src_rank=0)
    out["broadcast"] = common.max_diff(common.full_weights(sharded), common.make_ec(seed=0).state_dict())
    rows = 12 if rank == 1 else 11
    cfgs = [EmbeddingConfig(rows if n == "s_a" else r, common.DIM, n, feature_names=list(fs)) for n, r, fs in common.TABLES]
    try:
        shard(EmbeddingCollection(cfgs), plan, mesh=mesh)
    except ValueError as exc:
        out["configs"] = str(exc)
    return out


def test_differing_replicas_raise_or_are_broadcast():
    results = run_on_ranks(digest_worker, 2, timeout=120.0)
    assert results[0] == results[1]
    out = results[0]
    assert "the unsharded tables differ across ranks" in out["differ"] and "'s_a' on ranks [1]" in out["differ"]
    assert out["broadcast"] == 0.0
    assert "ranks [1] were given other tables" in out["configs"]
