"""Small helpers to build fx graphs whose nodes carry fake ``meta['val']``.

Every pass decides from ``meta['val']`` shapes/dtypes, so each node we
create gets one by running its op on the inputs' fake values.

Example::

    b = Builder(graph)
    with graph.inserting_after(grad):
        flat = b.call(aten.view.default, grad, [-1])
"""
from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode

__all__ = ["Builder", "C10D", "ATEN", "is_collective", "is_wait", "tensor_bytes", "node_val"]

C10D = torch.ops._c10d_functional
ATEN = torch.ops.aten
COLLECTIVES = {
    C10D.all_reduce.default: "all_reduce",
    C10D.all_reduce_.default: "all_reduce",  # in place, on a buffer the graph made (gradient buckets)
    C10D.all_gather_into_tensor.default: "all_gather",
    C10D.reduce_scatter_tensor.default: "reduce_scatter",
}


def is_collective(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in COLLECTIVES


def is_wait(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is C10D.wait_tensor.default


def node_val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def tensor_bytes(val: torch.Tensor) -> int:
    return val.numel() * val.element_size()


class Builder:
    """Creates ``call_function`` nodes with fake values in ``meta['val']``."""

    def __init__(self, graph: torch.fx.Graph, fake_mode=None):
        self.graph = graph
        if fake_mode is None:
            vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
            fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
        assert fake_mode is not None, "graph has no fake-valued placeholders"
        self.fake_mode = fake_mode

    def call(self, target, *args, meta: dict | None = None, **kwargs) -> torch.fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        vargs, vkwargs = pytree.tree_map(node_val, (args, kwargs))
        with self.fake_mode:
            node.meta["val"] = target(*vargs, **vkwargs)
        node.meta.update(meta or {})
        return node

    def placeholder(self, name: str, val: torch.Tensor, meta: dict | None = None) -> torch.fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = self.fake_mode.from_tensor(val) if not _is_fake(val) else val
        node.meta.update(meta or {})
        return node


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
