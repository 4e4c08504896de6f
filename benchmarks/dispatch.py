"""Per-op eager overhead of DTensor dispatch: shardwise vs PyTorch's DTensor vs plain torch.

Overhead = time per op on DTensors minus the plain op on the local tensors (cache hits; no
communication is needed for these layouts). Prints one JSON line per (op, placement).

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
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    rows = []
    for pname, ours_pl, torch_pl in [("R", sw.Replicate(), tdt.Replicate()), ("S(0)", sw.Shard(0), tdt.Shard(0))]:
        oa = sw.distribute_tensor(a, mesh, [ours_pl])
        ob = sw.distribute_tensor(b, mesh, [sw.Replicate()])
        ta = tdt.distribute_tensor(a, mesh, [torch_pl])
        tb = tdt.distribute_tensor(b, mesh, [tdt.Replicate()])
        la, lb = oa.to_local(), ob.to_local()
        for op_name, fn in [("add", torch.add), ("mm", torch.mm)]:
            y = ob if op_name == "mm" else oa
            ty = tb if op_name == "mm" else ta
            ly = lb if op_name == "mm" else la
            plain = time_us(lambda: fn(la, ly))
            ours = time_us(lambda: fn(oa, y))
            theirs = time_us(lambda: fn(ta, ty))
            rows.append({
                "bench": "dispatch", "op": op_name, "placement": pname, "world": world,
                "plain_us": round(plain, 2), "ours_us": round(ours, 2), "torch_dtensor_us": round(theirs, 2),
                "ours_overhead_us": round(ours - plain, 2), "torch_overhead_us": round(theirs - plain, 2),
                "ratio_overhead_ours/torch-DTensor": round((ours - plain) / max(theirs - plain, 1e-9), 3),
            })
    return rows


def main() -> None:
    for row in spawn(_bench, 2):
        emit(row)


if __name__ == "__main__":
    main()
