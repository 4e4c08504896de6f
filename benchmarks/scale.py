"""Real scale: build a collection of 26 tables (>= 4 GB of fp32 weights) on the meta device, shard it
on 2 ranks with fused Adagrad, train 50 steps; print each rank's peak RSS next to what it must hold.

What a rank must hold is its shards plus their optimizer state (Adagrad: one fp32 accumulator per
weight); nothing the size of a whole table may be built. The goal: peak RSS <= 1.25 x (shards +
state) + 0.5 GB per rank. ``peak_rss`` is the process's VmHWM (the interpreter, torch and gloo
included), read after the 50 steps; ``build_s``/``shard_s``/``step_ms`` time each phase.

    .venv/bin/python benchmarks/scale.py                   # 26 tables, >= 4 GB of weights, dim 64
    .venv/bin/python benchmarks/scale.py --total-gb 1      # a smaller run
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import emit, peak_rss_bytes, spawn  # noqa: E402

GiB = 1 << 30


def table_sizes(total_bytes: int, dim: int, tables: int = 26) -> list[int]:
    """Table sizes spread log-uniformly (like Criteo's, tiny and huge interleaved) summing to at
    least ``total_bytes`` of fp32 weights."""
    shape = np.geomspace(8, 1.0, tables)[::-1]
    rows = np.maximum(8, np.ceil(shape / shape.sum() * total_bytes / (4 * dim))).astype(int)
    order = np.random.default_rng(0).permutation(tables)
    return [int(r) for r in rows[order]]


def run(rank, world, args):
    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, GreedyShardingPlanner, shard
    from shardwise.sparse import KeyedJaggedTensor

    sizes = table_sizes(int(args.total_gb * GiB), args.dim)
    cfgs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=args.dim, feature_names=[f"f{i}"]) for i, n in enumerate(sizes)]
    t0 = time.perf_counter()
    ebc = EmbeddingBagCollection(cfgs, device="meta")
    build = time.perf_counter() - t0
    planner = GreedyShardingPlanner(world, memory_per_rank_bytes=int(args.memory_gb * GiB),
                                       batch_size_per_rank=args.batch, ids_per_bag=args.ids_per_bag)
    plan = planner.plan(cfgs)
    t0 = time.perf_counter()
    sharded = shard(ebc, plan, optimizer=functools.partial(torch.optim.Adagrad, lr=0.01))
    dist.barrier()
    shard_s = time.perf_counter() - t0
    held = sum(b.numel() * b.element_size() for g in sharded._groups for b in g.store.buffers)
    held += sum(t.numel() * t.element_size() for g in sharded._groups for st in g.store.states for t in st.values())
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        lengths = torch.randint(0, 2 * int(args.ids_per_bag), (len(cfgs) * args.batch,), generator=g)
        values = torch.cat([torch.randint(0, n, (int(lengths[i * args.batch:(i + 1) * args.batch].sum()),),
                                          generator=g) for i, n in enumerate(sizes)])
        kjt = KeyedJaggedTensor([c.feature_names[0] for c in cfgs], values, lengths=lengths)
        t0 = time.perf_counter()
        sharded(kjt).values().square().mean().backward()
        times.append(time.perf_counter() - t0)
    mine = torch.tensor([peak_rss_bytes(), held], dtype=torch.int64)
    every = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(every, mine)
    return {"tables": len(cfgs), "dim": args.dim, "weights_gb": round(sum(sizes) * args.dim * 4 / GiB, 2),
            "largest_rows": max(sizes), "world": world, "optimizer": "Adagrad (fused)",
            "plan": sorted({ps.sharding_type.value for ps in plan.values()}),
            "peak_rss_gb": [round(int(e[0]) / GiB, 3) for e in every],
            "held_gb": [round(int(e[1]) / GiB, 3) for e in every],
            "goal_gb": [round((1.25 * int(e[1]) + 0.5 * GiB) / GiB, 3) for e in every],
            "ratio_to_goal": [round(int(e[0]) / (1.25 * int(e[1]) + 0.5 * GiB), 3) for e in every],
            "build_s": round(build, 3), "shard_s": round(shard_s, 2),
            "step_ms": round(float(np.median(times)) * 1e3, 1), "steps": args.steps}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-gb", type=float, default=4.0, help="fp32 weights in all tables")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--ids-per-bag", type=float, default=1.0)
    p.add_argument("--memory-gb", type=float, default=16.0, help="planner's per-rank budget")
    args = p.parse_args(argv)
    emit({"bench": "scale", **spawn(run, 2, args)})


if __name__ == "__main__":
    main()
