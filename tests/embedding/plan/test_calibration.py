"""The planner's calibrated cost model: rank 0's measurements broadcast, plans deterministic given a
calibration, data-parallel only where the model prefers it, never estimated slower than all table-wise."""

import math

import pytest
import torch

from shardwise.embedding import (
    Calibration, EmbeddingBagConfig, GreedyShardingPlanner, ShardingType, calibrate, table_wise,
)
from shardwise.testing import run_on_ranks, worker_mesh

_FIGS = ("lookup_s_per_call", "lookup_s_per_id", "lookup_s_per_byte", "all_to_all_s_per_byte",
         "all_to_all_s_per_message", "all_reduce_s_per_byte", "all_reduce_s_per_message")

# all-reduces nearly free, all-to-all bytes dear: replicating tiny tables beats routing their ids
CHEAP_ALL_REDUCE = dict(lookup_s_per_call=1e-6, lookup_s_per_id=1e-9, lookup_s_per_byte=1e-12,
                        all_to_all_s_per_byte=1e-8, all_to_all_s_per_message=1e-6,
                        all_reduce_s_per_byte=1e-15, all_reduce_s_per_message=1e-9)
# an all-reduce costs a tenth of a second: no table should be replicated
DEAR_ALL_REDUCE = {**CHEAP_ALL_REDUCE, "all_reduce_s_per_message": 0.1}


def _tables():
    # 8 tiny tables and 2 large ones, one id per bag
    sizes = [100] * 8 + [200_000, 100_000]
    return [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=16, feature_names=[f"f{i}"])
            for i, n in enumerate(sizes)]


def _planner(cal, world=2, memory=2**30, **kw):
    return GreedyShardingPlanner(world, memory, batch_size_per_rank=256, ids_per_bag=1.0,
                                    calibration=Calibration(**cal) if isinstance(cal, dict) else cal, **kw)


def _types(plan):
    return {ps.sharding_type for ps in plan.values()}


def _all_table_wise_estimate(cal, tables, world=2, **kw):
    tw = _planner(cal, world, sharding_types=[ShardingType.TABLE_WISE], **kw)
    return max(tw.estimate(tw.plan(tables), tables).cost)


@pytest.mark.parametrize("cal, replicated", [(CHEAP_ALL_REDUCE, True), (DEAR_ALL_REDUCE, False)])
def test_tiny_tables_go_data_parallel_only_where_the_model_prefers_it(cal, replicated):
    tables = _tables()
    planner = _planner(cal)
    plan = planner.plan(tables)
    dp = [n for n, ps in plan.items() if ps.sharding_type == ShardingType.DATA_PARALLEL]
    assert dp == ([f"t{i}" for i in range(8)] if replicated else []), plan
    # the chosen plan is never estimated slower than the all-table-wise one, under either calibration
    assert max(planner.estimate(plan, tables).cost) <= _all_table_wise_estimate(cal, tables) + 1e-15


def test_estimate_is_the_sum_of_the_models_terms():
    # one table-wise table on rank 0 of 2, everything but the all-to-all per byte zero: the estimate
    # is exactly the bytes the model says rank 0 moves (ids + lengths in, pooled blocks out and their
    # gradients back; half of each stays on the rank)
    figs = {k: 0.0 for k in _FIGS}
    figs["all_to_all_s_per_byte"] = 1.0
    t = EmbeddingBagConfig(name="t", num_embeddings=1000, embedding_dim=16, feature_names=["a", "b"])
    est = _planner(figs).estimate({"t": table_wise(0)}, [t])
    bags = 256 * 2 * 2                                          # batch x world x features
    want = ((bags * 1.0 + bags) * 8 + 2 * bags * 16 * 4) * 0.5
    assert est.cost == [pytest.approx(want), 0.0]


@pytest.mark.parametrize("world", [8, 64, 128])
def test_plans_at_scale_are_deterministic_given_a_calibration(world):
    sizes = [round(100 * (40_000_000 / 100) ** (i / 25)) for i in range(26)]
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=128, feature_names=[f"f{i}"])
              for i, n in enumerate(sizes)]
    cal = Calibration(**CHEAP_ALL_REDUCE, source="a test's figures")
    again = Calibration.from_json(cal.to_json())                # as a metrics.json hands it to another process
    kw = dict(memory=80 * 2**30, ranks_per_host=8)
    a = _planner(cal, world, **kw).plan(tables)
    b = _planner(again, world, **kw).plan(tables)
    assert a == b
    p = _planner(cal, world, **kw)
    assert max(p.estimate(a, tables).cost) <= _all_table_wise_estimate(cal, tables, world, **kw) + 1e-12


def test_calibration_json_and_errors():
    cal = Calibration.nominal()
    assert Calibration.from_json(cal.to_json()) == cal
    assert Calibration.from_json({"calibration": cal.to_json(), "steps": 3}) == cal   # a metrics.json
    with pytest.raises(ValueError, match=r"a calibration needs the fields .*all_reduce_s_per_message"):
        Calibration.from_json({"lookup_s_per_id": 1.0})
    with pytest.raises(ValueError, match=r"Calibration.all_to_all_s_per_byte=-1.0 must be a finite number >= 0"):
        Calibration(**{**CHEAP_ALL_REDUCE, "all_to_all_s_per_byte": -1.0})
    with pytest.raises(TypeError, match="calibration=.* must be a Calibration"):
        GreedyShardingPlanner(2, 2**30, calibration=CHEAP_ALL_REDUCE)


def calibrate_and_plan(rank, world):
    """Rank r's local measurement is made to differ (rank 0: cheap all-reduce; others: dear); every
    rank must still plan from rank 0's figures. Then a real micro-benchmark, broadcast the same way."""
    mesh = worker_mesh((world,))
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    mine = CHEAP_ALL_REDUCE if rank == 0 else DEAR_ALL_REDUCE
    cal = calibrate(device, measure=lambda: mine)
    plan = _planner(cal, world).plan(_tables())
    real = calibrate(device)
    # a recorded calibration: each rank is handed a different one (hosts reading different files), and
    # every rank still plans from rank 0's copy, cross-host factor included
    given = Calibration(**(CHEAP_ALL_REDUCE if rank == 0 else DEAR_ALL_REDUCE), cross_host_factor=float(10 + rank),
                        source=f"file on rank {rank}")
    return cal, plan, real, calibrate(device, given=given)


def test_calibration_broadcast_makes_every_rank_plan_alike():
    out = run_on_ranks(calibrate_and_plan, 2)
    (cal0, plan0, real0, given0), (cal1, plan1, real1, given1) = out
    assert given0 == given1 and given0.cross_host_factor == 10.0 and given0.source.startswith("given (file on rank 0)")
    assert {k: getattr(given0, k) for k in _FIGS} == pytest.approx(CHEAP_ALL_REDUCE, rel=1e-12)
    assert cal0 == cal1 and {k: getattr(cal0, k) for k in _FIGS} == pytest.approx(CHEAP_ALL_REDUCE, rel=1e-12)
    assert plan0 == plan1 and ShardingType.DATA_PARALLEL in _types(plan0)
    # what rank 1 would have planned from its own figures: the broadcast is what made them agree
    assert _planner(DEAR_ALL_REDUCE).plan(_tables()) != plan0
    # the real micro-benchmark: one set of finite, non-negative figures on both ranks, recorded as rank 0's
    assert real0 == real1 and real0.world_size == 2 and "rank 0" in real0.source
    assert all(math.isfinite(getattr(real0, k)) and getattr(real0, k) >= 0 for k in _FIGS)
    assert real0.lookup_s_per_call > 0 and real0.all_to_all_s_per_message > 0   # measured directly, never clamped
