"""Graph passes over a per-rank step graph; each decides from sizes and graph order only.

Example::

    run_passes(gm, world=2, bucket_cap_bytes=4 << 20, gather_bucket_cap_bytes=4 << 20)
"""
from __future__ import annotations

import torch

from .gather_bucketing import bucket_gathers
from .grad_bucketing import bucket_gradients
from .wait_scheduling import schedule_waits

__all__ = ["run_passes", "bucket_gradients", "bucket_gathers", "schedule_waits"]


def run_passes(gm: torch.fx.GraphModule, world: int, bucket_cap_bytes: int, gather_bucket_cap_bytes: int) -> dict:
    """Bucket gradients, bucket/prefetch gathers, then place waits; returns bucket counts."""
    stats = {
        "grad_buckets": bucket_gradients(gm, world, bucket_cap_bytes),
        "gather_buckets": bucket_gathers(gm, world, gather_bucket_cap_bytes),
        "waits_moved": schedule_waits(gm),
    }
    gm.graph.lint()
    return stats
