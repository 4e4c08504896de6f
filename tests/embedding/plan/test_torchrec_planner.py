"""TorchRec's planner interface (Topology, ParameterConstraints, EmbeddingShardingPlanner, ShardingPlan)
against shardwise's GreedyShardingPlanner on the same tables (its ground truth), and collective_plan
on 2 ranks."""

import pytest
import torch

from shardwise.embedding import (
    EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, EmbeddingShardingPlanner,
    GreedyShardingPlanner, ParameterConstraints, ShardingPlan, ShardingType, Topology, table_wise,
)
from shardwise.testing import run_on_ranks

GIB = 2**30


def _ebc(prefix="t", rows=(100, 50000, 3000)):
    return EmbeddingBagCollection([EmbeddingBagConfig(r, 16, f"{prefix}{i}", feature_names=[f"{prefix}f{i}"])
                                   for i, r in enumerate(rows)], device="meta")


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sparse = torch.nn.ModuleDict({"ebc": _ebc()})
        self.seq = EmbeddingCollection([EmbeddingConfig(500, 16, "s0", feature_names=["sf"])], device="meta")
        self.over = torch.nn.Linear(4, 1)


class _Sharder:
    """A sharder as the planner reads one: sharding types per device (and the module type it takes)."""

    def __init__(self, types, module_type=None):
        self.types, self.module_type = types, module_type

    def sharding_types(self, compute_device_type):
        return list(self.types)


def test_topology_memory_and_hosts():
    assert Topology(world_size=2, compute_device="cpu").memory_per_rank == [128 * GIB] * 2
    assert Topology(world_size=2, compute_device="cuda", hbm_cap=GIB, ddr_cap=5).memory_per_rank == [GIB] * 2
    assert Topology(world_size=4, compute_device="cpu", local_world_size=2, intra_host_bw=1e9).local_world_size == 2
    for kwargs, match in (({"world_size": 0}, "world_size=0"), ({"compute_device": "mtia"}, "'mtia'"),
                          ({"local_world_size": 3}, "dividing"), ({"hbm_bw": 1}, "unknown arguments")):
        with pytest.raises((ValueError, TypeError), match=match):
            Topology(**{"world_size": 4, "compute_device": "cpu", **kwargs})


def test_plan_is_the_greedy_plan_keyed_by_module_path():
    model = _Model()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), batch_size=64).plan(model)
    assert isinstance(plan, ShardingPlan) and sorted(plan.plan) == ["seq", "sparse.ebc"]
    tables = model.sparse["ebc"].tables + model.seq.tables
    want = GreedyShardingPlanner(2, 128 * GIB, batch_size_per_rank=64, ids_per_bag=1.0).plan(tables)
    got = {**plan.plan["sparse.ebc"], **plan.plan["seq"]}
    assert got == want
    assert "module: sparse.ebc" in str(plan) and plan.get_plan_for_module("nowhere") is None


def test_constraints_and_pooling_factors_are_honoured():
    ebc = _ebc()
    topo = Topology(world_size=2, compute_device="cpu")
    constraints = {"t1": ParameterConstraints(sharding_types=["column_wise"], pooling_factors=[10.0, 30.0]),
                   "t0": ParameterConstraints(sharding_types=[ShardingType.ROW_WISE], compute_kernels=["fused"])}
    plan = EmbeddingShardingPlanner(topology=topo, constraints=constraints).plan(ebc).plan[""]
    assert plan["t1"].sharding_type == "column_wise" and plan["t0"].sharding_type == "row_wise"
    want = GreedyShardingPlanner(2, 128 * GIB, ids_per_bag={"t1": 20.0, None: 1.0},
                                 table_sharding_types={"t1": ["column_wise"], "t0": ["row_wise"]}).plan(ebc)
    assert dict(plan) == want


def test_sharders_choose_types_and_modules():
    model = _Model()
    only_tw = _Sharder(["table_wise", "table_column_wise"], module_type=EmbeddingBagCollection)
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=3, compute_device="cpu")).plan(model, [only_tw])
    assert list(plan.plan) == ["sparse.ebc"]                          # the EmbeddingCollection has no sharder
    assert {ps.sharding_type for ps in plan.plan["sparse.ebc"].values()} == {ShardingType.TABLE_WISE}
    clash = {"t0": ParameterConstraints(sharding_types=["row_wise"])}
    with pytest.raises(ValueError, match="nothing in common"):
        EmbeddingShardingPlanner(topology=Topology(world_size=3, compute_device="cpu"), constraints=clash).plan(
            model, [only_tw])


def test_tables_of_the_same_name_in_two_collections():
    model = torch.nn.ModuleDict({"a": _ebc(), "b": _ebc()})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(model)
    assert sorted(plan.plan["a"]) == sorted(plan.plan["b"]) == ["t0", "t1", "t2"]


@pytest.mark.parametrize("make, match", [
    (lambda: EmbeddingShardingPlanner(proposer=object()), "proposer"),
    (lambda: EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(
        _ebc(), [_Sharder(["table_wise"], module_type=EmbeddingCollection)]), "no sharder takes"),
    (lambda: EmbeddingShardingPlanner(constraints={"t0": ParameterConstraints(cache_params=1)}), "cache_params"),
    (lambda: EmbeddingShardingPlanner(constraints={"t0": ParameterConstraints(compute_kernels=["fused_uvm"])}),
     "one kernel"),
    (lambda: EmbeddingShardingPlanner(constraints={"t0": ParameterConstraints(sharding_types=["grid_shard"])}),
     "'grid_shard'"),
    (lambda: EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                      constraints={"nope": ParameterConstraints()}).plan(_ebc()), "nope"),
    (lambda: EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu", ddr_cap=1000)).plan(
        _ebc()), "Topology\\(hbm_cap= / ddr_cap=\\)"),
])
def test_refusals_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def _collective(rank, world, differ):
    constraints = {"t2": ParameterConstraints(sharding_types=["table_wise" if differ and rank else "row_wise"])}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       constraints=constraints)
    try:
        plan = planner.collective_plan(_ebc())
    except RuntimeError as e:
        return str(e)
    return {n: ps.sharding_type.value for n, ps in plan.plan[""].items()}


def test_collective_plan_agrees_or_fails_on_every_rank():
    same = run_on_ranks(_collective, 2, False)
    assert same[0] == same[1] and same[0]["t2"] == "row_wise"
    differ = run_on_ranks(_collective, 2, True)
    assert all("planned differently" in r for r in differ)
    assert table_wise(0).compute_kernel == "fused"


def test_plan_shape_as_torchrecs():
    """TorchRec 1.8's planner itself (its own interpreter; skipped with the reason when absent): the same
    module paths and tables, and each constrained table of the type asked."""
    import json
    from pathlib import Path

    from ...torchrec_peer import run_reference

    stdout = run_reference(Path(__file__).with_name("torchrec_plan_reference.py"))
    want = json.loads(stdout.strip().splitlines()[-1])
    constraints = {"t0": ParameterConstraints(sharding_types=["table_wise"]),
                   "t1": ParameterConstraints(sharding_types=["column_wise"]),
                   "t2": ParameterConstraints(sharding_types=["data_parallel"])}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints)
    model = torch.nn.Module()
    model.sparse = torch.nn.ModuleDict({"ebc": _ebc()})
    model.over = torch.nn.Linear(4, 1)
    for name, module in (("nested", model), ("root", _ebc())):
        got = {path: {t: ps.sharding_type.value for t, ps in per.items()}
               for path, per in planner.plan(module, [_Sharder([x.value for x in ShardingType])]).plan.items()}
        assert got == want[name], name
