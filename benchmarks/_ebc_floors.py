"""The table-wise floors of benchmarks/ebc.py (shardwise interpreter): the local lookup + fused update
alone (no collectives), the all-to-alls alone, and the optimizer update alone against the floor of
reading and writing its touched rows once. Run through ``ebc.py`` (``--impl update``, or the floor
lines of a full run); not a script of its own."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ebc import LR, _set_update, make_batches, time_steps


def _tw_local_batches(rank, args):
    """What a table-wise rank looks up per step: every rank's bags of its own tables, ids offset into
    one stacked buffer (as its store holds them); and the per-destination message sizes."""
    mine = [i for i in range(args.tables) if i % args.world == rank]
    per_rank = [make_batches(r, args) for r in range(args.world)]
    local = []
    for step in range(len(per_rank[0])):
        ids, lens = [], []
        for k, i in enumerate(mine):
            for r in range(args.world):
                _, values, lengths = per_rank[r][step]
                ends = torch.cumsum(lengths, 0)
                lo = int(ends[i * args.batch - 1]) if i else 0
                hi = int(ends[(i + 1) * args.batch - 1])
                ids.append(values[lo:hi] + k * args.rows)
                lens.append(lengths[i * args.batch:(i + 1) * args.batch])
        lengths = torch.cat(lens)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        local.append((torch.cat(ids), offsets))
    return mine, per_rank, local


def run_floors(rank, args, plan_name):
    """Table-wise floors in the same run: the local lookup + fused update alone (no collectives) and
    the step's four all-to-alls alone (lengths, ids, pooled output, its gradient) at its byte counts."""
    import functools

    from shardwise.embedding.optim.row_update import store_compiles
    from shardwise.embedding.optim.rules import resolve_optimizer
    from shardwise.embedding.plan.values import ShardBox
    from shardwise.embedding.sharding.store import FusedLookup, ShardStore

    mine, per_rank, local = _tw_local_batches(rank, args)
    rule, hp = resolve_optimizer(functools.partial(torch.optim.Adagrad, lr=LR))
    boxes = [ShardBox(f"t{i}", rank, 0, args.rows, 0, args.dim) for i in mine]
    _set_update(args)
    # as shard() builds the store: the default has large stores call the compiled kernel themselves
    compiled = args.update == "compiled" or (args.update == "default" and
                                             store_compiles(rule, boxes, rank, "cpu", torch.float32))
    store = ShardStore(boxes, rank, lambda b, out: out.normal_(), "cpu", rule=rule, hp=hp, dtype=torch.float32,
                       compiled=compiled, grad_scale=1.0 / args.world)
    anchor = torch.zeros((), requires_grad=True)
    if plan_name == "update":
        return time_update(store, local, args)
    if plan_name == "kernel":
        def step(b):
            FusedLookup.apply(anchor, store, 0, b[0], b[1], None).sum().backward()
        return time_steps(step, local, args)
    owner = [i % args.world for i in range(args.tables)]
    sizes = []   # (send, recv) element counts per peer for lengths, ids, pooled output
    for step in range(len(local)):
        def count(src, dst, what):
            _, values, lengths = per_rank[src][step]
            feats = [i for i in range(args.tables) if owner[i] == dst]
            if what == "lengths":
                return len(feats) * args.batch
            if what == "ids":
                return int(sum(lengths[i * args.batch:(i + 1) * args.batch].sum() for i in feats))
            return len(feats) * args.batch * args.dim
        sizes.append({w: ([count(rank, d, w) for d in range(args.world)], [count(s, rank, w) for s in range(args.world)])
                      for w in ("lengths", "ids", "pooled")})

    def a2a(send, recv, dtype):
        out = torch.empty(sum(recv), dtype=dtype)
        dist.all_to_all_single(out, torch.zeros(sum(send), dtype=dtype), recv, send)

    def step(sz):
        a2a(*sz["lengths"], torch.int64)
        a2a(*sz["ids"], torch.int64)
        a2a(*reversed(sz["pooled"]), torch.float32)   # owners send each source its pooled rows
        a2a(*sz["pooled"], torch.float32)             # and get their gradient back
    return time_steps(step, sizes, args)


def time_update(store, local, args):
    """The optimizer update alone on a table-wise rank's touched rows and its floor, interleaved step
    by step in one process so load hits both alike: ``{"update": times, "floor_aten": times,
    "floor_compiled": times}``. ``update``: the store's update of each batch's unique rows from their
    summed gradients (``ShardStore.apply_gradient``); the floors: each touched row of the weight and
    of the Adagrad state read once and written back once, in cache-sized row blocks (ATen's gather +
    scatter, or one inductor loop per table adding a runtime zero in place)."""
    from shardwise.embedding.sharding.store import summed_row_gradients

    grads = []
    for ids, offsets in local:
        g = torch.randn(offsets.numel() - 1, args.dim, generator=torch.Generator().manual_seed(offsets.numel()))
        grads.append(summed_row_gradients(ids, offsets, None, g, store.buffers[0].shape[0]))
    tables = [store.buffers[0], *store.states[0].values()]
    block = 8192    # rows: 2 MiB of float32 x 64 per temporary, in L2
    touch, zero = torch.compile(_touch_rows, dynamic=True), torch.zeros((), dtype=torch.float32)

    def floor(rg, how):
        rows = rg[0]
        for a in range(0, rows.numel(), block):
            how(rows[a:a + block], *tables)
    compiled = lambda rows, *ts: touch(rows, zero, *ts)   # noqa: E731
    runs = {"update": lambda rg: store.apply_gradient(0, *rg), "floor_aten": lambda rg: floor(rg, _copy_rows),
            "floor_compiled": lambda rg: floor(rg, compiled)}
    for i in range(args.warmup):
        for fn in runs.values():
            fn(grads[i % len(grads)])
    dist.barrier()
    times: dict = {k: [] for k in runs}
    for i in range(args.iters):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn(grads[i % len(grads)])
            times[k].append((time.perf_counter() - t0) * 1e3)
    return times


def _copy_rows(rows, *tables):
    for t in tables:
        t.index_copy_(0, rows, t.index_select(0, rows))


def _touch_rows(rows, zero, *tables):
    """Each row of ``rows`` read and written in place once (adding ``zero``, a runtime 0.0 nothing can
    fold away): compiled, one loop per table, no temporary."""
    for t in tables:
        t.index_add_(0, rows, zero.expand(rows.numel(), *t.shape[1:]))
