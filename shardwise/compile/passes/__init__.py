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


def run_passes(gm: torch.fx.GraphModule, world: int, bucket_cap_bytes: int, gather_bucket_cap_bytes: int,
               functional: bool = False) -> dict:
    """Bucket gradients (one bucket carrying the ranks' agreement bits, if the graph has that input),
    bucket/prefetch gathers, then place waits; returns bucket counts.  ``functional``: no in-place
    collectives or kept buffers (for a ``gm_transformation`` that functionalizes the graph)."""
    carry = next((n for n in gm.graph.nodes if n.op == "placeholder" and n.meta.get("sw_kind") == "agreement"), None)
    stats = {
        "grad_buckets": bucket_gradients(gm, world, bucket_cap_bytes, carry, functional),
        "gather_buckets": bucket_gathers(gm, world, gather_bucket_cap_bytes),
        "waits_moved": schedule_waits(gm),
    }
    _fill_tags(gm.graph)
    gm.graph.lint()
    return stats


_ROLE_REGION = {"gather_fwd": "forward", "gather_bwd": "backward", "grad_sync": "backward"}
_ORDER = ("forward", "backward", "optimizer")


def _fill_tags(graph: torch.fx.Graph) -> None:
    """Give nodes the passes created a region (from their role or inputs) and a kind."""
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if "sw_region" not in node.meta:
            ins = [i.meta.get("sw_region") for i in node.all_input_nodes]
            ins = [r for r in ins if r in _ORDER]
            role = _ROLE_REGION.get(node.meta.get("sw_role"))
            node.meta["sw_region"] = role or (max(ins, key=_ORDER.index) if ins else "forward")
        if "sw_kind" not in node.meta:
            val = node.meta.get("val")
            node.meta["sw_kind"] = "activation" if isinstance(val, torch.Tensor) else "non_tensor"
