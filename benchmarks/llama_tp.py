"""A Llama-style decoder trained with torchtitan's Llama3 TP plan: shardwise vs PyTorch's DTensor.

The model of tests/parallel/llama_tp_model.py (RMSNorm, rotary via complex multiply, SwiGLU, output
tied to the embedding) with attention on local tensors (use_local_output=True, as Llama3), dim 256,
8 heads, 2 layers, seq 128, batch 4, on 2 gloo ranks with one thread each. A step is forward, cross
entropy, backward, clip_grad_norm_ (foreach) and fused AdamW; the loss runs as torchtitan's recipe runs
it, under each library's ``loss_parallel()`` on class-sharded logits (``--gathered-logits``: on logits
gathered to every rank instead). Both libraries'
models live in each rank and are stepped in paired rounds (one block of steps of each per round, the
order rotating, a barrier before each block); the ratio is the median of per-round ratios, with its
quartiles. Times are wall clock (the ranks wait on each other). The line also carries both models'
last losses (they must agree) and every rank's peak RSS, which covers both models (they share the
process), next to what one rank must hold for both.

    python benchmarks/llama_tp.py
    python benchmarks/llama_tp.py --rounds 5 --inner 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _launch import emit, interleaved, rss_per_rank, spawn  # noqa: E402

CONFIG = dict(dim=256, n_layers=2, n_heads=8, vocab=2048, hidden=768, seq=128, batch=4)


def _model(lib_name: str, mesh, cfg, loss_parallel: bool):
    from tests.parallel.llama_tp_model import Llama, Styles, parallelize

    model = Llama(cfg)
    model.init_weights(0)
    model = parallelize(model, Styles(lib_name), mesh, "local", loss_parallel=loss_parallel)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def _loss_block(lib_name: str, on: bool):
    """The library's ``loss_parallel()`` (the backward runs inside it, as PyTorch asks), or nothing."""
    if not on:
        return contextlib.nullcontext()
    if lib_name == "torch":
        from torch.distributed.tensor.parallel import loss_parallel
    else:
        from shardwise.parallel import loss_parallel
    return loss_parallel()


def _stepper(model, opt, tokens, labels, losses: list, lib_name: str, loss_parallel: bool):
    def step():
        with _loss_block(lib_name, loss_parallel):
            loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())

    return step


def _held_bytes(models) -> int:
    """Parameters, gradients and AdamW's two moments of both models' local shards."""
    return sum(4 * p.to_local().numel() * p.element_size() for m in models for p in m.parameters())


def _bench(rank, world, rounds: int, inner: int, loss_parallel: bool = True):
    from torch.distributed.device_mesh import init_device_mesh

    from tests.parallel.llama_tp_model import Config, batch

    mesh = init_device_mesh("cpu", (world,))  # one DeviceMesh serves both libraries
    cfg = Config(**CONFIG)
    tokens, labels = batch(cfg)
    variants, losses = {}, {}
    for name, lib in (("ours", "shardwise"), ("torch_dtensor", "torch")):
        model, opt = _model(lib, mesh, cfg, loss_parallel)
        losses[name] = []
        variants[name] = (model, _stepper(model, opt, tokens, labels, losses[name], lib, loss_parallel))
    t, per_round = interleaved({k: fn for k, (_, fn) in variants.items()}, rounds, inner, sync=dist.barrier)
    ratios = [a / b for a, b in zip(per_round["ours"], per_round["torch_dtensor"])]
    q = statistics.quantiles(ratios, n=4)
    # the two models took the same number of steps: their losses must agree at every step
    loss_diff = max(abs(a.item() - b.item()) for a, b in zip(losses["ours"], losses["torch_dtensor"]))
    row = {"bench": "llama_tp", "attention": "local", "loss": "loss_parallel" if loss_parallel else "gathered logits",
           "world": world, "threads_per_rank": torch.get_num_threads(),
           **CONFIG, "steps_each": len(losses["ours"]), "ours_ms": round(t["ours"] / 1e3, 2),
           "torch_dtensor_ms": round(t["torch_dtensor"] / 1e3, 2),
           "ratio_ours/torch_dtensor": round(statistics.median(ratios), 3),
           "ratio_ours/torch_dtensor_quartiles": [round(q[0], 3), round(q[2], 3)],
           "max_loss_diff": loss_diff, "last_loss": round(losses["ours"][-1].item(), 5)}
    return {**row, **rss_per_rank(_held_bytes([m for m, _ in variants.values()]))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=3, help="steps per timed block")
    ap.add_argument("--gathered-logits", action="store_true", help="cross entropy on gathered logits, not loss_parallel")
    args = ap.parse_args(argv)
    emit(spawn(_bench, args.world, args.rounds, args.inner, not args.gathered_logits))


if __name__ == "__main__":
    main()
