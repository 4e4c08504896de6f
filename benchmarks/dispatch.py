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
would cost before any work of its own; it has no real backward).

    python benchmarks/dispatch.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import emit, spawn, time_us  # noqa: E402


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
                plain = time_us(lambda: fn(la, lb))
                ours = time_us(lambda: fn(oa, ob))
                theirs = time_us(lambda: fn(ta, tb))
                floor = time_us(lambda: fn(fa, fb))
                floor_fn = time_us(lambda: _FloorFunction.apply(fn, fa, fb))
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
                })
    for mode in ("no_grad", "autograd"):
        summary = {"bench": "dispatch", "config": "ratios", "mode": mode, "world": world}
        for what in ("overhead_ours", "floor_subclass", "floor_function"):
            ratios = sorted(r[f"ratio_{what}/torch-DTensor"] for r in rows if r["mode"] == mode)
            summary[f"median_ratio_{what}/torch-DTensor"] = ratios[len(ratios) // 2]
        rows.append(summary)
    return rows


def main() -> None:
    for row in spawn(_bench, 2):
        emit(row)


if __name__ == "__main__":
    main()
