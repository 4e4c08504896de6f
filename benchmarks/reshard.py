"""Live reshard cost: bytes moved and wall time of typical moves, vs the floor and vs TorchRec.

Each move goes A -> B and back B -> A (so every repetition starts from the same layout); the time
of one direction is the median over repetitions after a warm-up round trip. The floor is one raw
``all_to_all_single`` with exactly the per-rank byte counts our reshard sent (weights + Adagrad
state) between preallocated buffers, measured in the same processes right after each reshard.
TorchRec 1.8's ``reshard`` runs in its own interpreter on the moves it supports (table- and
column-wise placement changes); it is skipped with a message where none is installed.

Our ranks run once per value of ``--thp`` (default ``0,1``: one line each, ``thp_mem_alloc_enable``):
``THP_MEM_ALLOC_ENABLE`` in the environment they start with, so torch's CPU allocator gives tensors
of 2 MiB or more huge pages (``1``) or not (``0``), as ``shardwise train`` does by default. The floors
run in the same processes, under the same setting. TorchRec runs once per move, without it.

``first_ms`` is the first reshard of the process (the one users meet: a job reshards rarely), and
``first_floor_fresh_ms`` the first ``all_to_all_single`` of the same sizes into a newly allocated
buffer; ``first_ratio`` divides them. ``transient_bytes``: the most bytes of message buffers the move
held at once on rank 0 (beyond the new shards themselves).

``ms`` is the median over both directions, ``ms_each_way`` per direction. ``ratio_vs_floor`` divides
the medians; ``ratio_vs_floor_paired`` is the median of each reshard's time over the floor measured
right after it (load from other jobs that comes and goes then cancels out). ``cpu_ms`` and
``floor_cpu_ms``: CPU seconds of rank 0's process (all its threads, gloo's included) for one reshard
and for the floor. With as many ranks as cores the wire is CPU-bound, so every copy a move needs
beyond the transfer (packing column slices, moving kept rows into another layout, staging receives
that land where a send still reads) shows up one for one in the wall time.

Two more references, measured in the same processes after each reshard, bound what the floor
leaves out: ``alloc_ms`` writes once the most bytes any rank's rebuilt stores had to put in new
memory (``bytes_reused_allocated``: taken-over vs new bytes; a layout change must allocate, and a
fresh page's first touch costs about as much as its bytes on the wire), and ``copy_ms`` copies the
bytes a rank sends once, warm to warm (a swap that lands in the memory it leaves stages every send).
``ratio_vs_floor_plus_alloc_paired`` / ``ratio_vs_floor_plus_copy_paired`` divide by floor + each.
``alloc_over_floor_paired`` is ``alloc_ms`` in floors (``first_alloc_over_first_fresh`` the same for the
first reshard): a move that must write that new memory takes about 1 + it times the floor at the least
(less only by the floor's own writes of the received bytes, which land in warm memory).

Memory, over the first reshard (the peak-RSS count restarts after the module is built and the
unsharded tables are freed, ``peak_rss_reset``; the floors' buffers come later):
``peak_rss_mib_per_rank`` next to ``rss_before_mib_per_rank`` (interpreter, torch, gloo and the
shards before the first reshard), ``held_mib_per_rank`` (the rank's shards, weights + state, in the
larger of the two layouts) and ``held_during_reshard_mib_per_rank`` (that plus the new memory of
the rebuilt stores and the message buffers: what the first reshard must hold at its peak).

    .venv/bin/python benchmarks/reshard.py                     # 8 tables x 100k x 64 fp32, world 2
    .venv/bin/python benchmarks/reshard.py --torchrec-python TORCHREC_VENV/bin/python

This file imports nothing from shardwise at module level: the TorchRec interpreter runs it too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import THP_ENV, emit, gather_ints, rss_bytes, rss_per_rank, spawn  # noqa: E402

MOVES = ("tw_swap_all", "tw_swap", "cw_swap", "tw_to_rw_all", "tw_to_rw", "rw_to_cw")
TORCHREC_MOVES = ("tw_swap_all", "tw_swap", "cw_swap")


def plans(move: str, tables: int):
    """(plan A, plan B) as {table index: (kind, ranks)}; half the tables move, the rest stay
    (``tw_swap_all``: every table changes rank, so no kept table is copied locally; ``tw_to_rw_all``:
    every table goes row-wise, a layout change whose new stores can take over the old memory)."""
    a, b = {}, {}
    for i in range(tables):
        if move == "tw_swap_all":
            a[i], b[i] = ("tw", (i % 2,)), ("tw", ((i + 1) % 2,))
        elif move == "tw_swap":
            a[i], b[i] = ("tw", (i % 2,)), ("tw", ((i + 1) % 2,) if i < tables // 2 else (i % 2,))
        elif move == "cw_swap":
            a[i], b[i] = ("cw", (0, 1)), (("cw", (1, 0)) if i < tables // 2 else ("cw", (0, 1)))
        elif move == "tw_to_rw_all":   # every table: each rank holds as many rows after as before
            a[i], b[i] = ("tw", (i % 2,)), ("rw", (0, 1))
        elif move == "tw_to_rw":
            a[i], b[i] = ("tw", (i % 2,)), (("rw", (0, 1)) if i < tables // 2 else ("tw", (i % 2,)))
        else:
            a[i], b[i] = ("rw", (0, 1)), (("cw", (0, 1)) if i < tables // 2 else ("rw", (0, 1)))
    return a, b


def _ours_plan(p: dict) -> dict:
    from shardwise.embedding import column_wise, row_wise, table_wise

    make = {"tw": lambda r: table_wise(r[0]), "rw": row_wise, "cw": column_wise}
    return {f"t{i}": make[k](r) for i, (k, r) in p.items()}


class _Floor:
    """One raw ``all_to_all_single`` carrying exactly ``matrix[src][dst]`` bytes (fp32) per rank, with
    preallocated buffers; ``fresh``: into a newly allocated receive buffer each time (a reshard's new
    shards are new memory too: on CPU that is first-touch page faults)."""

    def __init__(self, matrix: list, rank: int):
        world = len(matrix)
        self.splits_in = [matrix[rank][d] // 4 for d in range(world)]
        self.splits_out = [matrix[s][rank] // 4 for s in range(world)]
        self.send, self.out = torch.ones(sum(self.splits_in)), torch.empty(sum(self.splits_out))
        # the first all_to_all of these sizes, into a fresh receive buffer: the peer of a first reshard
        self.first = self.run(True)[0]
        self.run(False)   # warm: the floor's buffers have been written once, as a reshard's old shards have
        self.staged = torch.empty_like(self.send).copy_(self.send)

    def copy(self) -> float:
        """Wall seconds of one local copy of the bytes this rank sends, warm to warm: what staging
        every send costs when the received rows land in the memory they leave (a swap in place)."""
        dist.barrier()
        t0 = time.perf_counter()
        self.staged.copy_(self.send)
        dist.barrier()
        return time.perf_counter() - t0

    @staticmethod
    def touch(nbytes: int) -> float:
        """Wall seconds to allocate ``nbytes`` and write each byte once (first-touch page faults): what
        the new stores a reshard cannot place in old memory cost at the least, on top of the wire."""
        dist.barrier()
        t0 = time.perf_counter()
        torch.empty(nbytes, dtype=torch.uint8).fill_(1)
        dist.barrier()
        return time.perf_counter() - t0

    def run(self, fresh: bool) -> tuple:
        """(wall seconds, this process's CPU seconds, all its threads)."""
        out = torch.empty(sum(self.splits_out)) if fresh else self.out
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        dist.all_to_all_single(out, self.send, self.splits_out, self.splits_in)
        dist.barrier()
        return time.perf_counter() - t0, time.process_time() - c0


def all_gather_max(n: int) -> int:
    t = torch.tensor([n])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def store_bytes(mod) -> int:
    """Bytes of this rank's shards: weights and every optimizer-state tensor of its stores."""
    return sum(t.numel() * t.element_size() for g in mod._groups for w in range(len(g.store.widths))
               for t in (g.store.buffers[w], *g.store.states[w].values()))


def reset_peak_rss() -> bool:
    """Restart this process's peak-RSS count (Linux ``clear_refs``), so the peak is the reshard's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _sharded(args, move: str) -> tuple:
    """The tables sharded under ``move``'s plan A (Adagrad), and the changes A -> B and B -> A."""
    import functools

    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard

    torch.manual_seed(0)
    cfgs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim,
                               feature_names=[f"f{i}"]) for i in range(args.tables)]
    a, b = (_ours_plan(p) for p in plans(move, args.tables))
    mod = shard(EmbeddingBagCollection(cfgs), a, optimizer=functools.partial(torch.optim.Adagrad, lr=0.01))
    return mod, [{k: v for k, v in b.items() if v != a[k]}, {k: a[k] for k, v in b.items() if v != a[k]}]


def run_ours(rank, world, args, move):
    import faulthandler

    faulthandler.enable()   # a native abort in a rank prints the Python stack it happened under

    from shardwise.embedding import reshard

    mod, changes = _sharded(args, move)
    gc.collect()                       # the unsharded tables shard() copied from
    base, reset, held_a = rss_bytes(), reset_peak_rss(), store_bytes(mod)   # the peak from here: the reshard
    dist.barrier()
    t0 = time.perf_counter()
    stats = reshard(mod, changes[0])   # the first reshard of the process: the one users meet
    dist.barrier()
    first = time.perf_counter() - t0
    # memory of the first reshard, before the floors' buffers exist
    held = max(held_a, store_bytes(mod))
    during = held_a + stats.bytes_allocated + stats.transient_bytes
    rss = rss_per_rank(held)
    every = gather_ints(base, during)
    rss.update(peak_rss_reset=reset, rss_before_mib_per_rank=[round(b / (1 << 20), 1) for b, _ in every],
               held_during_reshard_mib_per_rank=[round(d / (1 << 20), 1) for _, d in every])
    floor = _Floor(stats.bytes_matrix, rank)
    most = all_gather_max(stats.bytes_allocated)
    first_touch = _Floor.touch(most) if most else 0.0   # the first reshard's new-memory bytes, written once
    reshard(mod, changes[1])           # the rest of the warm-up round trip
    times, cpu, floors, floor_cpu, fresh, touch, split, copies = [], [], [], [], [], [], [], []
    for i in range(2 * args.reps):
        # each reshard is followed by the floor in the same seconds: on a shared machine, load that
        # comes and goes then hits both alike
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        done = reshard(mod, changes[i % 2])
        dist.barrier()
        times.append(time.perf_counter() - t0)
        split.append((done.bytes_reused, done.bytes_allocated))
        cpu.append(time.process_time() - c0)
        wall, used = floor.run(False)
        floors.append(wall)
        floor_cpu.append(used)
        fresh.append(floor.run(True)[0])
        # the alloc floor: the largest new-memory bytes of any rank (all ranks wait for the slowest)
        most = all_gather_max(done.bytes_allocated)
        touch.append(_Floor.touch(most) if most else 0.0)
        copies.append(floor.copy())
    ms = lambda xs: statistics.median(xs) * 1e3   # noqa: E731
    return {"ms": ms(times), "ms_each_way": [round(ms(times[0::2]), 1), round(ms(times[1::2]), 1)],
            "cpu_ms": ms(cpu), "floor_ms": ms(floors), "floor_cpu_ms": ms(floor_cpu),
            "paired": statistics.median(t / f for t, f in zip(times, floors)),
            "floor_fresh_ms": ms(fresh), "bytes_sent": stats.bytes_sent,
            "touch_ms": ms(touch), "first_touch_ms": first_touch * 1e3, "copy_ms": ms(copies),
            "paired_copy": statistics.median(t / (f + c) for t, f, c in zip(times, floors, copies)),
            "paired_alloc": statistics.median(t / (f + a) for t, f, a in zip(times, floors, touch)),
            "alloc_over_floor": statistics.median(a / f for f, a in zip(floors, touch)),
            "bytes_reused": split[-2:], "first_split": [stats.bytes_reused, stats.bytes_allocated],
            "first_ms": first * 1e3, "first_floor_ms": floor.first * 1e3, "transient_bytes": stats.transient_bytes,
            "tables_moved": len(stats.tables_moved), "rss": rss}


def run_torch_dtensor(rank, world, args, move):
    """PyTorch DTensor's redistribute of the same tensors for ``rw_to_cw``: every moved table's weight
    and Adagrad state, ``Shard(0)`` -> ``Shard(1)`` and back (the same bytes cross the wire)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    rows = args.rows // world
    moved = sum(1 for k, _ in plans(move, args.tables)[1].values() if k == "cw")
    tensors = [DTensor.from_local(torch.randn(rows, args.dim), mesh, [Shard(0)], run_check=False)
               for _ in range(2 * moved)]
    targets, times = ([Shard(1)], [Shard(0)]), []
    for i in range(2 * (args.reps + 1)):
        dist.barrier()
        t0 = time.perf_counter()
        tensors = [t.redistribute(mesh, targets[i % 2]) for t in tensors]
        for t in tensors:     # a functional collective may still be in flight: reading waits for it
            t.to_local()[0, 0].item()
        dist.barrier()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return {"ms": statistics.median(times) * 1e3}


# ---- TorchRec (runs in the TorchRec interpreter) -------------------------------------------------
def run_torchrec(rank, world, args, move):
    import torchrec
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.shard import shard as tr_shard
    from torchrec.distributed.sharding.dynamic_sharding import output_sharding_plan_delta_single
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    torch.manual_seed(0)
    cfgs = [torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows,
                                        feature_names=[f"f{i}"]) for i in range(args.tables)]
    ebc = torchrec.EmbeddingBagCollection(tables=cfgs, device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.01})
    make = {"tw": lambda r: table_wise(rank=r[0]), "cw": lambda r: column_wise(ranks=list(r))}

    def tr_plan(p):
        return construct_module_sharding_plan(ebc, {f"t{i}": make[k](r) for i, (k, r) in p.items()},
                                              local_size=world, world_size=world, device_type="cpu")
    a, b = (tr_plan(p) for p in plans(move, args.tables))
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharder = EmbeddingBagCollectionSharder()
    sharded = tr_shard(ebc, a, env=env, device=torch.device("cpu"), sharder=sharder)
    deltas = [output_sharding_plan_delta_single(a, b)[1], output_sharding_plan_delta_single(b, a)[1]]
    times = []
    for i in range(2 * (args.reps + 1)):
        dist.barrier()
        t0 = time.perf_counter()
        sharded = sharder.reshard(sharded, deltas[i % 2], env, torch.device("cpu"))
        dist.barrier()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return {"ms": statistics.median(times) * 1e3}


def torchrec_ms(args, move: str):
    """TorchRec's median reshard time (its own interpreter, PYTHONHASHSEED=0), or (None, why)."""
    python = args.torchrec_python or os.environ.get("SHARDWISE_TORCHREC_PYTHON")
    if not python or not os.path.exists(python):
        return None, "no TorchRec interpreter (pass --torchrec-python or set SHARDWISE_TORCHREC_PYTHON)"
    cmd = [python, os.path.abspath(__file__), "--impl", "torchrec", "--moves", move, "--tables", str(args.tables),
           "--rows", str(args.rows), "--dim", str(args.dim), "--reps", str(args.reps)]
    env = {k: v for k, v in os.environ.items() if k != THP_ENV}   # TorchRec as its users run it
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, PYTHONHASHSEED="0", PYTHONPATH=""))
    if proc.returncode:
        return None, "TorchRec run failed: " + proc.stderr.strip().splitlines()[-1][:300]
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return recs[-1]["ms"], ""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--moves", default=",".join(MOVES))
    p.add_argument("--torchrec-python", default=None)
    p.add_argument("--impl", default="all", choices=["all", "torchrec"])
    p.add_argument("--thp", default="0,1", help=f"values of {THP_ENV} to start our ranks with, one line each "
                                                 "(default %(default)s; TorchRec runs once per move, unset)")
    args = p.parse_args(argv)
    moves = args.moves.split(",")
    shape = {"tables": args.tables, "rows": args.rows, "dim": args.dim, "dtype": "fp32", "world": 2,
             "optimizer": "Adagrad"}
    if args.impl == "torchrec":
        for move in moves:
            emit({"bench": "reshard", "impl": "torchrec", "move": move, **spawn(run_torchrec, 2, args, move)})
        return
    user_thp = os.environ.get(THP_ENV)
    for move in moves:
        theirs, why = torchrec_ms(args, move) if move in TORCHREC_MOVES else (None, "")
        if why:
            print(f"# TorchRec skipped for {move}: {why}", file=sys.stderr)
        for thp in args.thp.split(","):
            # read by torch's allocator when a rank starts: the spawned ranks inherit it
            os.environ[THP_ENV] = thp
            emit(_line(args, move, thp, shape, theirs))
        os.environ.pop(THP_ENV) if user_thp is None else os.environ.update({THP_ENV: user_thp})


def _line(args, move: str, thp: str, shape: dict, torchrec: Optional[float]) -> dict:
    """One JSON line: our reshard of ``move`` with ranks started under THP_MEM_ALLOC_ENABLE=``thp``."""
    ours = spawn(run_ours, 2, args, move)
    rec = {"bench": "reshard", "move": move, **shape, "thp_mem_alloc_enable": thp,
           "bytes_sent_per_rank": ours["bytes_sent"],
           "tables_moved": ours["tables_moved"], "ms": round(ours["ms"], 1), "ms_each_way": ours["ms_each_way"],
           "floor_ms": round(ours["floor_ms"], 1), "ratio_vs_floor": round(ours["ms"] / ours["floor_ms"], 3),
           "ratio_vs_floor_paired": round(ours["paired"], 3),
           "cpu_ms": round(ours["cpu_ms"], 1), "floor_cpu_ms": round(ours["floor_cpu_ms"], 1),
           "floor_fresh_ms": round(ours["floor_fresh_ms"], 1),
           "ratio_vs_floor_fresh": round(ours["ms"] / ours["floor_fresh_ms"], 3),
           "first_ms": round(ours["first_ms"], 1), "first_floor_fresh_ms": round(ours["first_floor_ms"], 1),
           "first_ratio": round(ours["first_ms"] / ours["first_floor_ms"], 3),
           "transient_bytes": ours["transient_bytes"],
           # rank 0's (bytes in old store memory taken over, bytes in new memory) of the last two
           # reshards (one each way) and of the first; alloc: writing the most new-memory bytes of
           # any rank once, after the same reshard; paired: ours / (floor + alloc)
           "bytes_reused_allocated": ours["bytes_reused"], "first_reused_allocated": ours["first_split"],
           "alloc_ms": round(ours["touch_ms"], 1),
           "ratio_vs_floor_plus_alloc_paired": round(ours["paired_alloc"], 3),
           # the new memory alone, in floors (paired): a move that must write it takes about 1 + this at least
           "alloc_over_floor_paired": round(ours["alloc_over_floor"], 3),
           # copy: one warm local copy of the bytes sent (a swap in place stages every send)
           "copy_ms": round(ours["copy_ms"], 1), "ratio_vs_floor_plus_copy_paired": round(ours["paired_copy"], 3),
           "first_alloc_ms": round(ours["first_touch_ms"], 1),
           "first_alloc_over_first_fresh": round(ours["first_touch_ms"] / ours["first_floor_ms"], 3),
           "first_ratio_vs_fresh_plus_alloc": round(
               ours["first_ms"] / (ours["first_floor_ms"] + ours["first_touch_ms"]), 3),
           # every rank's peak RSS over the whole run next to what it must hold (see run_ours)
           **ours["rss"]}
    if move == "rw_to_cw":
        theirs = spawn(run_torch_dtensor, 2, args, move)["ms"]
        rec.update(torch_dtensor_ms=round(theirs, 1), ratio_vs_torch_dtensor=round(ours["ms"] / theirs, 3))
    if torchrec is not None:
        rec.update(torchrec_ms=round(torchrec, 1), ratio_vs_torchrec=round(ours["ms"] / torchrec, 3))
    return rec


if __name__ == "__main__":
    main()
