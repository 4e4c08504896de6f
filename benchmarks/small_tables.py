"""Many small tables in one process: shardwise vs TorchRec's FusedEmbeddingBagCollection (same run).

The shapes of TorchRec's ``benchmarks/ebc_benchmarks.py`` (its file is not in the wheel; this is our own
script): one process, the SGD update fused into backward (lr 0.02), batch 64, 10 batches an epoch,
0-64 ids per bag (uniform random lengths), sum pooling, loss = sum of the pooled values.

* ``dlrm``: 26 tables of dim 128 with the DLRM cardinalities of TorchRec's benchmark (its list,
  from the torchrec_dlrm README), every table of 10M rows or more divided by 128, as its
  ``ebc_comparison_dlrm`` mode does at reduction degree 128 (about 3.9M rows, 2 GB of float32).
* ``small``: 100 tables of 1024 x 64 (its ``ebc_comparison_scaling`` point).

Implementations: ``fused_ebc`` (shardwise.embedding.FusedEmbeddingBagCollection, TorchRec's class
name and signature), ``shard`` (shard() of an EmbeddingBagCollection at world 1, every table
table-wise on rank 0: the one-rank path of shardwise/embedding/sharding/local.py, no routing) and ``torchrec`` (torchrec.modules.fused_embedding_modules.FusedEmbeddingBagCollection,
FBGEMM's CPU kernel). Each measurement is a fresh process (its peak RSS is its own) that builds the
module, draws the same batches (a seeded torch generator: identical ids in both interpreters), runs
warm-up epochs, then times epochs; rounds interleave the implementations so load from other processes
hits them alike. One JSON line per measurement (median seconds per epoch, peak RSS next to what the
process must hold: tables, optimizer state, batches) and one per shape with the medians over rounds
and ``ratio_vs_torchrec``.

    .venv/bin/python benchmarks/small_tables.py                          # both shapes, TorchRec if found
    .venv/bin/python benchmarks/small_tables.py --shapes small --rounds 5 --torchrec-python ../torchrec-venv/bin/python

TorchRec runs in its own interpreter (``--torchrec-python`` or $SHARDWISE_TORCHREC_PYTHON, run with
PYTHONHASHSEED=0; build one with ../shared/peers/torchrec-venv.sh); without one it is skipped with a
message. This file imports nothing from shardwise at module level: the TorchRec interpreter runs it too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import peak_rss_bytes  # noqa: E402  (imports torch only: fine in TorchRec's interpreter)

# TorchRec's ebc_benchmarks.py list (torchrec_dlrm README); tables of 10M rows or more are shrunk
DLRM_ROWS = [45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10, 2209,
             11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35]
SHAPES = {
    "dlrm": lambda: [(r if r < 10_000_000 else r // 128, 128) for r in DLRM_ROWS],
    "small": lambda: [(1024, 64)] * 100,
}
LR, BATCH, BATCHES, MAX_IDS = 0.02, 64, 10, 64
OURS = ("fused_ebc", "shard")


def make_batches(tables: list, seed: int = 0) -> list:
    """(keys, values, lengths) of each batch of an epoch: per feature, 0..MAX_IDS ids per bag, ids uniform
    over the table's rows. Pure torch with a seeded generator: the same in both interpreters."""
    g = torch.Generator().manual_seed(seed)
    keys = [f"f{i}" for i in range(len(tables))]
    out = []
    for _ in range(BATCHES):
        lengths = torch.randint(0, MAX_IDS + 1, (len(tables), BATCH), generator=g)
        values = torch.cat([torch.randint(0, rows, (int(n),), generator=g)
                            for (rows, _), n in zip(tables, lengths.sum(1))])
        out.append((keys, values, lengths.flatten()))
    return out


def held_bytes(tables: list, batches: list) -> int:
    """What the process must hold: the tables (float32; SGD keeps no state) and the epoch's batches."""
    return sum(r * d * 4 for r, d in tables) + sum(v.numel() * 8 + ln.numel() * 8 for _, v, ln in batches)


def build(impl: str, tables: list):
    """(module, KeyedJaggedTensor class) for one implementation."""
    if impl == "torchrec":
        import torchrec
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

        cfgs = [torchrec.EmbeddingBagConfig(name=f"t{i}", embedding_dim=d, num_embeddings=r, feature_names=[f"f{i}"])
                for i, (r, d) in enumerate(tables)]
        return (FusedEmbeddingBagCollection(tables=cfgs, optimizer_type=torch.optim.SGD,
                                            optimizer_kwargs={"lr": LR}, device=torch.device("cpu")),
                torchrec.KeyedJaggedTensor)
    import functools

    from shardwise.embedding import (EmbeddingBagCollection, EmbeddingBagConfig, FusedEmbeddingBagCollection, shard,
                                     table_wise)
    from shardwise.sparse import KeyedJaggedTensor

    cfgs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=d, num_embeddings=r, feature_names=[f"f{i}"])
            for i, (r, d) in enumerate(tables)]
    if impl == "fused_ebc":
        return FusedEmbeddingBagCollection(cfgs, optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": LR}), \
            KeyedJaggedTensor
    import tempfile

    import torch.distributed as dist

    if not dist.is_initialized():   # shard() runs over a process group: here a group of one
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/init", rank=0, world_size=1)
    ebc = EmbeddingBagCollection(cfgs, device="meta")   # shard() materialises the tables itself
    return shard(ebc, {c.name: table_wise(0) for c in cfgs}, optimizer=functools.partial(torch.optim.SGD, lr=LR)), \
        KeyedJaggedTensor


def run_one(args) -> dict:
    """One measurement in this process: build, warm up, time ``args.epochs`` epochs."""
    torch.set_num_threads(args.threads)
    tables = SHAPES[args.shape]()
    raw = make_batches(tables)
    module, kjt_cls = build(args.impl, tables)
    batches = [kjt_cls(keys=k, values=v, lengths=ln) for k, v, ln in raw]

    def epoch():
        for kjt in batches:
            module(kjt).values().sum().backward()

    for _ in range(args.warmup):
        epoch()
    times, cpu = [], []
    for _ in range(args.epochs):
        t0, c0 = time.perf_counter(), time.thread_time()
        epoch()
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    mib = 1 << 20
    return {"bench": "small_tables", "shape": args.shape, "impl": args.impl, "s_per_epoch": round(statistics.median(times), 5),
            "cpu_s_per_epoch": round(statistics.median(cpu), 5), "epochs": args.epochs, "threads": args.threads,
            "peak_rss_mib": round(peak_rss_bytes() / mib, 1), "held_mib": round(held_bytes(tables, raw) / mib, 1)}


def measure(args, impl: str, shape: str):
    """Run one measurement in a fresh process (TorchRec's interpreter for ``torchrec``); its record or None."""
    python = sys.executable if impl != "torchrec" else _torchrec_python(args)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONHASHSEED="0")
    env["PYTHONPATH"] = "" if impl == "torchrec" else root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [python, os.path.abspath(__file__), "--run-one", "--impl", impl, "--shapes", shape,
           "--epochs", str(args.epochs), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not recs:
        print(f"# {impl}/{shape} failed (exit {proc.returncode}), skipped:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return recs[-1]


def _torchrec_python(args):
    python = args.torchrec_python or os.environ.get("SHARDWISE_TORCHREC_PYTHON")
    return python if python and os.path.exists(python) else None


def load_average() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES))
    p.add_argument("--impls", type=lambda s: s.split(","), default=list(OURS), help=f"ours among {OURS}")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every implementation")
    p.add_argument("--epochs", type=int, default=10, help="timed epochs per measurement (the median is kept)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads in every implementation's process")
    p.add_argument("--torchrec-python", default=None)
    p.add_argument("--run-one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES] + [i for i in args.impls if i not in OURS]
    if unknown:
        p.error(f"unknown shapes/impls {unknown}: shapes are {list(SHAPES)}, impls {list(OURS)}")
    if args.run_one:
        args.shape = args.shapes[0]
        print(json.dumps(run_one(args)), flush=True)
        return
    impls = list(args.impls)
    if _torchrec_python(args) is None:
        print(f"# TorchRec skipped: no interpreter (pass --torchrec-python or set SHARDWISE_TORCHREC_PYTHON; got "
              f"{args.torchrec_python or os.environ.get('SHARDWISE_TORCHREC_PYTHON')!r})", file=sys.stderr)
    else:
        impls.append("torchrec")
    for shape in args.shapes:
        got: dict = {i: [] for i in impls}
        for r in range(args.rounds):
            for impl in impls[r % len(impls):] + impls[:r % len(impls)]:   # the order rotates per round
                rec = measure(args, impl, shape)
                if rec is not None:
                    got[impl].append((rec["s_per_epoch"], rec["cpu_s_per_epoch"]))
                    print(json.dumps({**rec, "round": r, "load_avg": load_average()}), flush=True)
        for impl in args.impls:
            if got[impl]:
                print(json.dumps(summary(shape, impl, got[impl], got.get("torchrec"))), flush=True)


def summary(shape: str, impl: str, ours: list, peer) -> dict:
    """The medians over rounds of one implementation, and its ratios to TorchRec: each round's ratio
    (both measured under the same load), then their median; wall time and the main thread's CPU time
    (on a loaded machine the CPU time, which leaves out the time the process waited, is the steadier)."""
    rec = {"bench": "small_tables", "shape": shape, "impl": impl, "rounds": len(ours),
           "s_per_epoch": round(statistics.median(t for t, _ in ours), 5),
           "cpu_s_per_epoch": round(statistics.median(c for _, c in ours), 5)}
    if peer:
        rec.update(torchrec_s_per_epoch=round(statistics.median(t for t, _ in peer), 5),
                   torchrec_cpu_s_per_epoch=round(statistics.median(c for _, c in peer), 5),
                   ratio_vs_torchrec=round(statistics.median(a[0] / b[0] for a, b in zip(ours, peer)), 3),
                   cpu_ratio_vs_torchrec=round(statistics.median(a[1] / b[1] for a, b in zip(ours, peer)), 3))
    return {**rec, "load_avg": load_average()}

if __name__ == "__main__":
    main()
