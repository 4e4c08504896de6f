"""Vector norms over sharded tensors, and gradient clipping with one all-reduce for all gradients.

The norm of a tensor sharded along the reduced dims is the norm of its shards' norms, so each rank
computes the norm of its shard and the result is a pending norm, ``NormPartial(p)`` (a pending sum for
``p = 0``, a pending minimum for ``p = -inf``), with no collective, as in PyTorch's DTensor. Norms of
pending norms of the same order stay pending, and ``stack``/``cat`` keep any pending value (a
replicated input is taken as a pending one: exact, see ``redistribute.to_partial``). So
``torch.nn.utils.clip_grad_norm_`` / ``get_total_norm`` (``_foreach_norm`` of the gradients, ``stack``,
``vector_norm``) reduce once, where the clip coefficient is computed; only gradients that are pending
sums (a replicated weight used on sharded activations) are all-reduced first, one each, as in PyTorch.

>>> import torch
>>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
>>> mesh = init_device_mesh("cpu", (1,))
>>> g = distribute_tensor(torch.tensor([3.0, 4.0]), mesh, [Shard(0)])
>>> n = torch.linalg.vector_norm(g)
>>> n.placements, n.full_tensor().item()
((NormPartial(norm_type=2.0),), 5.0)
"""

from __future__ import annotations

import math

import torch
from torch.ops import aten

from ...placements import MaskPartial, NormPartial, Partial, Shard
from ...propagation.propagator import Decision
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy
from ..common import R, normalize_dims
# both imported first, so the registrations below replace theirs whatever order ops/__init__ imports in:
# reduction's generic entry for vector norms (replicated) and view's cat/stack rule (extended here)
from . import reduction as _reduction  # noqa: F401
from ..shape.view import cat_rule


def _ord(value) -> float:
    return 2.0 if value is None else float(value)


def pending_norm(p: float):
    """The placement of a norm of order ``p`` over a sharded dim (None: it does not decompose)."""
    if p == 0:
        return Partial("sum")  # nonzero counts add
    if p == -math.inf:
        return Partial("min")
    return NormPartial(p) if p > 0 else None


def _part(x: torch.Tensor, p: float, dims, keepdim: bool) -> torch.Tensor:
    """This rank's part of a pending norm: the norm of its shard (an empty shard: the identity)."""
    if p in (math.inf, -math.inf) and any(x.shape[d] == 0 for d in dims):
        shape = [1 if d in dims else s for d, s in enumerate(x.shape)]
        acc = x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.float32
        part = torch.full(shape, 0.0 if p > 0 else math.inf, dtype=torch.empty(0, dtype=acc).abs().dtype,
                          device=x.device)
        return part if keepdim else part.reshape([s for d, s in enumerate(x.shape) if d not in dims])
    return torch.linalg.vector_norm(x, p, list(dims), keepdim)


def _args(schema):
    x = schema.tensor_args[0]
    p = _ord(schema.arg(1, "ord", 2))
    dims = normalize_dims(schema.arg(2, "dim", None), x.ndim)
    keep = bool(schema.arg(3, "keepdim", False))
    return x, p, dims, keep


def norm_rule(schema, mesh_size):
    x, p, dims, keep = _args(schema)
    st = [Strategy((R,), (R,))]
    pending = pending_norm(p)
    if pending is None:
        return st  # negative orders: on the whole tensor
    if isinstance(pending, NormPartial):
        st.append(Strategy((pending,), (pending,)))  # a norm of pending norms of the same order
    # a pending input reduce-scattered to give a pending sum/minimum again costs one more collective later
    shard_reduced = isinstance(pending, NormPartial) or not any(isinstance(q, Partial) for q in x.placements or ())
    for d in range(x.ndim):
        if d in dims:
            if shard_reduced:
                st.append(Strategy((pending,), (Shard(d),)))
        else:
            st.append(Strategy((Shard(d if keep else d - sum(1 for r in dims if r < d)),), (Shard(d),)))
    return st


def _norm_local(schema, decision, out_specs, mesh, coord):
    x, p, dims, keep = _args(schema)
    if p not in (math.inf, -math.inf):
        return None
    return LocalPlan(kernel=lambda op, args, kwargs: _part(args[0], p, dims, keep))


register_rule(aten.linalg_vector_norm.default, local=_norm_local)(norm_rule)


def foreach_norm_rule(schema, mesh_shape) -> Decision:
    """Per tensor and mesh dim: a shard's norm is pending, a pending norm of the order stays so, other
    pending values are reduced first (one all-reduce each)."""
    p = _ord(schema.arg(1, "ord", 2))
    pending = pending_norm(p)
    inputs, outputs = [], []
    for ta in schema.tensor_args:
        pl = ta.placements or tuple(R for _ in mesh_shape)
        need, out = [], []
        for q in pl:
            if type(q) is Shard and pending is not None:
                need.append(q)
                out.append(pending)
            elif isinstance(pending, NormPartial) and q == pending:
                need.append(q)
                out.append(q)
            else:
                need.append(R)
                out.append(R)
        need = tuple(need)
        inputs.append(None if need == ta.placements else need)
        outputs.append(tuple(out))
    return Decision(inputs, outputs)


def _foreach_norm_local(schema, decision, out_specs, mesh, coord):
    p = _ord(schema.arg(1, "ord", 2))
    if p not in (math.inf, -math.inf):
        return None

    def kernel(op, args, kwargs):
        return [_part(t, p, range(t.ndim), False) for t in args[0]]

    return LocalPlan(kernel=kernel)


register_rule(aten._foreach_norm.Scalar, local=_foreach_norm_local, whole_mesh=True)(foreach_norm_rule)


def concat_rule(schema, mesh_size):
    """``cat``/``stack`` (view.py's rule) and, where an input is a pending value, that pending value for
    all of them: the concatenation of parts is the parts of the concatenation (stacking per-gradient
    norms keeps them pending)."""
    st = cat_rule(schema, mesh_size)
    seen = {st_out for s in st for st_out in s.outputs}
    n = len(schema.tensor_args)
    for ta in schema.tensor_args:
        for q in ta.placements or ():
            if isinstance(q, Partial) and not isinstance(q, MaskPartial) and q not in seen:
                seen.add(q)
                st.append(Strategy((q,), (q,) * n))
    return st


# replaces view.py's registration (imported above, so it ran first) with the extended rule
register_rule(aten.cat.default, aten.stack.default)(concat_rule)
