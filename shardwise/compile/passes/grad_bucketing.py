"""Gradient bucketing: one all-reduce / reduce-scatter per bucket of gradients.

Gradients are taken in the order the backward produces them (graph order,
identical on every rank) and grouped greedily until a bucket holds at least
``cap_bytes``.  Each bucket is issued right after its last gradient is
computed, so it overlaps the rest of the backward; its wait and the split
back into per-parameter gradients sit just before the first use (the
optimizer).  Sharded gradients are laid out ``(N, chunk)`` before being
concatenated so one reduce-scatter hands every rank its own chunks.

Example::

    bucket_gradients(gm, world=2, cap_bytes=4 << 20)
"""
from __future__ import annotations

import torch

from ..graph_utils import ATEN, C10D, Builder, is_collective, tensor_bytes
from ._common import move_before, positions, split_flat

__all__ = ["bucket_gradients"]


def _syncs(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if is_collective(n) and n.meta.get("sw_role") == "grad_sync"]


def _source(coll: torch.fx.Node) -> torch.fx.Node:
    """The gradient feeding ``coll`` (skipping the padding node, if any)."""
    src = coll.args[0]
    while src.meta.get("sw_role") == "grad_sync":
        src = src.args[0]
    return src


def plan_buckets(colls: list[torch.fx.Node], pos: dict, cap_bytes: int) -> list[list[torch.fx.Node]]:
    """Group collectives by readiness order; decisions use only sizes and graph order."""
    colls = sorted(colls, key=lambda c: pos[_source(c)])
    buckets: list[list[torch.fx.Node]] = []
    size = 0
    for c in colls:
        key = (c.target, c.args[0].meta["val"].dtype)
        if buckets and size < cap_bytes and (buckets[-1][0].target, buckets[-1][0].args[0].meta["val"].dtype) == key:
            buckets[-1].append(c)
        else:
            buckets.append([c])
            size = 0
        size += tensor_bytes(c.args[0].meta["val"])
    return buckets


def bucket_gradients(gm: torch.fx.GraphModule, world: int, cap_bytes: int) -> int:
    """Rewrite gradient collectives into buckets; returns the number of buckets."""
    graph = gm.graph
    b = Builder(graph)
    pos = positions(graph)
    buckets = plan_buckets(_syncs(graph), pos, cap_bytes)
    for bucket in buckets:
        last = max((_source(c) for c in bucket), key=pos.__getitem__)
        if len(bucket) == 1:
            _hoist_single(bucket[0], last)
        else:
            _rewrite(b, bucket, last, world, positions(graph))
    return len(buckets)


def _pre_chain(coll: torch.fx.Node) -> list[torch.fx.Node]:
    """``coll`` preceded by the padding nodes that feed it."""
    chain = [coll]
    while chain[0].args[0].meta.get("sw_role") == "grad_sync":
        chain.insert(0, chain[0].args[0])
    return chain


def _hoist_single(coll: torch.fx.Node, after: torch.fx.Node) -> None:
    move_before(_pre_chain(coll), after.next)


def _rewrite(b: Builder, bucket: list, last: torch.fx.Node, world: int, pos: dict) -> None:
    graph = b.graph
    waits = [next(iter(c.users)) for c in bucket]
    first = min((u for w in waits for u in w.users), key=pos.__getitem__)
    meta = {"sw_role": "grad_sync", "sw_kind": "grad", "sw_fqn": None}
    ins = [c.args[0] for c in bucket]
    scatter = bucket[0].target is C10D.reduce_scatter_tensor.default
    anchor = last.next
    for c in bucket:
        move_before(_pre_chain(c)[:-1], anchor)
    with graph.inserting_before(anchor):
        if scatter:
            flats = [b.call(ATEN.reshape.default, x, [world, -1]) for x in ins]
            flat = b.call(ATEN.reshape.default, b.call(ATEN.cat.default, flats, 1), [-1])
            coll = b.call(bucket[0].target, flat, "sum", world, bucket[0].args[3], meta=meta)
        else:
            flat = b.call(ATEN.cat.default, [b.call(ATEN.reshape.default, x, [-1]) for x in ins])
            coll = b.call(bucket[0].target, flat, "sum", bucket[0].args[2], meta=meta)
    divs = [next(iter(w.users)) for w in waits]
    assert all(d.target is ATEN.div.Tensor for d in divs), divs
    with graph.inserting_before(first):
        wait = b.call(C10D.wait_tensor.default, coll, meta=meta)
        # average once on the fresh flat buffer, in place, instead of per parameter
        mean = b.call(ATEN.div_.Scalar, wait, world, meta=meta)
        shapes = [d.meta["val"].shape for d in divs]
        parts = split_flat(b, mean, [s.numel() for s in shapes], shapes)
    for d, w, c, new in zip(divs, waits, bucket, parts):
        new.meta["sw_fqn"] = d.meta.get("sw_fqn")
        d.replace_all_uses_with(new)
        for old in (d, w, c):
            graph.erase_node(old)
