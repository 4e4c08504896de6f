"""Gradient bucketing: one all-reduce / reduce-scatter per bucket of gradients.

Gradients are taken in the order the backward produces them (graph order,
identical on every rank) and grouped greedily, per collective kind/dtype,
until a bucket holds at least ``cap_bytes``.  Each bucket is issued right after its last gradient is
computed, so it overlaps the rest of the backward; its wait and the split
back into per-parameter gradients sit just before the first use (the
optimizer).  Sharded gradients are laid out ``(N, chunk)`` before being
concatenated so one reduce-scatter hands every rank its own chunks.
A bucket's collective runs in place on the fresh concatenated buffer (no copy of it).

With ``carry`` (the graph's agreement-bits input, see ``compile/agreement.py``) one float32/float64
bucket also carries those bits (appended to every rank's chunk), and a check of their sums sits just
before the optimizer's first node; a graph with no such bucket all-reduces the bits on their own.

Example::

    bucket_gradients(gm, world=2, cap_bytes=4 << 20)
"""
from __future__ import annotations

import torch

from ..graph_utils import ATEN, C10D, Builder, is_collective, tensor_bytes
from ._common import move_before, positions, split_flat

__all__ = ["bucket_gradients", "plan_buckets", "sync_collectives"]


def sync_collectives(graph: torch.fx.Graph) -> list[torch.fx.Node]:
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


_EXACT_COUNTS = (torch.float32, torch.float64)  # dtypes whose sums of 0/1 values stay exact integers


def bucket_gradients(gm: torch.fx.GraphModule, world: int, cap_bytes: int,
                     carry: torch.fx.Node | None = None, functional: bool = False) -> int:
    """Rewrite gradient collectives into buckets; returns the number of buckets.

    ``functional=True``: a fresh buffer per step and the out-of-place collective, for graphs handed to a
    ``gm_transformation`` such as ``torch.compile``, which cannot functionalize the in-place ones."""
    graph = gm.graph
    b = Builder(graph)
    pos = positions(graph)
    buckets = plan_buckets(sync_collectives(graph), pos, cap_bytes)
    carrier = None
    if carry is not None:
        carrier = next((i for i, bk in enumerate(buckets) if bk[0].args[0].meta["val"].dtype in _EXACT_COUNTS), None)
    check = None
    for i, bucket in enumerate(buckets):
        last = max((_source(c) for c in bucket), key=pos.__getitem__)
        tail = carry if i == carrier else None
        if len(bucket) == 1 and tail is None:
            _hoist_single(bucket[0], last)
        else:
            check = _rewrite(b, bucket, last, world, positions(graph), tail, functional) or check
    if carry is not None:
        _place_check(graph, check or _carry_alone(b, carry, world))
    return len(buckets)


def _carry_alone(b: Builder, carry: torch.fx.Node, world: int) -> list[torch.fx.Node]:
    """No float32/float64 gradient bucket (no gradients, or low-precision ones): all-reduce the bits alone."""
    from ..agreement import check_sums

    meta = {"sw_role": "grad_sync", "sw_kind": "grad", "sw_fqn": None, "sw_agree_carrier": True}
    with b.graph.inserting_after(carry):
        coll = b.call(C10D.all_reduce.default, carry, "sum", carry.meta["sw_group"], meta=meta)
    with b.graph.inserting_after(coll):
        wait = b.call(C10D.wait_tensor.default, coll, meta=meta)
    with b.graph.inserting_after(wait):
        check = b.graph.call_function(check_sums, (wait, world))
    return [wait, check]


def _place_check(graph: torch.fx.Graph, chain: list[torch.fx.Node]) -> None:
    """The check (with the wait and slice it reads) runs before anything the optimizer writes."""
    first_opt = next((n for n in graph.nodes if n.meta.get("sw_region") == "optimizer"), None)
    if first_opt is not None and positions(graph)[chain[-1]] > positions(graph)[first_opt]:
        move_before(chain, first_opt)


def _pre_chain(coll: torch.fx.Node) -> list[torch.fx.Node]:
    """``coll`` preceded by the padding nodes that feed it."""
    chain = [coll]
    while chain[0].args[0].meta.get("sw_role") == "grad_sync":
        chain.insert(0, chain[0].args[0])
    return chain


def _hoist_single(coll: torch.fx.Node, after: torch.fx.Node) -> None:
    move_before(_pre_chain(coll), after.next)


def _rewrite(b: Builder, bucket: list, last: torch.fx.Node, world: int, pos: dict,
             tail: torch.fx.Node | None = None, functional: bool = False) -> list[torch.fx.Node] | None:
    """One collective for ``bucket``; with ``tail`` (agreement bits) returns the ``[wait, sums, check]`` nodes."""
    from ..agreement import check_sums

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
    dtype = ins[0].meta["val"].dtype
    with graph.inserting_before(anchor):
        bits = None if tail is None else b.call(ATEN._to_copy.default, tail, dtype=dtype)
        if scatter:
            flats = [b.call(ATEN.reshape.default, x, [world, -1]) for x in ins]
            if bits is not None:  # every rank's chunk gets the bits, so every rank receives their sums
                flats.append(b.call(ATEN.expand.default, b.call(ATEN.reshape.default, bits, [1, -1]), [world, -1]))
            flat = _concat(b, flats, 1, functional)
            coll = b.call(bucket[0].target, flat, bucket[0].args[1], world, bucket[0].args[3], meta=meta)
        else:
            flat = _concat(b, [b.call(ATEN.reshape.default, x, [-1]) for x in ins]
                           + ([bits] if bits is not None else []), 0, functional)
            # in place on the buffer the cat just made: the functional all_reduce would copy it first
            op = C10D.all_reduce.default if functional else C10D.all_reduce_.default
            coll = b.call(op, flat, bucket[0].args[1], bucket[0].args[2], meta=meta)
    coll.meta["sw_agree_carrier"] = tail is not None
    chain = None
    with graph.inserting_before(first):
        wait = b.call(C10D.wait_tensor.default, coll, meta=meta)
        out = wait
        if tail is not None:
            n = wait.meta["val"].numel()
            sums = b.call(ATEN.slice.Tensor, wait, 0, n - tail.meta["val"].numel(), n, meta=meta)
            check = graph.call_function(check_sums, (sums, world))
            chain = [wait, sums, check]
            out = b.call(ATEN.slice.Tensor, wait, 0, 0, n - tail.meta["val"].numel(), meta=meta)
        # DataParallel averages: once on the fresh flat buffer, in place, instead of per parameter
        out = b.call(ATEN.div_.Scalar, out, world, meta=meta) if avg else out
        shapes = [o.meta["val"].shape for o in olds]
        parts = split_flat(b, out, [s.numel() for s in shapes], shapes)
    for o, w, c, new in zip(olds, waits, bucket, parts):
        new.meta["sw_fqn"] = o.meta.get("sw_fqn") or c.meta.get("sw_fqn")
        o.replace_all_uses_with(new)
        for dead in (o, w, c) if avg else (w, c):
            graph.erase_node(dead)
    return chain


def _concat(b: Builder, parts: list, dim: int, functional: bool) -> torch.fx.Node:
    if functional:
        out = b.call(ATEN.cat.default, parts, dim)
        return b.call(ATEN.reshape.default, out, [-1]) if dim else out
    return _cat_into_scratch(b, parts, dim)


def _cat_into_scratch(b: Builder, parts: list, dim: int) -> torch.fx.Node:
    """Concatenate ``parts`` into a buffer the graph keeps between steps (a ``get_attr``), returned flat.

    A fresh multi-MiB buffer per step would come from the allocator's ``mmap`` path and page-fault on
    every first touch, each step again; a kept one costs its pages once (like DDP's bucket buffers)."""
    gm = b.graph.owning_module
    vals = [p.meta["val"] for p in parts]
    shape = list(vals[0].shape)
    shape[dim] = sum(v.shape[dim] for v in vals)
    name = f"_sw_grad_bucket_{sum(1 for n in b.graph.nodes if n.op == 'get_attr')}"
    gm.register_buffer(name, torch.empty(shape, dtype=vals[0].dtype, device=vals[0].device), persistent=False)
    first = next(n for n in b.graph.nodes if n.op != "placeholder")
    with b.graph.inserting_before(first):
        buf = b.graph.get_attr(name)
    buf.meta["val"] = b.fake_mode.from_tensor(getattr(gm, name))
    buf.meta["sw_kind"] = "grad"  # no region: it is storage, placed with the inputs
    out = b.call(ATEN.cat.out, parts, dim, out=buf)
    return b.call(ATEN.reshape.default, out, [-1]) if dim else out


def _averaged(waits: list, world: int) -> bool:
    """True when every gradient is divided by the world size right after its wait."""
    users = [list(w.users) for w in waits]
    return all(len(u) == 1 and u[0].target is ATEN.div.Tensor and u[0].args[1] == world for u in users)
