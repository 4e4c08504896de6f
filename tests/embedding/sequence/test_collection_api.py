"""EmbeddingCollection's API (TorchRec's names, field order, output), its errors, the planner and
DistributedModelParallel on modules holding one, and gradient division's switch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardwise.embedding import (
    DataType, DistributedModelParallel, EmbeddingBagCollection, EmbeddingCollection, EmbeddingConfig,
    GreedyShardingPlanner, ShardedEmbeddingCollection, shard,
)
from shardwise.sparse import JaggedTensor, KeyedJaggedTensor
from shardwise.testing import run_on_ranks

from ..workers import mesh_for
from . import common, workers


def test_config_takes_torchrecs_positional_order():
    cfg = EmbeddingConfig(100, 8, "t", DataType.FP16, ["f", "g"], 0.5, 0.1)
    assert (cfg.num_embeddings, cfg.embedding_dim, cfg.name, cfg.data_type, cfg.feature_names,
            cfg.weight_init_max, cfg.weight_init_min) == (100, 8, "t", DataType.FP16, ("f", "g"), 0.5, 0.1)
    assert not hasattr(cfg, "pooling")      # TorchRec's EmbeddingConfig has none


def test_forward_is_f_embedding_per_id_in_input_order():
    ec = common.make_ec(seed=3)
    kjt = common.make_batch(5, 4, drop=("sb",), weighted=True)    # weights are ignored, as in TorchRec
    out = ec(kjt)
    assert list(out) == common.FEATURES                             # config order, whatever the input order
    table = {f: n for n, _, fs in common.TABLES for f in fs}
    for f in common.FEATURES:
        jt = out[f]
        assert isinstance(jt, JaggedTensor) and jt.weights_or_none() is None
        if f == "sb":                                                # absent: no ids, empty bags
            assert jt.values().shape == (0, common.DIM) and jt.lengths().tolist() == [0] * 4
            continue
        want = F.embedding(kjt[f].values(), ec.embeddings[table[f]].weight)
        assert torch.equal(jt.values(), want)
        assert torch.equal(jt.lengths(), kjt[f].lengths()) and torch.equal(jt.offsets(), kjt[f].offsets())
    assert ec.embedding_dim() == common.DIM and ec.embedding_names_by_table()[0] == ["sa1", "sa2"]
    assert sorted(ec.state_dict()) == sorted(f"embeddings.{n}.weight" for n in common.NAMES)


def test_meta_and_eager_builds_share_the_init():
    meta = common.make_ec(seed=4, device="meta")
    assert meta.is_meta and all(p.device.type == "meta" for p in meta.parameters())
    from shardwise.embedding import EmbeddingBagConfig
    from shardwise.embedding.collection.init import init_rows

    cfg = EmbeddingConfig(11, common.DIM, "s_a", feature_names=["sa1", "sa2"])
    bag = EmbeddingBagConfig(11, common.DIM, "s_a", feature_names=["sa1", "sa2"])
    # the bag collection's init path: same (seed, table, row) -> same values
    assert torch.equal(common.make_ec(seed=4).embeddings["s_a"].weight, init_rows(cfg, 4, 0, 11, 0, common.DIM))
    assert torch.equal(init_rows(cfg, 4, 0, 11, 0, common.DIM), init_rows(bag, 4, 0, 11, 0, common.DIM))


def test_bad_construction_is_refused_clearly():
    a = EmbeddingConfig(10, 4, "a", feature_names=["f"])
    with pytest.raises(ValueError, match=r"same embedding_dim .*'a': 4, 'b': 8"):
        EmbeddingCollection([a, EmbeddingConfig(10, 8, "b", feature_names=["g"])])
    with pytest.raises(ValueError, match="feature 'f' is used by tables 'a' and 'b'"):
        EmbeddingCollection([a, EmbeddingConfig(10, 4, "b", feature_names=["f"])])
    with pytest.raises(TypeError, match="tables must be EmbeddingConfig, got EmbeddingBagConfig"):
        from shardwise.embedding import EmbeddingBagConfig
        EmbeddingCollection([EmbeddingBagConfig(10, 4, "a", feature_names=["f"])])
    with pytest.raises(TypeError, match="tables must be EmbeddingBagConfig, got EmbeddingConfig"):
        EmbeddingBagCollection([a])
    with pytest.raises(TypeError, match="need_indices='yes' must be a bool"):
        EmbeddingCollection([a], need_indices="yes")
    with pytest.raises(ValueError, match=r"features \['nope'\] are not looked up"):
        EmbeddingCollection([a])(KeyedJaggedTensor(["nope"], torch.tensor([1]), lengths=torch.tensor([1])))


def test_planner_plans_a_collection_with_the_sequence_cost():
    ec = common.make_ec()
    planner = GreedyShardingPlanner(3, 2**20, batch_size_per_rank=4, ids_per_bag=2.0)
    plan = planner.plan(ec)
    assert sorted(plan) == sorted(common.NAMES)
    assert planner.plan(ec.tables) == plan
    # the same tables pooled: one row per bag comes back instead of one per id, so lookups cost less
    from shardwise.embedding import EmbeddingBagConfig, row_wise

    bags = [EmbeddingBagConfig(t.num_embeddings, t.embedding_dim, t.name, feature_names=t.feature_names)
            for t in ec.tables]
    rw = {n: row_wise() for n in common.NAMES}
    planner = GreedyShardingPlanner(3, 2**20, batch_size_per_rank=64, ids_per_bag=20.0)
    seq, pooled = planner.estimate(rw, ec.tables), planner.estimate(rw, bags)

    def variable(est):   # the per-shard part: the fixed per-group costs are the same for both
        return sum(est.cost) - sum(est.fixed)
    assert variable(seq) > variable(pooled) > 0


def bad_input_worker(rank, world):
    """A bad batch on one rank makes every rank raise the same ValueError before any lookup; the
    module still works and nothing was updated."""
    ec = common.make_ec(seed=0)
    sharded = shard(ec, common.plans(world)["mixed"], mesh=mesh_for(world, 1), optimizer=common.SGD)
    good = common.rank_batches(world, 0)[rank]
    unknown = KeyedJaggedTensor(["nope"], torch.tensor([1]), lengths=torch.tensor([1]))
    out_of_range = KeyedJaggedTensor(["sb"], torch.tensor([0, 7]), lengths=torch.tensor([2]))
    negative = KeyedJaggedTensor(["sc"], torch.tensor([-1]), lengths=torch.tensor([1]))
    before = common.full_weights(sharded)
    messages = []
    for bad_rank, bad in ((world - 1, unknown), (0, out_of_range), (1, negative), (0, "not a kjt")):
        try:
            sharded(bad if rank == bad_rank else good)
            messages.append(None)
        except ValueError as exc:
            messages.append(str(exc))
    untouched = common.max_diff(common.full_weights(sharded), before) == 0.0
    got, want = sharded(good), ec(good)
    err = max((got[f].values() - want[f].values()).abs().max().item() for f in want if want[f].values().numel())
    return messages, untouched, err


def test_bad_input_raises_the_same_error_on_every_rank():
    results = run_on_ranks(bad_input_worker, 3, timeout=120.0)
    messages = [m for m, _, _ in results]
    assert messages[0] == messages[1] == messages[2]
    unknown, out_of_range, negative, wrong_type = messages[0]
    assert "rank(s) [2]" in unknown and "features ['nope'] are not looked up" in unknown
    assert "rank(s) [0]" in out_of_range and "id 7 of feature 'sb' is outside its table's rows [0, 7)" in out_of_range
    assert "id -1 of feature 'sc'" in negative
    assert "TypeError: forward expects a KeyedJaggedTensor, got str" in wrong_type
    assert all(untouched and err < 1e-6 for _, untouched, err in results)


class Recommender(nn.Module):
    """A sequence tower (EmbeddingCollection) and a dense head, like a small sequential recommender."""

    def __init__(self):
        super().__init__()
        self.seq = common.make_ec(seed=11)
        torch.manual_seed(0)
        self.head = nn.Linear(common.DIM, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        out = self.seq(kjt)
        return self.head(torch.cat([out[f].values() for f in common.FEATURES])).squeeze(1)


def dmp_worker(rank, world, plan_kind):
    model = Recommender()
    ref = copy.deepcopy(model)
    plan = None if plan_kind == "planner" else common.plans(world)["mixed"]       # a flat {table: sharding} plan
    dmp = DistributedModelParallel(model, plan=plan, mesh=mesh_for(world, 1), optimizer=common.SGD)
    opt, ref_opt = common.SGD(dmp.parameters()), common.SGD(ref.parameters())
    for step in range(3):
        batches = common.rank_batches(world, step)
        opt.zero_grad()
        (dmp(batches[rank]) ** 2).sum().backward()
        opt.step()
        ref_opt.zero_grad()
        (sum((ref(b) ** 2).sum() for b in batches) / world).backward()
        ref_opt.step()
    sharded = dmp.sharded_modules["seq"]
    want = {f"embeddings.{n}.weight": ref.seq.embeddings[n].weight.detach() for n in common.NAMES}
    moved = common.max_diff(want, {k: v.detach() for k, v in Recommender().seq.state_dict().items()})
    head = max((a - b).abs().max().item() for a, b in zip(dmp.module.head.parameters(), ref.head.parameters()))
    return isinstance(sharded, ShardedEmbeddingCollection), common.max_diff(common.full_weights(sharded), want), \
        head, moved


@pytest.mark.parametrize("plan_kind", ["given", "planner"])
def test_dmp_shards_an_embedding_collection_and_trains_like_one_process(plan_kind):
    for is_sharded, err, head, moved in run_on_ranks(dmp_worker, 2, plan_kind, timeout=120.0):
        assert is_sharded and moved > 1e-3
        assert err < 1e-5 and head < 1e-5, (err, head)


def test_gradient_division_off_trains_on_the_summed_losses():
    plans = ["row_wise", "column_wise"]
    for errors in run_on_ranks(workers.train_all_plans, 2, 1, plans, [common.SGD], divided=False, timeout=120.0):
        for key, (err, moved) in errors.items():
            assert moved > 1e-3 and err < 1e-5, (key, err)


def test_table_row_wise_on_a_two_host_mesh():
    # the bag collection's two-level output dist does not apply to rows; the sequence dist serves it
    plans = ["table_row_wise", "mixed2"]
    for rank, errors in enumerate(run_on_ranks(workers.forward_all_plans, 4, 2, plans, timeout=120.0)):
        assert len(errors) == 4 and max(errors.values()) < 1e-6, (rank, errors)


def test_fx_keeps_the_collection_as_a_leaf():
    from shardwise.sparse import symbolic_trace

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq, self.lin = common.make_ec(seed=1), nn.Linear(common.DIM, 1)

        def forward(self, kjt):
            return self.lin(self.seq(kjt)["sa1"].values()).sum()

    model = Head()
    traced = symbolic_trace(model)
    assert [n.target for n in traced.graph.nodes if n.op == "call_module"] == ["seq", "lin"]
    kjt = common.make_batch(3, 4)
    assert torch.equal(traced(kjt), model(kjt))


def low_precision_worker(rank, world, dtype_name):
    """Max error of a sharded fp16/bf16 collection's rows vs the unsharded one's (same dtype), and the
    output dtype."""
    from shardwise.embedding import EmbeddingConfig as Cfg

    cfgs = [Cfg(rows, common.DIM, name, dtype_name, list(fs)) for name, rows, fs in common.TABLES]
    ec = EmbeddingCollection(cfgs, init_seed=3)
    sharded = shard(ec, common.plans(world)["mixed"], mesh=mesh_for(world, 1), optimizer=common.ADAGRAD)
    kjt = common.rank_batches(world, 0)[rank]
    got, want = sharded(kjt), ec(kjt)
    err = max((got[f].values().float() - want[f].values().float()).abs().max().item()
              for f in want if want[f].values().numel())
    common.loss_fn(got, 0, rank).backward()
    return err, str(got["sa1"].values().dtype)


@pytest.mark.parametrize("dtype_name, torch_dtype", [("FP16", "torch.float16"), ("BF16", "torch.bfloat16")])
def test_fp16_and_bf16_tables(dtype_name, torch_dtype):
    for err, dtype in run_on_ranks(low_precision_worker, 2, dtype_name, timeout=120.0):
        assert err == 0.0 and dtype == torch_dtype
