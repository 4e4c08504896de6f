"""Per-op eager overhead of DTensor dispatch: shardwise vs PyTorch's DTensor vs plain torch.

Overhead = time per op on DTensors minus the plain op on the local tensors (cache hits; no
communication is needed for these layouts). Two modes: ``no_grad`` (inputs need no gradient: the
inference path) and ``autograd`` (inputs require grad, so every op records its backward: the
training forward users run). Prints one JSON line per (mode, op, placement).

Two floors are timed in the same run, for reading the ratios: ``floor_subclass`` is the cheapest
tensor subclass that lets autograd record its own backward node (``__torch_function__`` that calls
through, ``__torch_dispatch__`` that unwraps, runs the op and wraps: no sharding work at all), the
path every recorded op on a DTensor takes, ours and PyTorch's alike; ``floor_function`` is a custom
``torch.autograd.Function`` whose forward only runs the local op and wraps (what a per-plan Function
would cost before any work of its own; it has no real backward). ``ratio_overhead_ours/floor_subclass``
reads ours against that floor directly (the autograd goal: within 1.05x of it).

Times are this thread's CPU time (``time.thread_time``): none of these calls communicates, and on a
machine shared with other jobs wall time mostly measures the scheduler. The five variants of an op
(plain, ours, PyTorch's, the two floors) are timed in rotating order, 7 rounds of 50 calls, each
reported as its median round. A last pair of lines times
a small training step on each (4 x ``relu(h @ w)``, Replicate 64x64 weights, Shard(0) batch):
forward alone and forward + ``autograd.grad``, where backward ops go through dispatch too, in paired
rounds (the median of per-round ratios). A last
line gives every rank's peak RSS next to the bytes it must hold.

    python benchmarks/dispatch.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import emit, interleaved, rss_per_rank, spawn  # noqa: E402

_CPU = time.thread_time
_STEP_ROUNDS = 9
_OP_ROUNDS = 7


class _Floor(torch.Tensor):
    """The cheapest subclass autograd records through: no keys, no plans, no layouts."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*[x._local if type(x) is cls else x for x in args], **(kwargs or {}))
        return _floor_wrap(out) if isinstance(out, torch.Tensor) else out


def _floor_wrap(local, requires_grad=False):
    r = torch.Tensor._make_wrapper_subclass(_Floor, local.shape, strides=local.stride(), dtype=local.dtype,
                                            device=local.device, requires_grad=requires_grad)
    r._local = local
    return r


class _FloorFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, x, y):
        return _floor_wrap(fn(x._local, y._local))

    @staticmethod
    def backward(ctx, grad):  # never called: only the forward is timed
        raise NotImplementedError


def _bench(rank, world):
    import torch.distributed.tensor as tdt
    from torch.distributed.device_mesh import init_device_mesh

    import shardwise.tensor as sw

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    rows = []
    for mode in ("no_grad", "autograd"):
        grad = mode == "autograd"
        a, b = torch.randn(64, 64, requires_grad=grad), torch.randn(64, 64, requires_grad=grad)
        for pname, ours_pl, torch_pl in [("R", sw.Replicate(), tdt.Replicate()), ("S(0)", sw.Shard(0), tdt.Shard(0))]:
            oa = sw.distribute_tensor(a, mesh, [ours_pl])
            ob = sw.distribute_tensor(b, mesh, [sw.Replicate()])
            ta = tdt.distribute_tensor(a, mesh, [torch_pl])
            tb = tdt.distribute_tensor(b, mesh, [tdt.Replicate()])
            la = oa.to_local().detach().requires_grad_(grad)
            lb = ob.to_local().detach().requires_grad_(grad)
            fa, fb = _floor_wrap(la.detach(), grad), _floor_wrap(lb.detach(), grad)
            ops = [("add", lambda x, y: torch.add(x, x)), ("mm", torch.mm), ("relu", lambda x, y: torch.relu(x)),
                   ("sum", lambda x, y: x.sum(0))]
            for op_name, fn in ops:
                # the five variants in rotating order, round after round: load from other processes
                # hits each alike (timed one after another, one block of load moved a single ratio 2x)
                med, _ = interleaved({"plain": lambda: fn(la, lb), "ours": lambda: fn(oa, ob),
                                      "theirs": lambda: fn(ta, tb), "floor": lambda: fn(fa, fb),
                                      "floor_fn": lambda: _FloorFunction.apply(fn, fa, fb)},
                                     rounds=_OP_ROUNDS, inner=50, clock=_CPU)
                plain, ours, theirs, floor, floor_fn = (med[k] for k in ("plain", "ours", "theirs", "floor",
                                                                         "floor_fn"))
                torch_over = max(theirs - plain, 1e-9)
                rows.append({
                    "bench": "dispatch", "mode": mode, "op": op_name, "placement": pname, "world": world,
                    "plain_us": round(plain, 2), "ours_us": round(ours, 2), "torch_dtensor_us": round(theirs, 2),
                    "ours_overhead_us": round(ours - plain, 2), "torch_overhead_us": round(theirs - plain, 2),
                    "floor_subclass_overhead_us": round(floor - plain, 2),
                    "floor_function_overhead_us": round(floor_fn - plain, 2),
                    "ratio_overhead_ours/torch-DTensor": round((ours - plain) / torch_over, 3),
                    "ratio_floor_subclass/torch-DTensor": round((floor - plain) / torch_over, 3),
                    "ratio_floor_function/torch-DTensor": round((floor_fn - plain) / torch_over, 3),
                    "ratio_overhead_ours/floor_subclass": round((ours - plain) / max(floor - plain, 1e-9), 3),
                })
    rows += _steps(mesh, world, sw, tdt)
    for mode in ("no_grad", "autograd"):
        summary = {"bench": "dispatch", "config": "ratios", "mode": mode, "world": world}
        for key in ("overhead_ours/torch-DTensor", "floor_subclass/torch-DTensor", "floor_function/torch-DTensor",
                    "overhead_ours/floor_subclass"):
            ratios = sorted(r[f"ratio_{key}"] for r in rows if r["mode"] == mode and f"ratio_{key}" in r)
            summary[f"median_ratio_{key}"] = ratios[len(ratios) // 2]  # of 8: the upper middle one
        rows.append(summary)
    # What a rank must hold here is a few 64x64 operands; the peak is the interpreter, torch and the
    # two DTensor implementations' caches.
    held = 4 * 64 * 64 * 4 * 3
    rows.append({"bench": "dispatch", "config": "memory", "world": world, **rss_per_rank(held)})
    return rows


def _steps(mesh, world, sw, tdt) -> list:
    torch.manual_seed(1)
    full_w = [torch.randn(64, 64) / 8 for _ in range(4)]
    full_x = torch.randn(32, 64)
    sides = {
        "plain": ([w.clone().requires_grad_() for w in full_w],
                  full_x.chunk(world)[torch.distributed.get_rank()].clone()),
        "ours": ([sw.distribute_tensor(w.clone().requires_grad_(), mesh, [sw.Replicate()]) for w in full_w],
                 sw.distribute_tensor(full_x, mesh, [sw.Shard(0)])),
        "torch_dtensor": ([tdt.distribute_tensor(w.clone().requires_grad_(), mesh, [tdt.Replicate()]) for w in full_w],
                          tdt.distribute_tensor(full_x, mesh, [tdt.Shard(0)])),
    }
    fns = {}
    for name, (ws, x) in sides.items():
        def fwd(ws=ws, x=x):
            h = x
            for w in ws:
                h = torch.relu(h @ w)
            return h

        def fwd_bwd(ws=ws, fwd=fwd):
            out = fwd()
            torch.autograd.grad(out, ws, grad_outputs=torch.ones_like(out))

        fns[name] = (fwd, fwd_bwd)
    rows = []
    for i, what in enumerate(("mlp4_fwd", "mlp4_fwd_bwd")):
        # paired rounds (rotating order), the ratio taken per round: one unpaired sample per side swung
        # 0.5-3.3x between runs
        med, times = interleaved({k: f[i] for k, f in fns.items()}, rounds=_STEP_ROUNDS, inner=20, clock=_CPU)
        # a round where PyTorch's DTensor timed no slower than the plain op measured nothing
        ratios = [(o - p) / (t - p) if t > p else None
                  for p, o, t in zip(times["plain"], times["ours"], times["torch_dtensor"])]
        rows.append({"bench": "dispatch", "mode": "autograd", "op": what, "placement": "S(0) x R", "world": world,
                     "rounds": _STEP_ROUNDS, "plain_us": round(med["plain"], 1), "ours_us": round(med["ours"], 1),
                     "torch_dtensor_us": round(med["torch_dtensor"], 1),
                     "ratio_overhead_ours/torch-DTensor(step)":
                         round(statistics.median(r for r in ratios if r is not None), 3),
                     "ratio_per_round": [None if x is None else round(x, 3) for x in ratios]})
    return rows


def main() -> None:
    for row in spawn(_bench, 2):
        emit(row)


if __name__ == "__main__":
    main()
