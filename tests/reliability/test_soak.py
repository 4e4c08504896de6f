"""Soaks: 2,000 training steps, resident memory flat after warm-up, every cache bounded.

* ``test_demo_soak_...``: the demo job itself (``shardwise train``'s ``Trainer.run``: the DLRM model
  with 26 sharded tables, the compiled data-parallel dense step, the loss and AUC log) at toy
  sizes in one gloo worker, sampled through the loop's per-step fault hook.
* ``test_soak_...``: a small model built to hit the DTensor paths the demo does not (a tensor-parallel
  MLP: dispatch, redistributes and SGD's foreach ops every step) on a sharded EmbeddingBagCollection.

After warm-up resident memory must stay flat and no cache may keep growing: the DTensor propagation
cache, the fast-path cache, the redistribute planner's cache, the compiled step's traces and the
synthetic data's block cache stop missing once every step looks the same. One worker (world size 1)
keeps both inside the suite's time budget on 2 cores; every collective still runs, through a 1-rank
gloo group.
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
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="ta", num_embeddings=200, embedding_dim=8, feature_names=["fa"]),
                                  EmbeddingBagConfig(name="tb", num_embeddings=50, embedding_dim=8, feature_names=["fb"], pooling="mean"),
                                  EmbeddingBagConfig(name="tc", num_embeddings=20, embedding_dim=8, feature_names=["fc"])])
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


def _demo_soak(rank, world, steps):
    import tempfile

    from shardwise.train import checkpoint as ckpt
    from shardwise.train.config import TrainConfig
    from shardwise.train.loop import Trainer

    # compile-mode dense (not the DDP default): the soak watches its traces and the DTensor caches too
    cfg = TrainConfig(steps=steps, batch_size=32, rows=1000, dim=8, checkpoint_every=0, reshard_at=0,
                      eval_rows=256, quiet=True, out=tempfile.mkdtemp(prefix="soak-"), dense_parallel="compile")
    trainer = Trainer(cfg, worker_mesh((world,)))
    rss, caches, blocks = [], {}, []
    real = ckpt.fault_point

    def sample(kind, step):   # the loop calls this after every step: a hook that needs no change to it
        real(kind, step)
        if step % SAMPLE_EVERY == 0:
            gc.collect()
            rss.append((step, _rss_mb()))
            if step in (WARMUP, steps):
                caches[step] = {**_caches(), "compiled_traces": trainer.dense._step.traces}
            # the data walks forward (a new 256-example sub-block every 8 steps): bounded, not constant
            blocks.append((step, len(trainer.data._cache)))
    ckpt.fault_point = sample
    start = time.perf_counter()
    try:
        metrics = trainer.run()
    finally:
        ckpt.fault_point = real
    return {"rss": rss, "caches": caches, "seconds": time.perf_counter() - start,
            "first_loss": metrics["loss"]["first"], "last_loss": metrics["loss"]["last"],
            "steps": metrics["steps"], "data_blocks": blocks}


def _check_flat(results, name):
    for rank, r in enumerate(results):
        base = dict(r["rss"])[WARMUP]
        after = [mb for step, mb in r["rss"] if step >= WARMUP]
        assert max(after) <= base * (1 + RSS_TOLERANCE), f"{name} rank {rank}: RSS grew after warm-up: {r['rss']}"
        warm, end = r["caches"][WARMUP], r["caches"][STEPS]
        assert warm["plans"] > 0 and warm["fastpath"] > 0, f"{name}: the model missed the DTensor paths: {warm}"
        assert warm == end, f"{name} rank {rank}: caches kept growing after warm-up: {warm} -> {end}"
        assert r["last_loss"] < r["first_loss"], f"{name} rank {rank}: the model did not train: {r}"
    r = results[0]
    print(f"\n{name}: {STEPS} steps, {r['seconds']:.1f} s; RSS MB per rank (step {WARMUP} -> {STEPS}): "
          + ", ".join(f"{dict(x['rss'])[WARMUP]:.1f} -> {dict(x['rss'])[STEPS]:.1f} (max "
                      f"{max(mb for s, mb in x['rss'] if s >= WARMUP):.1f})" for x in results)
          + f"; caches {r['caches'][STEPS]}; loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")


@pytest.mark.slow
def test_demo_soak_memory_flat_and_caches_bounded():
    results = run_on_ranks(_demo_soak, 1, STEPS, timeout=600)
    assert results[0]["steps"] == STEPS
    assert results[0]["caches"][STEPS]["compiled_traces"] == 1, "the dense step was traced more than once"
    r = results[0]
    full_at = min((step for step, n in r["data_blocks"] if n == 9), default=None)
    assert full_at and max(n for _, n in r["data_blocks"]) == 9, f"data block cache not bounded at 9: {r['data_blocks']}"
    # until then each new ~70 KB sub-block is expected growth (and the allocator settles for a further ~200
    # steps, the evicted blocks' memory being reused); from then on nothing may grow
    settled = [mb for step, mb in r["rss"] if step >= full_at + 200]
    assert len(settled) >= 4, f"the data cache filled too late to watch RSS afterwards: step {full_at}"
    assert max(settled) <= settled[0] * 1.01, f"RSS grew after the data cache filled (step {full_at}): {r['rss']}"
    _check_flat(results, "demo soak")
    print(f"demo soak: data block cache full at step {full_at}; RSS from step {full_at + 200}: {settled[0]:.1f} -> "
          f"{settled[-1]:.1f} MB; samples {[(s, round(mb, 1)) for s, mb in r['rss']]}")


@pytest.mark.slow
def test_soak_memory_flat_and_caches_bounded():
    results = run_on_ranks(_soak, 1, STEPS, timeout=600)
    _check_flat(results, "tensor-parallel soak")


def _caches_under_new_shapes(rank, world, cap, shapes):
    """Ops on ever-new shapes (each a new cache key) with the caps lowered to ``cap``: sizes seen."""
    from shardwise.tensor import Replicate, Shard, distribute_tensor, propagation_cache
    from shardwise.tensor.dtensor import _FASTPATH
    from shardwise.tensor.redistribute import plan_redistribute

    pc = propagation_cache()
    saved = pc.max_size, _FASTPATH.max_size
    pc.max_size = _FASTPATH.max_size = cap
    # start empty: a pooled worker keeps earlier tests' entries, and eviction only holds the size
    pc.clear()
    _FASTPATH.plans.clear()
    sizes = []
    try:
        mesh = worker_mesh((world,))
        for n in range(1, shapes + 1):
            x = distribute_tensor(torch.ones(n, 3), mesh, [Shard(0)])
            with torch.no_grad():   # the fast path records only calls that need no autograd
                y = (x * 2 + 1).sum(0)
            y.redistribute(mesh, [Replicate()])
            torch.relu(x.detach().requires_grad_())  # recorded by autograd: the dispatcher's quick map
            sizes.append((len(pc.plans), len(_FASTPATH.plans), len(pc.quick)))
    finally:
        pc.max_size, _FASTPATH.max_size = saved
    return {"sizes": sizes, "redistribute_maxsize": plan_redistribute.cache_info().maxsize}


def test_dtensor_caches_stay_within_their_caps_under_ever_new_shapes():
    # a job whose shapes never repeat must not grow the caches without bound: they evict at their cap
    # (lowered here to 16 so a few dozen shapes reach it; the real caps are 8192 / 8192 / 4096; the
    # propagation cache's quick map shares its cap)
    r = run_on_ranks(_caches_under_new_shapes, 1, 16, 60, timeout=120)[0]
    assert all(max(s[i] for s in r["sizes"]) == 16 for i in range(3)), r["sizes"]
    assert r["sizes"][-1] == (16, 16, 16)
    assert r["redistribute_maxsize"] == 4096
