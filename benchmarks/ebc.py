"""Sharded embedding-bag step time: shardwise vs TorchRec vs the unsharded module (same run).

One step = forward + backward + optimizer update (Adagrad, fused into backward for the sharded
implementations, dense torch.optim.Adagrad for the unsharded module) on each rank's own batch.
Prints one JSON line per measurement and one per plan with the ratios. Every measurement line carries
each rank's peak RSS (``peak_rss_mib_per_rank``) next to what that rank must hold
(``held_mib_per_rank``: its table shards, their optimizer state and its batches).

    .venv/bin/python benchmarks/ebc.py                       # 8 tables x 100k x 64, world 2
    SHARDWISE_TORCHREC_PYTHON=TORCHREC_VENV/bin/python .venv/bin/python benchmarks/ebc.py
    .venv/bin/python benchmarks/ebc.py --thp 1      # both libraries' ranks on huge pages, as the job's workers
    .venv/bin/python benchmarks/ebc.py --impl update  # only the update-kernel line against its floor

The sharded step runs the library's default update (``--update default``: ``shard()`` as users call
it); ``--update compiled`` passes ``compile_optimizer=True``, ``--update eager`` never compiles. The
``update_kernel`` line times a table-wise rank's optimizer update alone next to its floor, reading and
writing each touched row of the weight and of the optimizer state once (``ratio_to_floor``).

TorchRec runs in its own interpreter (``--torchrec-python`` or $SHARDWISE_TORCHREC_PYTHON; build one
with ../shared/peers/torchrec-venv.sh); without one it is skipped with a message.
This file must import nothing from shardwise at module level: the TorchRec interpreter runs it too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import THP_ENV, rss_per_rank  # noqa: E402  (imports torch only: fine in TorchRec's interpreter)

PLANS = ("table_wise", "row_wise", "column_wise")
LR = 0.05


def make_batches(rank: int, args, count: int = 4):
    """(keys, values, lengths) batches of ~args.ids ids per bag, identical for every implementation."""
    g = torch.Generator().manual_seed(1234 + rank)
    keys = [f"f{i}" for i in range(args.tables)]
    out = []
    for _ in range(count):
        lengths = torch.randint(args.ids // 2, args.ids * 3 // 2 + 1, (args.tables * args.batch,), generator=g)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        out.append((keys, values, lengths))
    return out


def _chunks(n: int, parts: int) -> list[int]:
    """torch.chunk's sizes (both libraries split rows and columns this way)."""
    size = -(-n // parts)
    return [max(0, min(size, n - k * size)) for k in range(parts)]


def held_bytes(rank: int, args, impl: str, plan_name: str) -> int:
    """What ``rank`` must hold for this measurement: its table shards, their optimizer state (Adagrad:
    one fp32 per element) and its batches. The unsharded module holds every table, its dense
    gradient and its state; the table-wise floors hold every rank's batches."""
    table = args.rows * args.dim * 4
    batch = sum(v.numel() * 8 + ln.numel() * 8 for _, v, ln in make_batches(rank, args))
    if impl == "floor":
        mine = sum(1 for i in range(args.tables) if i % args.world == rank) if plan_name != "collectives" else 0
        return mine * table * 2 + batch * args.world
    if plan_name == "unsharded":
        return args.tables * table * 3 + batch
    if plan_name == "table_wise":
        elems = sum(args.rows * args.dim for i in range(args.tables) if i % args.world == rank)
    elif plan_name == "row_wise":
        elems = args.tables * _chunks(args.rows, args.world)[rank] * args.dim
    else:   # column_wise over ranks (i, i+1, ...): table i's column block k on rank (i + k) % world
        elems = sum(args.rows * _chunks(args.dim, args.world)[(rank - i) % args.world] for i in range(args.tables))
    return elems * 4 * 2 + batch


def time_steps(step, batches, args) -> list[float]:
    for i in range(args.warmup):   # the first steps also pay torch.compile where it is used
        step(batches[i % len(batches)])
    dist.barrier()
    times = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        step(batches[i % len(batches)])
        times.append((time.perf_counter() - t0) * 1e3)
    return times


# ---- shardwise ----------------------------------------------------------------------------------
def _shardwise_plan(name: str, world: int):
    """Table i's sharding, the same placements as the TorchRec run."""
    from shardwise.embedding import column_wise, row_wise, table_wise

    return {
        "table_wise": lambda i: table_wise(i % world),
        "row_wise": lambda i: row_wise(),
        "column_wise": lambda i: column_wise([(i + k) % world for k in range(world)]),
    }[name]


def run_shardwise(rank, args, plan_name):
    import functools

    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard
    from shardwise.sparse import KeyedJaggedTensor

    torch.manual_seed(0)
    cfgs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim, feature_names=[f"f{i}"]) for i in range(args.tables)]
    # sharded: built on the meta device, as the TorchRec run builds its module, so each rank
    # materialises only its shards (an eager build holds every whole table next to them: +195 MiB
    # of peak RSS per rank at the default shape that is the benchmark's, not the library's)
    ebc = EmbeddingBagCollection(cfgs, device=None if plan_name == "unsharded" else "meta")
    batches = [KeyedJaggedTensor(k, v, lengths=l) for k, v, l in make_batches(rank, args)]
    if plan_name == "unsharded":
        opt = torch.optim.Adagrad(ebc.parameters(), lr=LR)

        def step(kjt):
            opt.zero_grad()
            ebc(kjt).values().sum().backward()
            opt.step()
        return time_steps(step, batches, args)
    gen = _shardwise_plan(plan_name, args.world)
    plan = {c.name: gen(i) for i, c in enumerate(cfgs)}
    _set_update(args)
    extra = {"compile_optimizer": True} if args.update == "compiled" else {}
    sharded = shard(ebc, plan, optimizer=functools.partial(torch.optim.Adagrad, lr=LR), **extra)

    def step(kjt):
        sharded(kjt).values().sum().backward()
    return time_steps(step, batches, args)


def _set_update(args) -> None:
    """``--update eager``: this process's fused rules never compile (the library's default compiles
    its one-pass kernel on large calls and has large stores call it directly)."""
    if args.update == "eager":
        from shardwise.embedding.optim import row_update
        from shardwise.embedding.optim.rules import _RULES

        row_update.STORE_COMPILE_MIN_ELEMENTS = 2 ** 62
        for rule in _RULES.values():
            rule.update.compile_min_elements = None


# ---- TorchRec (runs in the TorchRec interpreter) -------------------------------------------------
def run_torchrec(rank, args, plan_name):
    import torchrec
    from torchrec.distributed.shard import shard as tr_shard
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, row_wise, table_wise
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    torch.manual_seed(0)
    cfgs = [torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows,
                                        feature_names=[f"f{i}"]) for i in range(args.tables)]
    ebc = torchrec.EmbeddingBagCollection(tables=cfgs, device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": LR})
    gen = {"table_wise": lambda i: table_wise(rank=i % args.world), "row_wise": lambda i: row_wise(),
           "column_wise": lambda i: column_wise(ranks=[(i + k) % args.world for k in range(args.world)])}[plan_name]
    plan = construct_module_sharding_plan(ebc, {f"t{i}": gen(i) for i in range(args.tables)},
                                          local_size=args.world, world_size=args.world, device_type="cpu")
    sharded = tr_shard(ebc, plan, env=ShardingEnv.from_process_group(dist.group.WORLD),
                       device=torch.device("cpu"))
    batches = [torchrec.KeyedJaggedTensor(keys=k, values=v, lengths=l) for k, v, l in make_batches(rank, args)]

    def step(kjt):
        sharded(kjt).values().sum().backward()
    return time_steps(step, batches, args)


# ---- process launch ------------------------------------------------------------------------------
def _worker(rank, args, impl, plan_name, init_file, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.world)
    try:
        if impl == "floor":   # shardwise interpreter only
            from _ebc_floors import run_floors as fn
        else:
            fn = run_torchrec if impl == "torchrec" else run_shardwise
        times = fn(rank, args, plan_name)
        rss = rss_per_rank(held_bytes(rank, args, impl, plan_name))   # a collective: every rank
        med = {k: statistics.median(v) for k, v in times.items()} if isinstance(times, dict) else statistics.median(times)
        queue.put((rank, med, rss))
    finally:
        dist.destroy_process_group()


def measure(args, impl: str, plan_name: str) -> tuple[float, dict]:
    """(median step time in ms: the slowest rank's median, every rank's peak RSS and held bytes)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_worker, args=(r, args, impl, plan_name, f"{tmp}/init", queue))
                 for r in range(args.world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"{impl}/{plan_name}: a rank failed (exit codes {[p.exitcode for p in procs]})")
    results = [queue.get() for _ in procs]
    if isinstance(results[0][1], dict):   # several timings: each the slowest rank's
        return {k: max(r[1][k] for r in results) for k in results[0][1]}, results[0][2]
    return max(ms for _, ms, _ in results), results[0][2]


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def torchrec_time(args, plan: str):
    """TorchRec's (median step time, RSS fields) for one plan (a subprocess in its own interpreter),
    or None."""
    python = args.torchrec_python or os.environ.get("SHARDWISE_TORCHREC_PYTHON")
    if not python or not os.path.exists(python):
        return None
    cmd = [python, __file__, "--impl", "torchrec"] + _common_flags(args, [plan])
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH="")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        print(f"# TorchRec run failed, skipped:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not recs:
        return None
    return recs[-1]["ms_median"], {k: v for k, v in recs[-1].items() if k.endswith("_per_rank")}


def _common_flags(args, plans) -> list[str]:
    return ["--world", str(args.world), "--tables", str(args.tables), "--rows", str(args.rows),
            "--dim", str(args.dim), "--batch", str(args.batch), "--ids", str(args.ids),
            "--iters", str(args.iters), "--warmup", str(args.warmup), "--plans", ",".join(plans)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--ids", type=int, default=20)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--plans", type=lambda s: s.split(","), default=list(PLANS))
    p.add_argument("--torchrec-python", default=None)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every implementation")
    p.add_argument("--update", choices=("default", "compiled", "eager"), default="default",
                   help="the fused update: the library's default (shard() as users call it: the compiled one-pass "
                        "kernel on large calls), compile_optimizer=True (the store compiles the kernel), or eager only")
    p.add_argument("--no-compile", action="store_true", help="the same as --update eager")
    p.add_argument("--impl", default="all", choices=["all", "torchrec", "shardwise", "update"],
                   help="update: only the update-kernel line (the table-wise rank's update against its floor)")
    p.add_argument("--no-floors", action="store_true",
                   help="skip the table-wise floors (local lookup + update alone, the all-to-alls alone)")
    p.add_argument("--thp", choices=("unset", "0", "1"), default="unset",
                   help="THP_MEM_ALLOC_ENABLE for every rank of both libraries (torch's allocator then puts "
                        "tensors of 2 MiB or more on huge pages; `shardwise train` starts its workers with 1)")
    args = p.parse_args(argv)
    if args.no_compile:
        args.update = "eager"
    if args.thp != "unset":   # this benchmark's own processes only; inherited by both libraries' ranks alike
        os.environ[THP_ENV] = args.thp
    shape = dict(world=args.world, tables=args.tables, rows=args.rows, dim=args.dim, batch=args.batch, ids=args.ids,
                 thp_mem_alloc_enable=os.environ.get(THP_ENV, "unset"))
    if args.impl == "torchrec":
        for plan in args.plans:
            ms, rss = measure(args, "torchrec", plan)
            _emit({"bench": "ebc", "impl": "torchrec", "plan": plan, "ms_median": round(ms, 2), **shape, **rss})
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")  # for spawned ranks
    python = args.torchrec_python or os.environ.get("SHARDWISE_TORCHREC_PYTHON")
    if args.impl == "all" and (not python or not os.path.exists(python)):
        print(f"# TorchRec skipped: no interpreter (pass --torchrec-python or set SHARDWISE_TORCHREC_PYTHON; "
              f"got {python!r})", file=sys.stderr)
    if args.impl == "update":
        report_update(args, shape)
        return
    ours, peer = run_rounds(args, shape)
    if args.impl == "shardwise":
        return
    report(args, shape, ours, peer)


def run_rounds(args, shape) -> tuple[dict, dict]:
    """Interleaved rounds (ours, then TorchRec, per plan) so other processes' load hits both alike."""
    ours: dict = {p: [] for p in args.plans}
    peer: dict = {p: [] for p in args.plans}
    for _ in range(args.rounds):
        for plan in args.plans:
            ms, rss = measure(args, "shardwise", plan)
            ours[plan].append(ms)
            _emit({"bench": "ebc", "impl": "shardwise", "plan": plan, "ms_median": round(ms, 2),
                   "update": args.update, **shape, **rss})
            if args.impl == "all":
                t = torchrec_time(args, plan)
                if t is not None:
                    peer[plan].append(t[0])
                    _emit({"bench": "ebc", "impl": "torchrec", "plan": plan, "ms_median": t[0], **shape, **t[1]})
    return ours, peer


def report_update(args, shape) -> None:
    """The table-wise rank's update alone against its floor (the touched rows of weight and state
    read and written once: the faster of the two copies), over ``args.rounds`` runs: one line."""
    runs = [measure(args, "floor", "update")[0] for _ in range(args.rounds)]
    u = statistics.median(r["update"] for r in runs)
    floors = {k: statistics.median(r[k] for r in runs) for k in ("floor_aten", "floor_compiled")}
    f = min(floors.values())
    _emit({"bench": "ebc", "impl": "update_kernel", "plan": "table_wise", "update": args.update,
           "update_ms": round(u, 2), "touched_rows_copy_floor_ms": round(f, 2), "ratio_to_floor": round(u / f, 3),
           **{f"{k}_ms": round(v, 2) for k, v in floors.items()}, "rounds": args.rounds, **shape})


def report(args, shape, ours: dict, peer: dict) -> None:
    unsharded, rss = measure(args, "shardwise", "unsharded")
    _emit({"bench": "ebc", "impl": "unsharded_dense_adagrad", "plan": "none", "ms_median": round(unsharded, 2),
           **shape, **rss})
    if "table_wise" in args.plans and not args.no_floors:
        for part in ("kernel", "collectives"):
            ms, rss = measure(args, "floor", part)
            _emit({"bench": "ebc", "impl": f"floor_table_wise_{part}", "plan": "table_wise",
                   "ms_median": round(ms, 2), "update": args.update, **shape, **rss})
        report_update(args, shape)
    for plan in args.plans:
        mine = statistics.median(ours[plan])
        rec = {"bench": "ebc", "plan": plan, "shardwise_ms": round(mine, 2), "unsharded_ms": round(unsharded, 2),
               "speedup_vs_unsharded": round(unsharded / mine, 2), "rounds": args.rounds}
        if peer[plan]:
            theirs = statistics.median(peer[plan])
            rec.update(torchrec_ms=round(theirs, 2), ratio_vs_torchrec=round(mine / theirs, 3))
        _emit(rec)


if __name__ == "__main__":
    main()
