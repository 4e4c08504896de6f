"""Reductions over dims: sum, mean, amax/amin (a reduced sharded dim becomes a pending reduction)."""

from __future__ import annotations

from torch.ops import aten

from ..placements import Partial, Shard
from ..propagation.registry import register_rule
from ..propagation.schema import Strategy
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


@register_rule(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim, aten.amax.default,
               aten.amin.default)
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
            # a mean of equal-sized local means is the global mean; uneven shards would weigh wrongly
            if kind == "avg" and x.shape[d] % mesh_size:
                continue
            # max/min of an empty shard is an error, not an identity element
            if kind in ("max", "min") and (mesh_size - 1) * -(-x.shape[d] // mesh_size) >= x.shape[d]:
                continue
            st.append(Strategy((Partial(kind),), (Shard(d),)))
        else:
            out_d = d if keep else d - sum(1 for r in reduced if r < d)
            st.append(Strategy((Shard(out_d),), (Shard(d),)))
    return st
