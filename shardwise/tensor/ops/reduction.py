"""Reductions over dims: sum, mean, amax/amin (a reduced sharded dim becomes a pending reduction)."""

from __future__ import annotations

from math import prod

import torch
from torch.ops import aten

from ..placements import Partial, Shard
from ..propagation.registry import register_rule
from ..propagation.schema import LocalPlan, Strategy
from .common import R, normalize_dims

_KIND = {aten.sum: "sum", aten.mean: "avg", aten.amax: "max", aten.amin: "min"}


def _reduced_dims(schema):
    x = schema.tensor_args[0]
    dims = schema.arg(1, "dim", None)
    if schema.op in (aten.sum.default, aten.mean.default):
        dims = None
    return normalize_dims(dims, x.ndim)


def _keepdim(schema) -> bool:
    if schema.op in (aten.sum.default, aten.mean.default):
        return False
    return bool(schema.arg(2, "keepdim", False))


def _identity(kind: str, dtype: torch.dtype):
    if dtype == torch.bool:
        return kind == "min"
    if dtype.is_floating_point:
        return -torch.inf if kind == "max" else torch.inf
    return torch.iinfo(dtype).min if kind == "max" else torch.iinfo(dtype).max


def _minmax_local(schema, decision, out_specs, mesh, coord):
    # a shard empty along a reduced dim (uneven or nested splits) has no max: it contributes the
    # reduction's identity to the pending max/min instead of raising
    kind = _KIND[schema.op.overloadpacket]
    if kind not in ("max", "min") or not any(isinstance(p, Partial) for p in out_specs[0].placements):
        return None
    reduced, shape = _reduced_dims(schema), out_specs[0].local_shape(coord)

    def kernel(op, args, kwargs):
        x = args[0]
        if all(x.shape[d] for d in reduced):
            return op(*args, **kwargs)
        return torch.full(shape, _identity(kind, x.dtype), dtype=x.dtype, device=x.device)

    return LocalPlan(kernel=kernel)


@register_rule(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.amax.default,
               aten.amin.default, local=_minmax_local)
def reduction_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    kind = _KIND[schema.op.overloadpacket]
    reduced = set(_reduced_dims(schema))
    keep = _keepdim(schema)
    st = [Strategy((R,), (R,))]
    if kind in ("sum", "avg"):
        st += [Strategy((Partial(p),), (Partial(p),)) for p in ("sum", "avg")]
    else:
        st.append(Strategy((Partial(kind),), (Partial(kind),)))
    for d in range(x.ndim):
        if d in reduced:
            # a mean of equal-sized local means is the global mean; uneven shards would weigh wrongly,
            # and other mesh dims may split this dim's shards again (nested): even at every level
            if kind == "avg" and x.shape[d] % prod(schema.mesh_shape or (mesh_size,)):
                continue
            st.append(Strategy((Partial(kind),), (Shard(d),)))
        else:
            out_d = d if keep else d - sum(1 for r in reduced if r < d)
            st.append(Strategy((Shard(out_d),), (Shard(d),)))
    return st
