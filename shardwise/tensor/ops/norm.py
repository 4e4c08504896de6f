"""Vector norms over sharded tensors (gradient clipping): local p-th power sums, one all-reduce.

A norm is not linear, so a sharded input cannot become a pending value. The local kernel computes
sum(|x|^p) (max/min |x| for +-inf, the nonzero count for p=0) on its shard, reduces it over the mesh
dims that shard the reduced dims, and takes the p-th root: the result is replicated.
"""

from __future__ import annotations

import math

import torch
from torch.ops import aten

from ..collectives import all_reduce
from ..placements import Shard
from ..propagation.propagator import Decision
from ..propagation.registry import register_rule
from ..propagation.schema import LocalPlan, Strategy
from .common import R, normalize_dims


def _ord(value) -> float:
    return 2.0 if value is None else float(value)


def _reduce_op(p: float) -> str:
    return "max" if p == math.inf else "min" if p == -math.inf else "sum"


def _local_norm(x: torch.Tensor, p: float, dims, keepdim: bool, mesh, mesh_dims) -> torch.Tensor:
    """Norm of a tensor sharded over ``mesh_dims`` along reduced dims (others already local)."""
    if not mesh_dims:
        return torch.linalg.vector_norm(x, p, dims, keepdim)
    dims = list(range(x.ndim)) if dims is None else dims
    acc_dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    ax = x.abs().to(acc_dtype)
    if p in (math.inf, -math.inf):
        if any(ax.shape[d] == 0 for d in dims):  # an empty shard: max/min's identity, in the reduced shape
            shape = [1 if d in dims else s for d, s in enumerate(ax.shape)]
            part = torch.full(shape, -math.inf if p > 0 else math.inf, dtype=acc_dtype, device=x.device)
            part = part if keepdim else part.reshape([s for d, s in enumerate(ax.shape) if d not in dims])
        else:
            part = ax.amax(dims, keepdim) if p > 0 else ax.amin(dims, keepdim)
    elif p == 0:
        part = (ax != 0).to(acc_dtype).sum(dims, keepdim)
    else:
        part = ax.pow(p).sum(dims, keepdim)
    for m in mesh_dims:
        part = all_reduce(part, _reduce_op(p), mesh, m)
    out = part if p in (0, math.inf, -math.inf) else part.pow(1.0 / p)
    return out.to(x.dtype) if x.dtype.is_floating_point else out


def _args(schema):
    x = schema.tensor_args[0]
    p = _ord(schema.arg(1, "ord", 2))
    dims = normalize_dims(schema.arg(2, "dim", None), x.ndim)
    keep = bool(schema.arg(3, "keepdim", False))
    return x, p, dims, keep


def norm_rule(schema, mesh_size):
    x, p, dims, keep = _args(schema)
    st = [Strategy((R,), (R,))]
    if p < 0 and p != -math.inf:
        return st  # negative orders do not decompose into per-shard sums
    for d in range(x.ndim):
        if d in dims:
            st.append(Strategy((R,), (Shard(d),)))  # reduced by the local kernel
        else:
            st.append(Strategy((Shard(d if keep else d - sum(1 for r in dims if r < d)),), (Shard(d),)))
    return st


def _norm_local(schema, decision, out_specs, mesh, coord):
    x, p, dims, keep = _args(schema)
    pl = decision.inputs[0] or x.placements
    mesh_dims = [m for m, q in enumerate(pl) if type(q) is Shard and q.dim in dims]
    if not mesh_dims:
        return None
    return LocalPlan(kernel=lambda op, args, kwargs: _local_norm(args[0], p, list(dims), keep, mesh, mesh_dims))


register_rule(aten.linalg_vector_norm.default, local=_norm_local)(norm_rule)


def foreach_norm_rule(schema, mesh_shape) -> Decision:
    # pending values are reduced first; shards stay and are summed inside the kernel
    inputs = []
    for ta in schema.tensor_args:
        pl = ta.placements or tuple(R for _ in mesh_shape)
        target = tuple(R if not isinstance(q, Shard) else q for q in pl)
        inputs.append(None if target == ta.placements else target)
    return Decision(inputs, [tuple(R for _ in mesh_shape) for _ in schema.outputs])


def _foreach_norm_local(schema, decision, out_specs, mesh, coord):
    p = _ord(schema.arg(1, "ord", 2))
    placements = [decision.inputs[i] or ta.placements for i, ta in enumerate(schema.tensor_args)]
    mesh_dims = [[m for m, q in enumerate(pl) if type(q) is Shard] for pl in placements]

    def kernel(op, args, kwargs):
        return [_local_norm(t, p, None, False, mesh, md) for t, md in zip(args[0], mesh_dims)]

    return LocalPlan(kernel=kernel)


register_rule(aten._foreach_norm.Scalar, local=_foreach_norm_local, whole_mesh=True)(foreach_norm_rule)
