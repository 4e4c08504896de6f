"""Shared helpers for the graph passes (positions, insertion, node moves)."""
from __future__ import annotations

import operator

import torch

from ..graph_utils import ATEN, Builder

__all__ = ["positions", "first_use", "move_before", "split_flat"]


def positions(graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def first_use(node: torch.fx.Node, pos: dict) -> torch.fx.Node | None:
    users = list(node.users)
    return min(users, key=pos.__getitem__) if users else None


def move_before(nodes: list[torch.fx.Node], anchor: torch.fx.Node) -> None:
    """Move ``nodes`` (in order) to just before ``anchor``."""
    for n in nodes:
        anchor.prepend(n)


def split_flat(b: Builder, flat: torch.fx.Node, sizes: list[int], shapes: list, dim: int = 0) -> list[torch.fx.Node]:
    """Split ``flat`` along ``dim`` by ``sizes`` and reshape each part to ``shapes[i]``."""
    parts = b.call(ATEN.split_with_sizes.default, flat, sizes, dim)
    out = []
    for i, shape in enumerate(shapes):
        item = b.graph.call_function(operator.getitem, (parts, i))
        item.meta["val"] = parts.meta["val"][i]
        out.append(b.call(ATEN.reshape.default, item, list(shape)))
    return out
