"""Soak: 2,000 training steps of a small demo-like model in one gloo worker.

The model has the demo's parts at toy size: a sharded EmbeddingBagCollection (row-wise, table-wise and
data-parallel tables, Adagrad fused into backward) feeding a tensor-parallel MLP (ColwiseParallel /
RowwiseParallel: DTensor dispatch, redistributes and SGD's foreach ops on every step). After warm-up,
resident memory must stay flat and no cache may keep growing: the DTensor propagation cache, the
fast-path cache and the redistribute planner's cache stop missing once every step looks the same.
One worker (world size 1) keeps it inside the suite's time budget on 2 cores; every collective of
the sharded collection and the tensor-parallel MLP still runs, through a 1-rank gloo group.
"""

import functools
import gc
import os
import time

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

STEPS, WARMUP, SAMPLE_EVERY, BATCH = 2000, 300, 100, 16
RSS_TOLERANCE = 0.05   # "flat": the allocator and interpreter settle within a few percent


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _model(world):
    from shardwise.embedding import (EmbeddingBagCollection, EmbeddingBagConfig, data_parallel, row_wise, shard,
                                     table_wise)
    from shardwise.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("ta", 200, 8, ["fa"]),
                                  EmbeddingBagConfig("tb", 50, 8, ["fb"], pooling="mean"),
                                  EmbeddingBagConfig("tc", 20, 8, ["fc"])])
    sparse = shard(ebc, {"ta": row_wise(), "tb": table_wise(world - 1), "tc": data_parallel()},
                   optimizer=functools.partial(torch.optim.Adagrad, lr=0.05))
    dense = torch.nn.Sequential(torch.nn.Linear(24 + 4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    parallelize_module(dense, worker_mesh((world,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return sparse, dense, torch.optim.SGD(dense.parameters(), lr=0.05)


def _batch(step):
    from shardwise.sparse import KeyedJaggedTensor

    # the same batch on every rank: the tensor-parallel MLP needs a replicated input
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (3 * BATCH,), generator=g)
    rows = torch.tensor([200, 50, 20]).repeat_interleave(BATCH).repeat_interleave(lengths)
    ids = (torch.rand(int(lengths.sum()), generator=g) * rows).long()
    kjt = KeyedJaggedTensor(["fa", "fb", "fc"], ids, lengths=lengths)
    dense_x = torch.randn(BATCH, 4, generator=g)
    return kjt, dense_x, (dense_x.sum(1) > 0).float()


def _caches():
    from shardwise.tensor import propagation_cache
    from shardwise.tensor.dtensor import _FASTPATH
    from shardwise.tensor.redistribute import plan_redistribute

    pc = propagation_cache()
    fast = getattr(_FASTPATH, "plans", {})
    return {"plans": len(pc.plans), "misses": pc.misses, "fastpath": len(fast),
            "redistribute": plan_redistribute.cache_info().currsize}


def _soak(rank, world, steps):
    sparse, dense, opt = _model(world)
    rss, caches, losses = [], {}, []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        kjt, x, y = _batch(step)
        pooled = sparse(kjt).values()
        logit = dense(torch.cat([pooled, x], dim=1)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logit, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
        if step % SAMPLE_EVERY == 0:
            gc.collect()
            rss.append((step, _rss_mb()))
            if step in (WARMUP, steps):
                caches[step] = _caches()
    return {"rss": rss, "caches": caches, "seconds": time.perf_counter() - start,
            "first_loss": sum(losses[:100]) / 100, "last_loss": sum(losses[-100:]) / 100}


@pytest.mark.slow
def test_soak_memory_flat_and_caches_bounded():
    results = run_on_ranks(_soak, 1, STEPS, timeout=600)
    for rank, r in enumerate(results):
        base = dict(r["rss"])[WARMUP]
        after = [mb for step, mb in r["rss"] if step >= WARMUP]
        assert max(after) <= base * (1 + RSS_TOLERANCE), f"rank {rank}: RSS grew after warm-up: {r['rss']}"
        warm, end = r["caches"][WARMUP], r["caches"][STEPS]
        assert warm["plans"] > 0 and warm["fastpath"] > 0, f"the soak model missed the DTensor paths: {warm}"
        assert warm == end, f"rank {rank}: caches kept growing after warm-up: {warm} -> {end}"
        assert r["last_loss"] < r["first_loss"], f"rank {rank}: the soak model did not train: {r}"
    print(f"\nsoak: {STEPS} steps, {results[0]['seconds']:.1f} s; RSS MB per rank "
          f"(step {WARMUP} -> {STEPS}): " + ", ".join(
              f"{dict(r['rss'])[WARMUP]:.1f} -> {dict(r['rss'])[STEPS]:.1f}" for r in results)
          + f"; caches {results[0]['caches'][STEPS]}")
