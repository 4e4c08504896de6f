"""Checkpoints saved on N ranks under one plan load bit-exactly on M ranks under another plan."""

from __future__ import annotations

import functools

import pytest
import torch

from shardwise.embedding import column_wise, data_parallel, row_wise, shard, table_row_wise, table_wise
from shardwise.embedding.checkpoint import load_sharded, save_sharded
from shardwise.testing import run_on_ranks

from .. import common
from .test_reshard import full_state, train
from ..workers import mesh_for

ADAM = functools.partial(torch.optim.Adam, lr=0.05)
OPTS = {"adam": ADAM, "adagrad": common.ADAGRAD}


def _plan(name: str, world: int) -> dict:
    names = [n for n, *_ in common.TABLES]
    if name == "table_wise":
        return {n: table_wise(i % world) for i, n in enumerate(names)}
    if name == "row_wise":
        return {n: row_wise() for n in names}
    if name == "mixed":   # every type but the host one, with uneven shard counts
        return {names[0]: column_wise(list(range(world))[::-1]), names[1]: data_parallel(),
                names[2]: row_wise([world - 1, 0]), names[3]: table_row_wise(0)}
    return {n: column_wise([0, world - 1]) for n in names}


def save_worker(rank, world, path, plan_name, opt):
    mod = shard(common.make_ebc(seed=5), _plan(plan_name, world), mesh=mesh_for(world, 1), optimizer=OPTS[opt])
    train(mod, rank, world, 2)
    save_sharded(path, mod)
    return {k: v.clone() for k, v in full_state(mod).items()}


def load_worker(rank, world, path, plan_name, opt):
    # other initial weights, so a no-op load cannot pass
    mod = shard(common.make_ebc(seed=6), _plan(plan_name, world), mesh=mesh_for(world, 1), optimizer=OPTS[opt])
    before = full_state(mod)
    try:
        load_sharded(path, mod)
    except ValueError as exc:
        after = full_state(mod)
        return {"error": str(exc), "untouched": all(torch.equal(before[k], after[k]) for k in before)}
    loaded = {k: v.clone() for k, v in full_state(mod).items()}
    train(mod, rank, world, 1, first=2)   # the loaded module keeps training
    trained = full_state(mod)
    return {"state": loaded, "moved": max((trained[k].float() - loaded[k].float()).abs().max().item()
                                          for k in loaded)}


@pytest.mark.parametrize("src, dst, opt", [
    ((4, "table_wise"), (2, "row_wise"), "adam"),
    ((2, "mixed"), (3, "mixed"), "adagrad"),
    ((2, "row_wise"), (3, "column_wise"), "adam"),
])
def test_load_on_another_world_size_and_plan(tmp_path, src, dst, opt):
    path = str(tmp_path / "ckpt")
    saved = run_on_ranks(save_worker, src[0], path, src[1], opt, timeout=120.0)[0]
    results = run_on_ranks(load_worker, dst[0], path, dst[1], opt, timeout=120.0)
    for rank, res in enumerate(results):
        assert "error" not in res, res
        assert sorted(res["state"]) == sorted(saved)
        bad = [k for k in saved if not torch.equal(saved[k], res["state"][k])]
        assert not bad, f"rank {rank}: not bit-exact: {bad}"
        assert res["moved"] > 1e-4


def test_wrong_optimizer_is_refused_before_loading(tmp_path):
    path = str(tmp_path / "ckpt")
    run_on_ranks(save_worker, 2, path, "row_wise", "adagrad", timeout=120.0)
    results = run_on_ranks(load_worker, 2, path, "table_wise", "adam", timeout=120.0)
    assert results[0]["error"] == results[1]["error"] and "momentum2" in results[0]["error"]
    assert all(r["untouched"] for r in results)
