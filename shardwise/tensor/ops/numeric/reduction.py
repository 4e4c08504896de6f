"""Reductions and scans, one rule for every signature (dims, keepdim, dtype, correction, index results).

Three families, registered as data:

- reductions over ``dim`` (all dims when absent or None): a non-reduced sharded dim stays sharded; a
  reduced sharded dim becomes a pending reduction where the op composes (sum -> P(sum), amax -> P(max),
  prod -> P(product), any -> P(max), all -> P(min), mean -> P(avg) on even shards), and must be
  replicated otherwise (var/std, norms, logsumexp, and every op returning indices: an index into one
  shard is not an index into the whole);
- scans along ``dim`` (cumsum, cummax, ...): that dim is replicated, the others may stay sharded;
- ops that order along ``dim`` (sort, argsort, topk): the same.
"""

from __future__ import annotations

from math import prod

import torch
from torch.ops import aten

from ...placements import Partial, Shard
from ...propagation.registry import is_out_variant, register_rule
from ...propagation.schema import LocalPlan, Strategy
from ..common import R, has_arg, named_arg, normalize_dim, normalize_dims

__all__ = ["REDUCTIONS", "SCANS", "ORDERING"]

# packet -> the pending reduction a sharded reduced dim becomes (None: that dim is replicated first)
REDUCTIONS = {
    aten.sum: "sum", aten.nansum: "sum", aten.mean: "avg", aten.amax: "max", aten.amin: "min",
    aten.max: "max", aten.min: "min", aten.prod: "product", aten.any: "max", aten.all: "min",
    aten.count_nonzero: "sum", aten._is_any_true: "max", aten._is_all_true: "min",
    aten.argmax: None, aten.argmin: None, aten.var: None, aten.std: None, aten.var_mean: None,
    aten.std_mean: None, aten.logsumexp: None, aten.linalg_vector_norm: None, aten.norm: None,
    aten.aminmax: None, aten.median: None, aten.nanmedian: None, aten.mode: None, aten.kthvalue: None,
}
# a reduction whose value output comes with an index output cannot pend (max.dim, min.dim)
_INDEXED = {"dim"}
# scans keep every dim; the scanned one must be whole on every rank
SCANS = [aten.cumsum, aten.cumsum_, aten.cumprod, aten.cumprod_, aten.logcumsumexp, aten.cummax, aten.cummin,
         aten._logcumsumexp]
ORDERING = [aten.sort, aten.argsort, aten.topk]
# pending values a reduction passes through unchanged (sum of partial sums is the partial of the sum)
_PASS = {
    aten.sum: ("sum", "avg"), aten.mean: ("sum", "avg"), aten.cumsum: ("sum", "avg"),
    aten.amax: ("max",), aten.max: ("max",), aten.amin: ("min",), aten.min: ("min",),
    aten.prod: ("product",), aten.any: ("max",), aten.all: ("min",), aten._is_any_true: ("max",),
    aten._is_all_true: ("min",), aten.cumsum_: ("sum", "avg"),
}


def _overloads(packet):
    """The packet's overloads a rule here serves: tensor-taking, not out=, not named-dim (Dimname)."""
    for name in packet.overloads():
        ov = getattr(packet, name)
        args = ov._schema.arguments
        if not args or str(args[0].type) != "Tensor" or is_out_variant(ov):  # sort.Tensor sorts a list
            continue
        if any("Dimname" in str(a.type) for a in args):
            continue
        if packet in (aten.max, aten.min) and name not in ("default", "dim"):
            continue  # max.other is the pointwise maximum
        yield ov


def _reduced_dims(schema):
    """The reduced dims, or None when the call does not match its output (then only Replicate)."""
    x, out = schema.tensor_args[0], schema.outputs[0]
    dims = named_arg(schema, "dim", None) if has_arg(schema.op, "dim") else None
    if schema.op in (aten.sum.dim_IntList, aten.mean.dim) and dims == []:
        dims = None  # legacy: an empty list reduces every dim
    reduced = set(normalize_dims(dims, x.ndim)) if x.ndim else set()  # an empty list: every dim
    keep = bool(named_arg(schema, "keepdim", False))
    if out is not None and out.ndim == (x.ndim if keep else x.ndim - len(reduced)):
        return reduced
    if isinstance(dims, (list, tuple)) and not dims and out is not None and out.ndim == x.ndim:
        return set()  # an op for which an empty list reduces nothing
    return None


def _keeps_dims(schema) -> bool:
    return bool(named_arg(schema, "keepdim", False))


def _identity(kind: str, dtype: torch.dtype):
    if dtype == torch.bool:
        return kind == "min"
    if dtype.is_floating_point:
        return -torch.inf if kind == "max" else torch.inf
    return torch.iinfo(dtype).min if kind == "max" else torch.iinfo(dtype).max


def _minmax_local(schema, decision, out_specs, mesh, coord):
    # a shard empty along a reduced dim (uneven or nested splits) has no max: it contributes the
    # reduction's identity to the pending max/min instead of raising
    kind = REDUCTIONS.get(schema.op.overloadpacket)
    if kind not in ("max", "min") or schema.outputs[0].dtype == torch.bool:
        return None
    if not any(isinstance(p, Partial) for p in out_specs[0].placements):
        return None
    reduced, shape = _reduced_dims(schema) or set(), out_specs[0].local_shape(coord)

    def kernel(op, args, kwargs):
        x = args[0]
        if all(x.shape[d] for d in reduced):
            return op(*args, **kwargs)
        return torch.full(shape, _identity(kind, x.dtype), dtype=x.dtype, device=x.device)

    return LocalPlan(kernel=kernel)


def _base(schema, passing) -> list[Strategy]:
    n_in, n_out = len(schema.tensor_args), schema.num_outputs
    st = [Strategy((R,) * n_out, (R,) * n_in)]
    for p in passing:
        st.append(Strategy((Partial(p),) * n_out, (Partial(p),) + (R,) * (n_in - 1)))
    return st


def reduction_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    packet = schema.op.overloadpacket
    reduced = _reduced_dims(schema)
    n_in, n_out = len(schema.tensor_args), schema.num_outputs
    if reduced is None:
        return _base(schema, ())
    kind = None if schema.op._overloadname in _INDEXED and n_out > 1 else REDUCTIONS[packet]
    st = _base(schema, _PASS.get(packet, ()) if kind else ())
    keep = _keeps_dims(schema)
    for d in range(x.ndim):
        rest = (R,) * (n_in - 1)
        if d in reduced:
            if kind is None:
                continue
            # a mean of equal-sized local means is the global mean; uneven shards would weigh wrongly,
            # and other mesh dims may split this dim's shards again (nested): even at every level
            if kind == "avg" and x.shape[d] % prod(schema.mesh_shape or (mesh_size,)):
                continue
            st.append(Strategy((Partial(kind),) * n_out, (Shard(d),) + rest))
        else:
            out_d = d if keep else d - sum(1 for r in reduced if r < d)
            st.append(Strategy((Shard(out_d),) * n_out, (Shard(d),) + rest))
    return st


def along_dim_rule(schema, mesh_size):
    """Scans and orderings: every dim but ``dim`` may stay sharded (ranks hold whole lines of it)."""
    x = schema.tensor_args[0]
    packet = schema.op.overloadpacket
    default = -1 if packet in ORDERING else 0
    dim = normalize_dim(named_arg(schema, "dim", default), max(x.ndim, 1))
    n_in, n_out = len(schema.tensor_args), schema.num_outputs
    out_pass = _PASS.get(packet, ()) if n_out == 1 else ()
    st = _base(schema, out_pass)
    for d in range(x.ndim):
        if d != dim:
            st.append(Strategy((Shard(d),) * n_out, (Shard(d),) + (R,) * (n_in - 1)))
    return st


register_rule(*[ov for p in REDUCTIONS for ov in _overloads(p)], local=_minmax_local)(reduction_rule)
register_rule(*[ov for p in SCANS + ORDERING for ov in _overloads(p)])(along_dim_rule)
