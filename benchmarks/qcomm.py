"""Quantized comms on the DLRM job: bytes on the wire, step time and the loss after N steps, fp32 vs
fp16 / bf16 / TorchRec's golden-example pair (fp16 forward, bf16 backward).

Each variant is ``shardwise train``'s own model and step (``Trainer``: its planner's plan, its synthetic
log, its seeds, dense part under DDP) with the sharded tables rebuilt from the same seed with
``shard(..., qcomm_codecs_registry=...)``; every variant starts from the same weights and reads the same
batches. Per variant, on 2 gloo ranks:

- ``wire_bytes_per_step``: bytes of the embedding output collectives (forward values + backward
  gradients), summed over ranks, counted on the first ``--count-steps`` steps (every fp32/fp16/bf16 buffer that
  ``embedding/sharding/comm.py`` hands to torch.distributed, by tests/embedding/qcomm_workers.py's counter);
- ``ms_per_step``: median over blocks of 50 steps of the slowest rank's mean step time (variants
  train in blocks whose order rotates, so load from other processes falls on all of them alike);
- ``loss_last``: global mean loss averaged over the last 50 steps, and ``loss_diff_pct`` against fp32's.

    .venv/bin/python benchmarks/qcomm.py --steps 500
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _launch import emit, spawn  # noqa: E402

VARIANTS = {"fp32": (None, None), "fp16": ("FP16", "FP16"), "bf16": ("BF16", "BF16"),
            "fp16_fwd+bf16_bwd": ("FP16", "BF16")}
BLOCK = 50


def _trainer(variant: str, tmp: str):
    import functools

    from torch.distributed.device_mesh import init_device_mesh

    from shardwise.embedding import shard
    from shardwise.embedding.qcomm import CommType, QCommsConfig, get_qcomm_codecs_registry
    from shardwise.train.config import TrainConfig
    from shardwise.train.loop import Trainer
    from shardwise.train.model import make_ebc

    cfg = TrainConfig(steps=1 << 30, quiet=True, checkpoint_every=0, reshard_at=0, dense_parallel="ddp",
                      out=os.path.join(tmp, variant))
    tr = Trainer(cfg, init_device_mesh("cpu", (dist.get_world_size(),)))
    fwd, bwd = VARIANTS[variant]
    registry = None if fwd is None else get_qcomm_codecs_registry(QCommsConfig(CommType[fwd], CommType[bwd]))
    tr.sparse = shard(make_ebc(tr.cards, cfg.dim, cfg.seed), tr.plan, mesh=tr.mesh,
                      optimizer=functools.partial(torch.optim.Adagrad, lr=cfg.lr_sparse),
                      qcomm_codecs_registry=registry)
    return tr


def _global_mean(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def _slowest(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _block(tr, state: dict, first: int, count_steps: int) -> float:
    """Train ``BLOCK`` steps of one variant; the slowest rank's mean ms per step."""
    from tests.embedding.qcomm_workers import wire_bytes  # the tests' count, per collective kind

    b = tr.cfg.batch_size
    t0 = time.perf_counter()
    for i in range(first, first + BLOCK):
        batch = tr._inputs(tr.cursor + tr.rank * b, b)
        with wire_bytes() if i < count_steps else contextlib.nullcontext({}) as sent:
            loss = tr._train_batch(batch)[0]
        state["bytes"] += sum(sent.values())
        state["losses"].append(float(loss.detach()))
    return _slowest((time.perf_counter() - t0) / BLOCK * 1e3)


def run_all(rank, world, steps, count_steps, variants):
    """Every variant trained ``steps`` steps, in blocks of ``BLOCK`` whose order rotates (so load from
    other processes falls on every variant alike); the first block of each is warm-up for timing."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {v: _trainer(v, tmp) for v in variants}
        state = {v: {"bytes": 0, "losses": [], "ms": []} for v in variants}
        for k in range(steps // BLOCK):
            for v in variants[k % len(variants):] + variants[:k % len(variants)]:
                state[v]["ms"].append(_block(trainers[v], state[v], k * BLOCK, count_steps))
        for v, tr in trainers.items():
            s = state[v]
            kinds: dict = {}
            for ps in tr.plan.values():
                kinds[ps.sharding_type.value] = kinds.get(ps.sharding_type.value, 0) + 1
            out[v] = {"wire_bytes_per_step": int(_global_mean(s["bytes"]) * world / count_steps),
                      "ms_per_step": round(statistics.median(s["ms"][1:] or s["ms"]), 2),
                      "loss_last": _global_mean(statistics.mean(s["losses"][-BLOCK:])),
                      "loss_first": _global_mean(s["losses"][0]), "plan": kinds}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--count-steps", type=int, default=5, help="steps whose wire bytes are counted")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = p.parse_args()
    if args.steps < 2 * BLOCK or args.steps % BLOCK or not 0 < args.count_steps <= BLOCK:
        p.error(f"--steps must be a multiple of {BLOCK}, at least {2 * BLOCK}; --count-steps in 1..{BLOCK}")
    variants = ["fp32"] + [v for v in args.variants if v != "fp32"]
    out = spawn(run_all, 2, args.steps, args.count_steps, variants)
    base = out["fp32"]
    for v in variants:
        r = out[v]
        emit({"bench": "qcomm", "variant": v, "world": 2, "steps": args.steps, **r,
              "wire_ratio_vs_fp32": round(r["wire_bytes_per_step"] / base["wire_bytes_per_step"], 4),
              "loss_diff_pct": round(100 * (r["loss_last"] - base["loss_last"]) / base["loss_last"], 3),
              "loss_within_1pct": abs(r["loss_last"] - base["loss_last"]) <= 0.01 * abs(base["loss_last"]),
              "time_ratio_vs_fp32": round(r["ms_per_step"] / base["ms_per_step"], 3),
              "load_avg_1min": round(os.getloadavg()[0], 1), "cpus": os.cpu_count()})


if __name__ == "__main__":
    main()
