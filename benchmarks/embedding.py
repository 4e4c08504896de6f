"""Row-wise sharded embedding lookup: shardwise vs PyTorch DTensor vs a hand-written lookup vs unsharded.

For each world size, table size and dim: a Shard(0) table, 4096 replicated ids, the output reduced to
Replicate (one all-reduce). ``fwd`` times the lookup + reduction; ``fwd_bwd`` adds the backward of a
fixed output gradient. The hand-written lookup masks ids outside the local rows, looks up the clamped
local ids, zeroes the masked rows by a 0/1 multiply and all-reduces (``dist.all_reduce``); it is the
floor for any row-wise scheme. ``unsharded`` is plain F.embedding on the whole table, timed on rank 0
alone. Medians (us per call) after a warm-up round, variants timed round-robin (rotating order) so
background load hits them alike; ratios between sharded variants are the median of per-round ratios
(paired: both timed in the same round), with the quartiles of the per-round ours/hand beside the
median (``ratio_ours/hand_quartiles``); one thread per rank; one JSON line per (config, mode). Each
line also carries every rank's peak RSS over the world's run (``peak_rss_mib_per_rank``) next to what
that rank must hold at most (``held_mib_per_rank``: its shard, the ids and the output gradient; rank 0
also the whole table of the unsharded baseline and its gradient).

    python benchmarks/embedding.py                  # worlds 2 and 4, V in {1e4, 1e6}, dim in {64, 128}
    python benchmarks/embedding.py --worlds 2 --rows 10000 --dims 64
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _launch import emit, interleaved, rss_per_rank, spawn  # noqa: E402


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; the gradient of a replicated result is already replicated (identity)."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _hand_lookup(weight, ids, start):
    rows = weight.shape[0]
    local = ids - start
    owned = (local >= 0) & (local < rows)
    out = F.embedding(local.clamp(0, max(rows - 1, 0)), weight) * owned.unsqueeze(-1)
    return _AllReduceSum.apply(out)


def _timing(v: int, mode: str) -> dict:
    # a small table's step is one all-reduce of a few ms whose time on loopback gloo varies 2x from
    # block to block (single rounds' ours/hand scatter 0.75-1.4 on a busy host; with 41 rounds the
    # median of one line still moved 0.86-1.14 between runs, while the main thread's CPU per call was
    # the same for both), so it gets many rounds; a big table's forward+backward (a full-size dense
    # gradient, hundreds of ms for PyTorch DTensor) gets fewer, to keep the default run to minutes
    if mode == "fwd" or v < 100_000:
        return dict(rounds=81, inner=10)
    return dict(rounds=21, inner=2)


def _paired_ratio(samples: dict, a: str, b: str) -> float:
    """Median over rounds of a/b timed in the same round: robust to load that drifts between rounds."""
    return statistics.median(x / y for x, y in zip(samples[a], samples[b]))


def _paired_quartiles(samples: dict, a: str, b: str) -> list:
    """[first, third] quartile of the per-round a/b: how far single rounds scatter around the median
    (a wide spread says the host was noisy and the median is weak evidence)."""
    q = statistics.quantiles([x / y for x, y in zip(samples[a], samples[b])], n=4)
    return [round(q[0], 3), round(q[2], 3)]


def _variants(rank, world, mesh, tmesh, v, d, n_ids):
    import torch.distributed.tensor as tdt

    import shardwise.tensor as sw
    from shardwise.tensor.spec import chunk_range

    start, rows = chunk_range(v, world, rank)
    local = torch.randn(rows, d, generator=torch.Generator().manual_seed(rank))
    ids = torch.randint(0, v, (n_ids,), generator=torch.Generator().manual_seed(0))
    grad = torch.randn(n_ids, d, generator=torch.Generator().manual_seed(1))
    ours_w = sw.DTensor.from_local(local, mesh, [sw.Shard(0)], shape=(v, d)).detach().requires_grad_()
    torch_w = tdt.DTensor.from_local(local, tmesh, [tdt.Shard(0)], shape=(v, d), stride=(d, 1))
    torch_w = torch_w.detach().requires_grad_()
    hand_w = local.clone().requires_grad_()

    def ours():
        return F.embedding(sw.DTensor.from_local(ids, mesh, [sw.Replicate()]), ours_w).full_tensor()

    def theirs():
        return F.embedding(tdt.DTensor.from_local(ids, tmesh, [tdt.Replicate()]), torch_w).full_tensor()

    def hand():
        return _hand_lookup(hand_w, ids, start)

    torch.testing.assert_close(ours(), hand())
    torch.testing.assert_close(theirs(), hand())
    return {"ours": (ours, ours_w), "torch_dtensor": (theirs, torch_w), "hand": (hand, hand_w)}, ids, grad


def _fwd_bwd(fn, weight, grad):
    def run():
        fn().backward(grad)
        weight.grad = None

    return run


def _bench_config(rank, world, mesh, tmesh, v, d, n_ids):
    variants, ids, grad = _variants(rank, world, mesh, tmesh, v, d, n_ids)
    with torch.no_grad():
        fwd, fwd_s = interleaved({k: fn for k, (fn, _) in variants.items()}, sync=dist.barrier,
                                  **_timing(v, "fwd"))
    bwd, bwd_s = interleaved({k: _fwd_bwd(fn, w, grad) for k, (fn, w) in variants.items()}, sync=dist.barrier,
                              **_timing(v, "fwd_bwd"))
    results = {"fwd": (fwd, fwd_s), "fwd_bwd": (bwd, bwd_s)}
    del variants
    gc.collect()
    if rank == 0:  # unsharded: the whole table on one rank, nobody to talk to
        table = torch.randn(v, d).requires_grad_()
        with torch.no_grad():
            fwd["unsharded"] = interleaved({"u": lambda: F.embedding(ids, table)}, **_timing(v, "fwd"))[0]["u"]
        bwd["unsharded"] = interleaved({"u": _fwd_bwd(lambda: F.embedding(ids, table), table, grad)},
                                        **_timing(v, "fwd_bwd"))[0]["u"]
        del table
    dist.barrier()
    rows = []
    for mode, (t, per_round) in results.items():
        row = {"bench": "embedding_rowwise", "mode": mode, "world": world, "num_embeddings": v, "dim": d,
               "ids": n_ids}
        row.update({f"{k}_us": round(x, 1) for k, x in t.items()})
        if rank == 0:
            row["ratio_ours/hand"] = round(_paired_ratio(per_round, "ours", "hand"), 3)
            row["ratio_ours/hand_quartiles"] = _paired_quartiles(per_round, "ours", "hand")
            row["ratio_ours/torch_dtensor"] = round(_paired_ratio(per_round, "ours", "torch_dtensor"), 3)
            row["ratio_ours/unsharded"] = round(t["ours"] / t["unsharded"], 3)
        rows.append(row)
    return rows


def _held_bytes(rank, world, v, d, n_ids) -> int:
    """What one config needs on ``rank``: its row block, the ids and the output gradient (rank 0 also
    times the unsharded table: the whole table and its dense gradient)."""
    from shardwise.tensor.spec import chunk_range

    held = chunk_range(v, world, rank)[1] * d * 4 + n_ids * 8 + n_ids * d * 4
    return held + (2 * v * d * 4 if rank == 0 else 0)


def _bench(rank, world, configs, n_ids):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    tmesh = mesh  # one DeviceMesh serves both libraries
    rows = []
    for v, d in configs:
        rows += _bench_config(rank, world, mesh, tmesh, v, d, n_ids)
    # peak RSS is the process's high-water mark, so it is compared with the largest config's needs
    rss = rss_per_rank(max(_held_bytes(rank, world, v, d, n_ids) for v, d in configs))
    return [{**row, **rss} for row in rows]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rows", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--ids", type=int, default=4096)
    args = ap.parse_args(argv)
    configs = [(v, d) for v in args.rows for d in args.dims]
    for world in args.worlds:
        for row in spawn(_bench, world, configs, args.ids):
            emit(row)


if __name__ == "__main__":
    main()
