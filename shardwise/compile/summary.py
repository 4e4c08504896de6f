"""Readable graph printing with a count of collectives by kind and bytes.

Example::

    print(format_graph(step.graph))
    collective_summary(step.graph)  # {"all_reduce": (4, 16777216), ...}
"""
from __future__ import annotations

from collections import defaultdict

import torch

from .graph_utils import COLLECTIVES, tensor_bytes

__all__ = ["collective_summary", "format_graph"]


def collective_summary(gm: torch.fx.GraphModule) -> dict[str, tuple[int, int]]:
    """``{kind: (count, bytes sent per rank)}`` for the collectives in ``gm``.

    Bytes are the input size of each collective on this rank.

    Example: see the ``shardwise.compile`` package's (``collective_summary(step.graph)``).
    """
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in COLLECTIVES:
            kind = COLLECTIVES[node.target]
            out[kind][0] += 1
            val = node.args[0].meta.get("val")
            out[kind][1] += tensor_bytes(val) if isinstance(val, torch.Tensor) else 0
    return {k: (c, b) for k, (c, b) in sorted(out.items())}


def format_graph(gm: torch.fx.GraphModule) -> str:
    """The graph's code preceded by one header line per collective kind.

    Example: ``print(format_graph(step.graph))`` after a step ran (see the ``shardwise.compile`` package's).
    """
    lines = ["# collectives:"]
    for kind, (count, nbytes) in collective_summary(gm).items():
        lines.append(f"#   {kind:<15} x{count:<4} {nbytes / 2**20:10.3f} MiB")
    lines.append(gm.print_readable(print_output=False))
    return "\n".join(lines)
