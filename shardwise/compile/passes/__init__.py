"""Graph passes over a per-rank step graph; each decides from sizes only.

Example::

    run_passes(gm, world=2, bucket_cap_bytes=4 << 20, gather_bucket_cap_bytes=4 << 20)
"""
from __future__ import annotations

import torch

__all__ = ["run_passes"]


def run_passes(gm: torch.fx.GraphModule, world: int, bucket_cap_bytes: int, gather_bucket_cap_bytes: int) -> None:
    gm.graph.lint()
