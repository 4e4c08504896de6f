"""Wait scheduling: every ``wait_tensor`` runs just before its first use.

A collective is asynchronous between its issue and its wait; waiting any
earlier only removes overlap.  The move depends on graph order alone.

Example::

    moved = schedule_waits(gm)
"""
from __future__ import annotations

import torch

from ..graph_utils import is_wait
from ._common import first_use, positions

__all__ = ["schedule_waits"]


def schedule_waits(gm: torch.fx.GraphModule) -> int:
    """Move each wait to just before its first user; returns how many moved."""
    graph = gm.graph
    moved = 0
    for wait in [n for n in graph.nodes if is_wait(n)]:
        pos = positions(graph)
        user = first_use(wait, pos)
        if user is not None and pos[user] > pos[wait] + 1:
            user.prepend(wait)
            moved += 1
    return moved
