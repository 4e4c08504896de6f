"""Meta-built collections: each rank materialises only its shards, with values that are a pure
function of (init_seed, table, row) -- the same as an eager build under any plan or world size --
and eager builds whose tables differ across ranks never shard silently."""

from __future__ import annotations

import math

import pytest
import torch

from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard
from shardwise.embedding.checkpoint import load_sharded, save_sharded
from shardwise.embedding.collection.init import ROWS_PER_BLOCK, init_rows
from shardwise.testing import run_on_ranks

from . import common
from .reshard.test_reshard import full_state, train
from .workers import mesh_for


def test_init_is_a_pure_function_of_seed_table_and_row():
    t = EmbeddingBagConfig(name="t", num_embeddings=3 * ROWS_PER_BLOCK + 5, embedding_dim=6, feature_names=["f"])
    whole = init_rows(t, 7, 0, t.num_embeddings, 0, 6)
    bound = math.sqrt(1 / t.num_embeddings)
    assert whole.abs().max() <= bound and whole.std() > bound / 3   # TorchRec's default bound, used
    for r0, r1, c0, c1 in [(0, 1, 0, 6), (ROWS_PER_BLOCK - 3, 2 * ROWS_PER_BLOCK + 9, 2, 5), (t.num_embeddings - 4,
                                                                                            t.num_embeddings, 5, 6)]:
        assert torch.equal(init_rows(t, 7, r0, r1, c0, c1), whole[r0:r1, c0:c1])
    assert not torch.equal(init_rows(t, 8, 0, 10, 0, 6), whole[:10])           # the seed matters
    other = EmbeddingBagConfig(name="u", num_embeddings=t.num_embeddings, embedding_dim=6, feature_names=["g"])
    assert not torch.equal(init_rows(other, 7, 0, 10, 0, 6), whole[:10])       # so does the table name
    ranged = EmbeddingBagConfig(name="r", num_embeddings=100, embedding_dim=4, feature_names=["h"], weight_init_min=0.5, weight_init_max=0.75)
    vals = init_rows(ranged, 0, 0, 100, 0, 4)
    assert vals.min() >= 0.5 and vals.max() <= 0.75
    ebc = EmbeddingBagCollection([t, ranged], init_seed=7)
    assert torch.equal(ebc.embedding_bags["t"].weight, whole)
    meta = EmbeddingBagCollection([t, ranged], init_seed=7, device="meta")
    assert meta.is_meta and meta.embedding_bags["t"].weight.device.type == "meta"


def test_bad_init_settings_are_refused():
    with pytest.raises(ValueError, match="give both"):
        EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"], weight_init_min=0.1)
    with pytest.raises(ValueError, match="min <= max"):
        EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"], weight_init_min=0.2, weight_init_max=0.1)
    with pytest.raises(TypeError, match="init_fn"):
        EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"], init_fn=3)
    with pytest.raises(TypeError, match="init_seed"):
        EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])], init_seed="x")


def meta_under_plans(rank, world, plan_names):
    """Full weights of a meta-built collection sharded under each plan, and of the eager build."""
    mesh = mesh_for(world, 1)
    plans = common.plans(world, 1)
    eager = common.make_ebc(seed=21)
    out = {"eager": {k: v.clone() for k, v in eager.state_dict().items()}}
    for name in plan_names:
        sharded = shard(common.make_ebc(seed=21, device="meta"), plans[name], mesh=mesh, optimizer=common.ADAGRAD)
        out[name] = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
        kjt = common.rank_batches(world, 3, False)[rank]
        out[name + "/forward"] = (sharded(kjt).values() - eager(kjt).values()).abs().max().item()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_meta_collection_has_the_same_weights_under_any_plan(world):
    names = ["table_wise", "row_wise", "column_wise", "mixed"]
    for res in run_on_ranks(meta_under_plans, world, names, timeout=120.0):
        for name in names:
            assert sorted(res[name]) == sorted(res["eager"])
            assert all(torch.equal(res[name][k], res["eager"][k]) for k in res["eager"]), name
            assert res[name + "/forward"] < 1e-6


def init_fn_per_shard(rank, world):
    calls = []

    def scale(t):
        calls.append(tuple(t.shape))
        t.mul_(2.0)
    cfgs = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"], init_fn=scale)]
    sharded = shard(EmbeddingBagCollection(cfgs, device="meta", init_seed=3), {"t": common.row_wise()},
                    mesh=mesh_for(world, 1))
    want = 2.0 * init_rows(cfgs[0], 3, 0, 10, 0, 4)
    return calls, torch.equal(sharded.state_dict()["embedding_bags.t.weight"].full_tensor(), want)


def test_init_fn_is_applied_to_each_shard():
    results = run_on_ranks(init_fn_per_shard, 2, timeout=60.0)
    assert [r[0] for r in results] == [[(5, 4)], [(5, 4)]] and all(r[1] for r in results)


def differing_replicas(rank, world):
    mesh = mesh_for(world, 1)
    plan = {n: common.data_parallel() for n, *_ in common.TABLES}
    plan["t_b"] = common.table_wise(1)
    errors = []
    try:
        shard(common.make_ebc(seed=rank), plan, mesh=mesh)    # each rank seeded its own way
    except ValueError as exc:
        errors.append(str(exc))
    ebc = common.make_ebc(seed=30 + rank)
    sharded = shard(ebc, plan, mesh=mesh, src_rank=0)
    full = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    rank0 = common.make_ebc(seed=30).state_dict()
    return errors, all(torch.equal(full[k], rank0[k]) for k in rank0), \
        all(torch.equal(v, rank0[k]) for k, v in ebc.state_dict().items())


def test_differing_replicas_raise_or_are_broadcast():
    for errors, sharded_is_rank0, ebc_is_rank0 in run_on_ranks(differing_replicas, 2, timeout=60.0):
        assert len(errors) == 1 and "differ across ranks" in errors[0] and "'t_a' on ranks [1]" in errors[0]
        assert "src_rank=0" in errors[0]
        assert sharded_is_rank0 and ebc_is_rank0


def save_eager(rank, world, path):
    plans = common.plans(world, 1)
    mod = shard(common.make_ebc(seed=5), plans["mixed"], mesh=mesh_for(world, 1), optimizer=common.ADAGRAD)
    train(mod, rank, world, 2)
    save_sharded(path, mod)
    return {k: v.clone() for k, v in full_state(mod).items()}


def load_into_meta(rank, world, path):
    plans = common.plans(world, 1)
    mod = shard(common.make_ebc(seed=6, device="meta"), plans["row_wise"], mesh=mesh_for(world, 1),
                optimizer=common.ADAGRAD)
    load_sharded(path, mod)
    return {k: v.clone() for k, v in full_state(mod).items()}


def test_checkpoint_loads_into_a_meta_built_module_on_another_world_size(tmp_path):
    path = str(tmp_path / "ckpt")
    saved = run_on_ranks(save_eager, 2, path, timeout=120.0)[0]
    for res in run_on_ranks(load_into_meta, 3, path, timeout=120.0):
        assert sorted(res) == sorted(saved)
        assert all(torch.equal(saved[k], res[k]) for k in saved)


def _peak_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:    # resets VmHWM, the peak resident set
        f.write("5")


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def meta_memory(rank, world, rows):
    import gc
    gc.collect()
    cfgs = [EmbeddingBagConfig(name=f"big{i}", num_embeddings=rows, embedding_dim=64, feature_names=[f"f{i}"]) for i in range(4)]
    _peak_reset()
    base = _peak_kib()
    plan = {"big0": common.table_wise(0), "big1": common.table_wise(1), "big2": common.row_wise(),
            "big3": common.row_wise()}
    sharded = shard(EmbeddingBagCollection(cfgs, device="meta"), plan, mesh=mesh_for(world, 1))
    grew = (_peak_kib() - base) * 1024
    held = sum(b.numel() * b.element_size() for g in sharded._groups for b in g.store.buffers)
    del sharded
    gc.collect()
    return grew, held


def test_meta_collection_shards_without_building_full_tables():
    rows = 250_000                                     # 4 tables x 64 MB = 256 MB in all
    full = 4 * rows * 64 * 4
    for grew, held in run_on_ranks(meta_memory, 2, rows, timeout=120.0):
        assert held == full // 2
        assert grew < 0.5 * full + (32 << 20), (grew, full)   # its half, plus small temporaries
