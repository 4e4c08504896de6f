"""Gradient bucketing: one all-reduce / reduce-scatter per bucket of gradients.

Gradients are taken in the order the backward produces them (graph order,
identical on every rank) and grouped greedily, per collective kind/dtype,
until a bucket holds at least ``cap_bytes``.  Each bucket is issued right after its last gradient is
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
    """Group collectives in readiness order, per (kind, dtype, reduce op, group); a bucket
    closes once it holds ``cap_bytes``.  Decisions use only sizes and graph order."""

    def key(c):
        return (str(c.target), str(c.args[0].meta["val"].dtype), str(c.args[1]), str(c.args[-1]))

    open_: dict = {}  # key -> (bucket, bytes) still accepting gradients
    buckets: list[list[torch.fx.Node]] = []
    for c in sorted(colls, key=lambda c: pos[_source(c)]):
        k = key(c)
        if k not in open_:
            open_[k] = ([], 0)
            buckets.append(open_[k][0])
        bucket, size = open_[k]
        bucket.append(c)
        size += tensor_bytes(c.args[0].meta["val"])
        open_[k] = (bucket, size)
        if size >= cap_bytes:
            del open_[k]
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
    avg = _averaged(waits, world)
    olds = [next(iter(w.users)) for w in waits] if avg else waits
    # the bucket's wait goes just before the first consumer of any of its gradients
    first = min((u for o in olds for u in o.users), key=pos.__getitem__)
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
            coll = b.call(bucket[0].target, flat, bucket[0].args[1], world, bucket[0].args[3], meta=meta)
        else:
            flat = b.call(ATEN.cat.default, [b.call(ATEN.reshape.default, x, [-1]) for x in ins])
            coll = b.call(bucket[0].target, flat, bucket[0].args[1], bucket[0].args[2], meta=meta)
    with graph.inserting_before(first):
        wait = b.call(C10D.wait_tensor.default, coll, meta=meta)
        # DataParallel averages: once on the fresh flat buffer, in place, instead of per parameter
        out = b.call(ATEN.div_.Scalar, wait, world, meta=meta) if avg else wait
        shapes = [o.meta["val"].shape for o in olds]
        parts = split_flat(b, out, [s.numel() for s in shapes], shapes)
    for o, w, c, new in zip(olds, waits, bucket, parts):
        new.meta["sw_fqn"] = o.meta.get("sw_fqn") or c.meta.get("sw_fqn")
        o.replace_all_uses_with(new)
        for dead in (o, w, c) if avg else (w, c):
            graph.erase_node(dead)


def _averaged(waits: list, world: int) -> bool:
    """True when every gradient is divided by the world size right after its wait."""
    users = [list(w.users) for w in waits]
    return all(len(u) == 1 and u[0].target is ATEN.div.Tensor and u[0].args[1] == world for u in users)
