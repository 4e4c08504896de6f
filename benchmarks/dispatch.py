"""Per-op eager overhead of DTensor dispatch: shardwise vs PyTorch's DTensor vs plain torch.

Overhead = time per op on DTensors minus the plain op on the local tensors (cache hits; no
communication is needed for these layouts). Two modes: ``no_grad`` (inputs need no gradient: the
inference path) and ``autograd`` (inputs require grad, so every op records its backward: the
training forward users run). Prints one JSON line per (mode, op, placement).

    python benchmarks/dispatch.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _launch import emit, spawn, time_us  # noqa: E402


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
            ops = [("add", lambda x, y: torch.add(x, x)), ("mm", torch.mm), ("relu", lambda x, y: torch.relu(x)),
                   ("sum", lambda x, y: x.sum(0))]
            for op_name, fn in ops:
                plain = time_us(lambda: fn(la, lb))
                ours = time_us(lambda: fn(oa, ob))
                theirs = time_us(lambda: fn(ta, tb))
                rows.append({
                    "bench": "dispatch", "mode": mode, "op": op_name, "placement": pname, "world": world,
                    "plain_us": round(plain, 2), "ours_us": round(ours, 2), "torch_dtensor_us": round(theirs, 2),
                    "ours_overhead_us": round(ours - plain, 2), "torch_overhead_us": round(theirs - plain, 2),
                    "ratio_overhead_ours/torch-DTensor": round((ours - plain) / max(theirs - plain, 1e-9), 3),
                })
    for mode in ("no_grad", "autograd"):
        ratios = sorted(r["ratio_overhead_ours/torch-DTensor"] for r in rows if r["mode"] == mode)
        rows.append({"bench": "dispatch", "config": "ratios", "mode": mode, "world": world,
                     "median_ratio_overhead_ours/torch-DTensor": ratios[len(ratios) // 2]})
    return rows


def main() -> None:
    for row in spawn(_bench, 2):
        emit(row)


if __name__ == "__main__":
    main()
