"""Benchmark compile-mode data parallel against DDP, FSDP2 (eager and under ``torch.compile``) and one process.

MLP of 4 x Linear(1024, 1024), Adam (torch's default ``fused=None`` for every configuration but
``ddp_fused``: the for-loop on CPU for the peers, the fused kernel in our traced step, which runs it
when ``fused`` is not ``False``; ``ddp_fused`` is eager DDP with ``Adam(fused=True)``), batch 64 per rank, world 2 (gloo, CPU), ``torch.set_num_threads(1)`` per rank.  Each
configuration runs in fresh processes so peak RSS belongs to it alone.  Prints one JSON line per
configuration (median step time after warm-up, peak RSS, per-rank bytes of parameters + optimizer
state, collectives per step and the MiB they carry), then one line of ratios.  ``step_ms`` comes
from one process group running all distributed configurations round-robin (a shared CPU's load
drift then hits every configuration alike); ``step_ms_isolated`` and the memory figures from fresh
processes per configuration.  ``*_compile`` peers wrap the DDP / FSDP2 model in ``torch.compile``
(inductor; the optimizer step stays eager, as in their tutorials); their first steps compile, so they
get the warm-up.

Collectives are counted from the profiler's ``gloo:*`` events (the backend's own records, so DDP's
and FSDP2's C++ collectives count too; the benchmark's barriers are left out): ``collectives_per_step``
and ``collective_mib_per_step`` (the input bytes each rank hands to gloo).

    .venv/bin/python benchmarks/compile_dp.py [--steps 20] [--warmup 5] [--configs ddp,ours_replicate]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIM, LAYERS, BATCH = 1024, 4, 64
# ddp_fused: eager DDP with Adam(fused=True), the fused kernel our traced step runs by default (an extra
# line showing how much of the difference is the optimizer kernel)
KINDS = ("ddp", "ddp_compile", "ddp_fused", "fsdp2", "fsdp2_compile", "ours_replicate", "ours_fully_shard")


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(DIM, DIM), nn.ReLU())][:-1])


def step_fn(model, optimizer, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def _state_bytes(model, optimizer) -> int:
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    total = sum(local(p.detach() if not hasattr(p, "to_local") else p) for p in model.parameters())
    for st in optimizer.state.values():
        total += sum(local(v) for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


_TYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
               "unsigned char": 1, "bool": 1}


def count_collectives(call, steps: int = 3) -> dict:
    """Collectives per step and the MiB this rank hands to them, from the profiler's gloo events."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            call()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    calls, nbytes = 0, 0
    for ev in events:
        name = ev.get("name", "")
        if not name.startswith("gloo:") or name == "gloo:barrier":
            continue
        calls += 1
        args = ev.get("args", {})
        for dims, typ in zip(args.get("Input Dims", []), args.get("Input type", [])):
            n = 1
            for d in dims if isinstance(dims, list) else []:
                n *= d
            nbytes += n * _TYPE_BYTES.get(typ, 4)
    return {"collectives_per_step": round(calls / steps, 2), "collective_mib_per_step": round(nbytes / steps / 2**20, 3)}


def _build(kind, rank, world):
    model = make_model()
    if kind in ("ours_replicate", "ours_fully_shard"):
        from shardwise.compile import DataParallel, compile

        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        style = kind.split("_", 1)[1]
        # each rank passes its own slice, like DDP (mesh: every rank of the default group)
        step = compile(parallel_mode=DataParallel(style))(step_fn)
        return model, opt, step, False
    if kind.startswith("ddp"):
        model = nn.parallel.DistributedDataParallel(model)
    elif kind.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=kind.endswith("_fused") or None)
    if kind.endswith("_compile"):
        model = torch.compile(model)
    return model, opt, step_fn, False


def _worker(rank, world, kind, port, steps, warmup, queue):
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model, opt, step, global_batch = _build(kind, rank, world)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH * world, DIM, generator=g), torch.randn(BATCH * world, DIM, generator=g)
    if not global_batch:  # eager DDP/FSDP2 take this rank's slice
        x, y = x.chunk(world)[rank].contiguous(), y.chunk(world)[rank].contiguous()
    times = []
    for i in range(warmup + steps):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((rank, statistics.median(times[warmup:]), rss_mib, _state_bytes(model, opt)))
    if world > 1:
        dist.destroy_process_group()


def _interleaved_worker(rank, world, kinds, port, steps, warmup, queue):
    """All configs in the same processes, one step each per round: load drift hits all alike."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH * world, DIM, generator=g), torch.randn(BATCH * world, DIM, generator=g)
    xl, yl = x.chunk(world)[rank].contiguous(), y.chunk(world)[rank].contiguous()
    built = {k: _build(k, rank, world) for k in kinds}
    times = {k: [] for k in kinds}
    for i in range(warmup + steps):
        for k in kinds:
            model, opt, step, global_batch = built[k]
            dist.barrier()
            t0 = time.perf_counter()
            step(model, opt, *((x, y) if global_batch else (xl, yl)))
            times[k].append(time.perf_counter() - t0)
    counts = {}
    for k in kinds:
        model, opt, step, global_batch = built[k]
        counts[k] = count_collectives(lambda: step(model, opt, *((x, y) if global_batch else (xl, yl))))
    queue.put((rank, {k: statistics.median(v[warmup:]) for k, v in times.items()}, counts))
    dist.destroy_process_group()


def _spawn(target, world, *args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, *args[:1], port, *args[1:], queue)) for r in range(world)]
    for p in procs:
        p.start()
    res = sorted((queue.get(timeout=900) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join()
    return res


def run_interleaved(kinds, world, steps, warmup) -> tuple[dict, dict]:
    """Per config: the slowest rank's median step ms, and rank 0's collectives per step."""
    res = _spawn(_interleaved_worker, world, kinds, steps, warmup)
    return {k: round(1000 * max(r[1][k] for r in res), 2) for k in kinds}, res[0][2]


def run(kind, world, steps, warmup) -> dict:
    res = _spawn(_worker, world, kind, steps, warmup)
    return {
        "bench": "compile_dp", "config": kind, "world": world, "batch_per_rank": BATCH,
        "step_ms": round(1000 * max(r[1] for r in res), 2),
        "peak_rss_mib": round(max(r[2] for r in res), 1),
        "state_mib_per_rank": round(max(r[3] for r in res) / 2**20, 2),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--skip-isolated", action="store_true", help="round-robin timings and counts only (no RSS)")
    ap.add_argument("--configs", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    args = ap.parse_args()
    kinds = [k for k in args.configs.split(",") if k]
    # step time: all distributed configs interleaved in one process group (robust to load drift)
    timed, counts = run_interleaved(kinds, args.world, args.steps, args.warmup)
    out = {}
    for kind, world in [("single", 1)] + [(k, args.world) for k in kinds]:
        if args.skip_isolated:
            rec = {"bench": "compile_dp", "config": kind, "world": world, "batch_per_rank": BATCH}
            if kind == "single":
                continue
        else:  # memory (and an isolated step time) from fresh processes per configuration
            rec = run(kind, world, max(5, args.steps // 2), args.warmup)
            rec["step_ms_isolated"] = rec.pop("step_ms")
        rec["step_ms"] = timed.get(kind, rec.get("step_ms_isolated"))
        rec.update(counts.get(kind, {}))
        rec["load_avg_1m"] = round(os.getloadavg()[0], 2)
        out[kind] = rec
        print(json.dumps(rec), flush=True)
    pairs = {
        "replicate_vs_ddp_time": ("ours_replicate", "ddp", "step_ms"),
        "replicate_vs_ddp_compile_time": ("ours_replicate", "ddp_compile", "step_ms"),
        "replicate_vs_ddp_fused_adam_time": ("ours_replicate", "ddp_fused", "step_ms"),
        "fully_shard_vs_fsdp2_time": ("ours_fully_shard", "fsdp2", "step_ms"),
        "fully_shard_vs_fsdp2_compile_time": ("ours_fully_shard", "fsdp2_compile", "step_ms"),
        "replicate_vs_single_time": ("ours_replicate", "single", "step_ms"),
        "replicate_vs_ddp_rss": ("ours_replicate", "ddp", "peak_rss_mib"),
        "fully_shard_vs_fsdp2_rss": ("ours_fully_shard", "fsdp2", "peak_rss_mib"),
        "fully_shard_state_vs_replicate": ("ours_fully_shard", "ours_replicate", "state_mib_per_rank"),
    }
    ratios = {name: round(out[a][k] / out[b][k], 3) for name, (a, b, k) in pairs.items() if k in out.get(a, {}) and k in out.get(b, {})}
    print(json.dumps({"bench": "compile_dp", "config": "ratios", "load_avg_1m": os.getloadavg()[0], **ratios}),
          flush=True)


if __name__ == "__main__":
    main()
