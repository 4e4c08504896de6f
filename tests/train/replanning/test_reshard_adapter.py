"""The job's live reshard on real ranks: measured load in, the reshard API applied (or refused) in place."""

import functools

import torch

from shardwise.embedding import (
    EmbeddingBagCollection, EmbeddingBagConfig, GreedyShardingPlanner, current_plan, row_wise, shard, table_wise,
)
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks
from shardwise.train.replanning.reshard import live_reshard


def _norm(plan, world):
    """row-wise ranks None means every rank: spell it out so plans compare by layout."""
    return {t: (ps.sharding_type, ps.ranks or tuple(range(world))) for t, ps in plan.items()}


def _held_bytes(sharded, world):
    """Ground truth from the module's real layout: fp32 weights + one Adagrad accumulator per element."""
    out = [0] * world
    for b in sharded.boxes():
        out[b.rank] += b.row_size * b.col_size * 4 * 2
    return out


def _skewed_run(rank, world, max_bytes_per_rank, budget=None):
    """Two row-wise 64-row tables whose ids all hit rows 0..7 (rank 0's block): rank 1 serves nothing."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="a", num_embeddings=64, embedding_dim=4, feature_names=["fa"]), EmbeddingBagConfig(name="b", num_embeddings=64, embedding_dim=4, feature_names=["fb"])])
    plan = {"a": row_wise(), "b": row_wise()}
    sharded = shard(ebc, plan, optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
    ids = torch.tensor([rank, 1, 2, 3, 4 + rank, 5, 6, 7])
    kjt = KeyedJaggedTensor(["fa", "fb"], ids, lengths=torch.tensor([1, 1, 2, 0, 1, 1, 1, 1]))
    for _ in range(3):
        sharded(kjt)
    stats = sharded.load_stats(reset=True)
    planner = None if budget is None else GreedyShardingPlanner(world, budget, batch_size_per_rank=4)
    res = live_reshard(sharded, stats, plan, max_bytes_moved=1 << 20, max_bytes_per_rank=max_bytes_per_rank,
                       planner=planner, tables=ebc.tables)
    out = sharded(kjt).values()
    return {"status": res.status, "reason": res.reason, "plan_is_module_plan": _norm(res.plan, world) == _norm(current_plan(sharded), world),
            "plan_unchanged": res.plan == plan, "changes": res.changes, "before": stats.per_rank(),
            "after": sharded.load_stats().per_rank(), "moved": res.stats.get("tables_moved"),
            "held": _held_bytes(sharded, world), "out": out, "want": ebc(kjt).values()}


def test_applies_the_proposal_in_place_and_lowers_the_measured_load():
    results = run_on_ranks(_skewed_run, 2, None)
    r0 = results[0]
    assert all({k: v for k, v in r.items() if k not in ("out", "want")} ==
               {k: v for k, v in r0.items() if k not in ("out", "want")} for r in results), "ranks disagree"
    assert r0["before"][1] == 0.0, r0["before"]
    assert r0["status"] == "applied" and r0["changes"] and r0["plan_is_module_plan"], r0
    assert sorted(r0["moved"]) == sorted(r0["changes"])
    assert max(r0["after"]) < max(r0["before"]), (r0["before"], r0["after"])
    for r in results:   # the forward after the reshard still matches the unsharded collection
        torch.testing.assert_close(r["out"], r["want"])


def test_a_refused_reshard_keeps_training_on_the_old_plan():
    # 2 KiB per table (weights + Adagrad state): any move puts 3 KiB on one rank, over a 2.5 KB limit
    results = run_on_ranks(_skewed_run, 2, 2500)
    for r in results:
        assert r["status"] == "failed" and "max_bytes_per_rank=2500" in r["reason"], r["reason"]
        assert r["plan_unchanged"] and r["plan_is_module_plan"]
        torch.testing.assert_close(r["out"], r["want"])


def test_the_rebalance_respects_a_memory_budget_per_rank():
    free = run_on_ranks(_skewed_run, 2, None)[0]
    assert max(free["held"]) > 2500, free["held"]   # unbounded, the proposal puts more than 2.5 KB on a rank
    results = run_on_ranks(_skewed_run, 2, None, 2500)
    r0 = results[0]
    for r in results:
        assert max(r["held"]) <= 2500, r["held"]
        assert r["status"] == r0["status"] and r["plan_is_module_plan"]
        torch.testing.assert_close(r["out"], r["want"])
    # the only move that helps (a table to rank 1) needs 3 KB there: nothing is moved, and the reason says why
    assert r0["status"] == "no-change" and r0["plan_unchanged"], r0
    assert "memory budget (rank 1 would hold 3,072 bytes of 2,500 bytes" in r0["reason"], r0["reason"]


def _four_tables_run(rank, world, budgets):
    """Four table-wise tables on rank 0, each asked for equally often; rank 1 may hold only ``budgets[1]``."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=n, num_embeddings=rows, embedding_dim=4, feature_names=[f"f{n}"])
                                  for n, rows in (("a", 128), ("b", 64), ("c", 64), ("d", 64))])
    plan = {n: table_wise(0) for n in "abcd"}
    sharded = shard(ebc, plan, optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
    kjt = KeyedJaggedTensor([f"f{n}" for n in "abcd"], torch.arange(8) + rank, lengths=torch.ones(8, dtype=torch.long))
    for _ in range(2):
        sharded(kjt)
    stats = sharded.load_stats(reset=True)
    planner = GreedyShardingPlanner(world, list(budgets), batch_size_per_rank=2)
    res = live_reshard(sharded, stats, plan, max_bytes_moved=1 << 20, planner=planner, tables=ebc.tables)
    out = sharded(kjt).values()
    return {"status": res.status, "reason": res.reason, "changes": sorted(res.changes), "before": stats.per_rank(),
            "after": sharded.load_stats().per_rank(), "held": _held_bytes(sharded, world), "out": out,
            "want": ebc(kjt).values()}


def test_a_proposal_over_the_budget_is_cut_to_the_moves_that_fit():
    free = run_on_ranks(_four_tables_run, 2, (1 << 20, 1 << 20))[0]
    assert free["status"] == "applied" and len(free["changes"]) >= 2 and free["held"][1] > 2048, free
    results = run_on_ranks(_four_tables_run, 2, (1 << 20, 2048))
    for r in results:
        torch.testing.assert_close(r["out"], r["want"])
    r0 = results[0]
    # one 64-row table (2 KiB with its Adagrad state) fits on rank 1: it moves, the rest of the proposal stays
    assert r0["status"] == "applied" and len(r0["changes"]) == 1 and r0["held"] == [6144 + 2048, 2048], r0
    assert max(r0["after"]) < max(r0["before"]) and "left out to stay within the memory budget" in r0["reason"]
