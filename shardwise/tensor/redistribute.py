"""Redistribute: plan (pure, printable) then execute (functional collectives).

``plan_redistribute`` turns (source placements, target placements, mesh shape, tensor rank) into a list
of ``Step``s, one transition on one mesh dimension each. Mesh dimensions that shard the same tensor
dimension nest in mesh order, so a step on mesh dim ``i`` is only taken when no inner mesh dimension
still shards the tensor dimensions it touches; otherwise the inner one is gathered first.

>>> from shardwise.tensor import Partial, Replicate, Shard, plan_redistribute
>>> for step in plan_redistribute((Shard(0), Partial()), (Replicate(), Shard(0)), (2, 2), 2):  # a 2x2 mesh
...     print(step)
mesh[0] S(0) -> R (all_gather)
mesh[1] P(sum) -> S(0) (reduce_scatter)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


import torch

from . import collectives as C
from .placements import MaskPartial, Partial, Placement, Replicate, Shard
from .spec import chunk_range, local_shape_and_offset, match_layout

__all__ = ["Step", "plan_redistribute", "execute_plan", "redistribute_local", "transition_cost"]

# A collective costs its bytes plus a latency expressed in bytes, so fewer collectives win ties.
LATENCY_BYTES = 16384.0


@dataclass(frozen=True)
class Step:
    mesh_dim: int
    src: Placement
    dst: Placement

    @property
    def kind(self) -> str:
        s, d = self.src, self.dst
        if isinstance(s, Partial):
            if type(d) is Replicate:
                return "all_reduce"
            if type(d) is Shard:
                return "reduce_scatter"
            return "relabel" if isinstance(s, MaskPartial) and d == Partial("sum") else "all_reduce+local"
        if type(s) is Shard:
            return "all_gather" if type(d) is Replicate else "all_to_all"
        if type(s) is Replicate:
            return "local_slice" if type(d) is Shard else "local_partial"
        raise AssertionError(f"no transition {s} -> {d}")

    def __str__(self) -> str:
        return f"mesh[{self.mesh_dim}] {self.src} -> {self.dst} ({self.kind})"


def _dims_of(*placements: Placement) -> set[int]:
    return {p.dim for p in placements if type(p) is Shard}


@lru_cache(maxsize=4096)
def plan_redistribute(src: tuple, dst: tuple, mesh_shape: tuple, ndim: int) -> tuple[Step, ...]:
    """Pure planner: the steps that take a tensor from ``src`` to ``dst`` placements."""
    # a mesh dim of size 1: the one rank along it already holds what any placement asks for, so a
    # change there is a relabel and runs no collective
    cur = [dst[i] if mesh_shape[i] == 1 else p for i, p in enumerate(src)]
    steps: list[Step] = []
    k = len(cur)
    # Phase 1, innermost mesh dim first: gather shards that must change, and inner shards of a tensor
    # dim that an outer mesh dim is about to change (nesting order). S(i)->S(j) becomes one all-to-all
    # when no other mesh dim shards i or j.
    changed = [False] * k
    needs = [False] * k
    for j in range(k):
        p = cur[j]
        if type(p) is Shard:
            touched = any(changed[m] and p.dim in _dims_of(cur[m], dst[m]) for m in range(j))
            needs[j] = p != dst[j] or touched
        changed[j] = needs[j] or cur[j] != dst[j]
    for i in reversed(range(k)):
        if not needs[i]:
            continue
        p, target = cur[i], dst[i]
        # conservative: an all-to-all only where no other mesh dim shards either tensor dim
        others = _dims_of(*(cur[:i] + cur[i + 1:] + list(dst[:i]) + list(dst[i + 1:])))
        if type(target) is Shard and target != p and p.dim not in others and target.dim not in others:
            steps.append(Step(i, p, target))
            cur[i] = target
        else:
            steps.append(Step(i, p, Replicate()))
            cur[i] = Replicate()
    # Phase 2, outermost first (so slices nest in mesh order): reductions, slices and partials.
    for i in range(k):
        p, target = cur[i], dst[i]
        if p == target:
            continue
        relabel = isinstance(p, MaskPartial) and target == Partial("sum")
        if isinstance(p, Partial) and isinstance(target, Partial) and not relabel:
            steps.append(Step(i, p, Replicate()))
            p = cur[i] = Replicate()
        if p != target:
            steps.append(Step(i, p, target))
            cur[i] = target
    return tuple(steps)


def _context_size(shape, mesh_shape, coord, placements, mesh_dim: int, dim: int) -> int:
    """Size of tensor ``dim`` as seen by mesh dim ``mesh_dim``: chunked by the other mesh dims only."""
    pl = list(placements)
    pl[mesh_dim] = Replicate()
    return local_shape_and_offset(shape, mesh_shape, coord, pl)[0][dim]


def to_partial(x: torch.Tensor, op: str, index: int) -> torch.Tensor:
    """A replicated value as rank ``index``'s part of a pending reduction, exactly: sum/bxor keep it on
    one rank (zeros elsewhere), product on one rank (ones elsewhere), avg/max/min/band/bor on all."""
    if index != 0 and op in ("sum", "bxor"):
        return torch.zeros_like(x)
    if index != 0 and op == "product":
        return torch.ones_like(x)
    return x


def execute_plan(x: torch.Tensor, steps, mesh, shape, src_placements, coord, donate: bool = False,
                 stride=None) -> torch.Tensor:
    """Run planned steps on the local tensor ``x`` of a tensor with global ``shape``. ``donate``: the
    caller gives up ``x``, so a reduction may overwrite it (see donation.py). ``stride``: the global
    stride; a collective's fresh, contiguous result is laid out in its dim order (``match_layout``)."""
    cur = list(src_placements)
    mesh_shape = tuple(mesh.shape)
    # Reduce in place only in eager code. Traced (make_fx, torch.compile), the in-place c10d all-reduce
    # is recorded without its wait: the graph would run on while the collective still writes the
    # buffer, and could free it under it.
    eager = not (torch._C._len_torch_dispatch_stack() or torch.compiler.is_compiling())
    owned = donate and eager  # whether x is a buffer nobody else sees (donated, or made by an earlier step)
    for st in steps:
        i, s, d = st.mesh_dim, st.src, st.dst
        if isinstance(s, Partial):
            if type(d) is Replicate:
                x = s.after_reduce(C.all_reduce(s.before_reduce(x), s.collective_op, mesh, i, inplace=owned))
            elif type(d) is Shard:
                x = s.after_reduce(C.reduce_scatter_dim(s.before_reduce(x), s.collective_op, d.dim, mesh, i, coord[i]))
            else:
                assert isinstance(s, MaskPartial) and d == Partial("sum"), f"bad step {st}"
        elif type(s) is Shard:
            full = _context_size(shape, mesh_shape, coord, cur, i, s.dim)
            if type(d) is Replicate:
                x = C.all_gather_dim(x, s.dim, full, mesh, i)
            else:
                x = C.all_to_all_dims(x, s.dim, d.dim, full, mesh, i, coord[i])
        elif type(d) is Shard:
            start, length = chunk_range(x.shape[d.dim], mesh_shape[i], coord[i])
            x = x.narrow(d.dim, start, length)
        else:
            x = to_partial(x, d.collective_op, coord[i])
        # an all-reduce or all-gather result is a fresh buffer; other steps may return views of x
        owned = owned or eager and type(d) is Replicate and isinstance(s, (Partial, Shard))
        cur[i] = d
    return x if stride is None else match_layout(x, stride)


def redistribute_local(x: torch.Tensor, spec, dst_placements, coord, donate: bool = False) -> torch.Tensor:
    if coord is None:  # a rank outside the mesh holds an empty piece and joins no collective
        return x
    steps = plan_redistribute(spec.placements, tuple(dst_placements), tuple(spec.mesh.shape), spec.ndim)
    return execute_plan(x, steps, spec.mesh, spec.shape, spec.placements, coord, donate, spec.stride) if steps else x


def transition_cost(src: Placement, dst: Placement, nbytes: float, n: int) -> float:
    """Estimated cost (bytes-equivalent) of changing one mesh dim of ``n`` ranks from src to dst."""
    if src == dst or dst is None:
        return 0.0
    frac = (n - 1) / n
    if isinstance(src, Partial):
        if isinstance(src, MaskPartial) and dst == Partial("sum"):
            return 0.0
        if type(dst) is Shard:
            return nbytes * frac + LATENCY_BYTES
        return 2 * nbytes * frac + LATENCY_BYTES
    if type(src) is Shard:
        if type(dst) is Replicate:
            return nbytes * frac + LATENCY_BYTES
        if type(dst) is Shard:
            return nbytes * frac / n + LATENCY_BYTES
        return nbytes * frac + LATENCY_BYTES + nbytes * 0.05
    if type(dst) is Shard:
        return nbytes * 1e-3
    return nbytes * 0.05
