"""The live-reshard adapter: says 'unavailable' without the API, merges changes and swaps modules with it."""


import pytest

import shardwise.embedding as emb
from shardwise.embedding import row_wise, table_wise
from shardwise.train import reshard as adapter


class _Sharded:
    def boxes(self):
        return []


def test_unavailable_without_the_api(monkeypatch):
    monkeypatch.delattr(emb, "reshard", raising=False)
    monkeypatch.delattr(emb, "propose_rebalance", raising=False)
    plan = {"t0": row_wise()}
    mod = _Sharded()
    res = adapter.live_reshard(mod, plan, {"t0": [(0, 9.0, 90.0)]}, max_bytes=1 << 20)
    assert res.status == "unavailable" and res.module is mod and res.plan == plan
    assert "reshard" in res.reason and "unavailable" in res.reason


@pytest.mark.parametrize("proposal, status", [({"t1": table_wise(0)}, "applied"), ({}, "no-change")])
def test_applies_the_proposal(monkeypatch, proposal, status):
    calls = {}
    new_module = _Sharded()

    def propose_rebalance(stats, max_bytes):
        calls["propose"] = (stats, max_bytes)
        return proposal

    def reshard(sharded, changes):
        calls["reshard"] = changes
        return new_module

    monkeypatch.setattr(emb, "propose_rebalance", propose_rebalance, raising=False)
    monkeypatch.setattr(emb, "reshard", reshard, raising=False)
    plan = {"t0": row_wise(), "t1": row_wise()}
    stats = {"t0": [(0, 5.0, 50.0), (1, 1.0, 10.0)]}
    res = adapter.live_reshard(_Sharded(), plan, stats, max_bytes=123)
    assert res.status == status and calls["propose"] == (stats, 123)
    if proposal:
        assert calls["reshard"] == proposal and res.module is new_module
        assert res.plan == {"t0": row_wise(), "t1": table_wise(0)}
    else:
        assert "reshard" not in calls and res.plan == plan




def test_a_refused_reshard_keeps_training_on_the_old_plan(monkeypatch):
    def reshard(sharded, changes):
        raise ValueError("t1 over max_bytes_per_rank")

    monkeypatch.setattr(emb, "propose_rebalance", lambda stats, max_bytes: {"t1": table_wise(0)}, raising=False)
    monkeypatch.setattr(emb, "reshard", reshard, raising=False)
    plan = {"t1": row_wise()}
    mod = _Sharded()
    res = adapter.live_reshard(mod, plan, {}, max_bytes=1)
    assert res.status == "failed" and res.module is mod and res.plan == plan
    assert "max_bytes_per_rank" in res.reason
