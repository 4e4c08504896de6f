"""All-gather bucketing and prefetch for sharded parameters.

For each role (``gather_fwd``, ``gather_bwd``) the parameter all-gathers
are ordered by the first use of their result, grouped greedily until a
bucket holds ``cap_bytes`` of shards, and replaced by one all-gather of the
concatenated shards.  Bucket ``k`` is *issued* just before the first use of
bucket ``k-1`` (one bucket of prefetch, so communication overlaps compute
while at most two buckets are alive); its wait and the copy-out into
per-parameter tensors sit just before its own first use.  The first
backward bucket is issued where the backward starts, never earlier, so no
gathered parameter lives across the forward/backward boundary.

Example::

    bucket_gathers(gm, world=2, cap_bytes=4 << 20)
"""
from __future__ import annotations

import torch

from ..graph_utils import ATEN, C10D, Builder, is_collective, tensor_bytes
from ._common import move_before, positions, split_flat

__all__ = ["bucket_gathers"]


def _uses(wait: torch.fx.Node) -> list[torch.fx.Node]:
    """Users of a gathered parameter, looking through the unpadding slice."""
    out = []
    for u in wait.users:
        if u.meta.get("sw_role") in ("gather_fwd", "gather_bwd") and u.target is ATEN.slice.Tensor:
            out.extend(u.users)
        else:
            out.append(u)
    return out


def plan_gather_buckets(colls: list, pos: dict, cap_bytes: int) -> list[list[torch.fx.Node]]:
    def first(c):
        return min(pos[u] for u in _uses(next(iter(c.users))))

    colls = sorted(colls, key=first)
    buckets, size = [], 0
    for c in colls:
        dtype = c.args[0].meta["val"].dtype
        if buckets and size < cap_bytes and buckets[-1][0].args[0].meta["val"].dtype == dtype:
            buckets[-1].append(c)
        else:
            buckets.append([c])
            size = 0
        size += tensor_bytes(c.args[0].meta["val"])
    return buckets


def bucket_gathers(gm: torch.fx.GraphModule, world: int, cap_bytes: int) -> int:
    """Bucket and schedule parameter all-gathers; returns the number of buckets."""
    graph = gm.graph
    b = Builder(graph)
    total = 0
    for role in ("gather_fwd", "gather_bwd"):
        colls = [n for n in graph.nodes if is_collective(n) and n.meta.get("sw_role") == role]
        if not colls:
            continue
        buckets = plan_gather_buckets(colls, positions(graph), cap_bytes)
        issued = [_rewrite(b, bucket, world, role) for bucket in buckets]
        _schedule(graph, issued, role)
        total += len(buckets)
    return total


def _rewrite(b: Builder, bucket: list, world: int, role: str):
    """One all-gather for ``bucket``; returns ``(issue_nodes, first_use)``."""
    graph = b.graph
    pos = positions(graph)
    waits = [next(iter(c.users)) for c in bucket]
    first = min((u for w in waits for u in _uses(w)), key=pos.__getitem__)
    meta = {"sw_role": role, "sw_kind": "param", "sw_fqn": None}
    slices = [u for w in waits for u in w.users if u.target is ATEN.slice.Tensor]
    if len(bucket) == 1:
        move_before(waits, first)
        _sink(slices)
        return [bucket[0]], first
    shards = [c.args[0] for c in bucket]
    gname = bucket[0].args[2]
    with graph.inserting_before(first):
        flat = b.call(ATEN.cat.default, [b.call(ATEN.reshape.default, s, [-1]) for s in shards])
        coll = b.call(C10D.all_gather_into_tensor.default, flat, world, gname, meta=meta)
        wait = b.call(C10D.wait_tensor.default, coll, meta=meta)
        grid = b.call(ATEN.reshape.default, wait, [world, -1])
        sizes = [s.meta["val"].numel() for s in shards]
        shapes = [w.meta["val"].shape for w in waits]
        parts = split_flat(b, grid, sizes, [[world, n] for n in sizes], dim=1)
        outs = [b.call(ATEN.reshape.default, p, list(shape)) for p, shape in zip(parts, shapes)]
    for w, c, new in zip(waits, bucket, outs):
        w.replace_all_uses_with(new)
        graph.erase_node(w)
        graph.erase_node(c)
    _sink(slices)
    return [coll.args[0].args[0][i] for i in range(len(shards))] + [coll.args[0], coll], first


def _sink(nodes: list[torch.fx.Node]) -> None:
    """Move each node to just before its first user (keeps unpadding after the wait)."""
    for n in nodes:
        pos = positions(n.graph)
        min(n.users, key=pos.__getitem__).prepend(n)


def _schedule(graph: torch.fx.Graph, issued: list, role: str) -> None:
    """Issue bucket k before bucket k-1's first use (bucket 0: start of its phase)."""
    start = _phase_start(graph, role)
    for k, (nodes, _) in enumerate(issued):
        anchor = start if k == 0 else issued[k - 1][1]
        pos = positions(graph)
        if pos[anchor] < pos[nodes[0]]:
            move_before(nodes, anchor)


def _phase_start(graph: torch.fx.Graph, role: str) -> torch.fx.Node:
    for n in graph.nodes:
        if role == "gather_fwd" and n.op != "placeholder":
            return n
        if role == "gather_bwd" and n.meta.get("sw_region") == "backward":
            return n
    raise AssertionError(f"no phase start for {role}")
