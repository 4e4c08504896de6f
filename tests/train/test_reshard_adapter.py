"""The job's live reshard on real ranks: measured load in, the reshard API applied (or refused) in place."""

import functools

import torch

from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, current_plan, row_wise, shard
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks
from shardwise.train.reshard import live_reshard


def _norm(plan, world):
    """row-wise ranks None means every rank: spell it out so plans compare by layout."""
    return {t: (ps.sharding_type, ps.ranks or tuple(range(world))) for t, ps in plan.items()}


def _skewed_run(rank, world, max_bytes_per_rank):
    """Two row-wise 64-row tables whose ids all hit rows 0..7 (rank 0's block): rank 1 serves nothing."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("a", 64, 4, ["fa"]), EmbeddingBagConfig("b", 64, 4, ["fb"])])
    plan = {"a": row_wise(), "b": row_wise()}
    sharded = shard(ebc, plan, optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
    ids = torch.tensor([rank, 1, 2, 3, 4 + rank, 5, 6, 7])
    kjt = KeyedJaggedTensor(["fa", "fb"], ids, lengths=torch.tensor([1, 1, 2, 0, 1, 1, 1, 1]))
    for _ in range(3):
        sharded(kjt)
    stats = sharded.load_stats(reset=True)
    res = live_reshard(sharded, stats, plan, max_bytes_moved=1 << 20, max_bytes_per_rank=max_bytes_per_rank)
    out = sharded(kjt).values()
    return {"status": res.status, "reason": res.reason, "plan_is_module_plan": _norm(res.plan, world) == _norm(current_plan(sharded), world),
            "plan_unchanged": res.plan == plan, "changes": res.changes, "before": stats.per_rank(),
            "after": sharded.load_stats().per_rank(), "moved": res.stats.get("tables_moved"),
            "out": out, "want": ebc(kjt).values()}


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
