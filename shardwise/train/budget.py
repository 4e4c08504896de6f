"""The job's per-rank memory budget for embeddings (weights + optimizer state) and its table sizes.

Budget: ``--memory-per-rank SIZE`` when given; otherwise measured on rank 0 -- the GPU's free memory
(each process has its own), or the machine's available memory divided among the ranks on this host --
minus headroom for everything else a rank holds, and broadcast so every rank plans alike.

Example:
    >>> parse_size("6GiB"), parse_size("512MiB"), parse_size("1.5G"), parse_size("2048")
    (6442450944, 536870912, 1610612736, 2048)
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import torch
import torch.distributed as dist

__all__ = ["parse_size", "measured_budget_bytes", "budget_bytes", "table_sizes", "peak_rss_per_rank"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_HEADROOM = 0.25           # share of the measured memory left to the dense model, batches, torch and gloo
_MIN_HEADROOM = 512 << 20


def parse_size(text) -> int:
    """Bytes in ``text``: a number with an optional unit (B, KiB, MiB, GiB, TiB; K/M/G/T and KB/MB/GB
    read as binary units too)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r} is not a number with a unit; write e.g. 6GiB, 512MiB or 1073741824")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return n


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def measured_budget_bytes(device: torch.device, ranks_on_host: int) -> int:
    """This process's share of the memory it trains in, minus headroom."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _available_bytes() // max(1, ranks_on_host)
    return max(1 << 20, int(free - max(_MIN_HEADROOM, _HEADROOM * free)))


def budget_bytes(requested_mb: Optional[float], device: torch.device, ranks_on_host: int) -> tuple[int, str]:
    """(bytes, where from): the flag's value, or rank 0's measurement broadcast to every rank."""
    if requested_mb is not None:
        return int(requested_mb * 2**20), "--memory-per-rank"
    mine = measured_budget_bytes(device, ranks_on_host) if dist.get_rank() == 0 else 0
    t = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.broadcast(t, 0)
    return int(t.item()), f"measured on rank 0 ({device.type} memory / ranks on its host, minus headroom)"


def table_sizes(default: Sequence[int], per_feature: Optional[Sequence[int]], max_rows: Optional[int]) -> list:
    """The 26 table sizes: ``--num-embeddings-per-feature`` when given (wins over ``--rows``), each
    capped at ``--max-rows`` (ids then fold modulo the size, like DLRM's max index range)."""
    sizes = list(per_feature) if per_feature else list(default)
    return [min(int(n), max_rows) if max_rows else int(n) for n in sizes]


def peak_rss_per_rank(device: torch.device) -> list:
    """Collective: every rank's peak resident memory in bytes (the OS's high-water mark of the whole
    process: tables, dense model, batches, torch and gloo), in rank order; the report puts it next to
    what each rank's tables need."""
    import resource

    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux
    t = torch.tensor([mine], dtype=torch.int64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [int(x.item()) for x in out]
