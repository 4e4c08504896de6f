"""Complex views: ``view_as_complex`` (a trailing pair of reals becomes one complex number) and
``view_as_real`` (the reverse), as rotary position embeddings use them on sharded q/k. Every dim but
the pair keeps its layout; a pending sum stays pending (both views are linear). The lazy conjugate and
negative views (``_conj``, ``_neg_view`` and their ``resolve_*``) pass any layout through; on the local
tensor the lazy views are materialised (see ``_materialize``).

>>> import torch
>>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
>>> x = distribute_tensor(torch.randn(4, 3, 2), init_device_mesh("cpu", (1,)), [Shard(1)])
>>> torch.view_as_complex(x).placements, torch.view_as_real(torch.view_as_complex(x)).placements
((Shard(dim=1),), (Shard(dim=1),))
"""

from __future__ import annotations

from torch.ops import aten

from ...placements import Shard
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy
from ..common import PSUM, R


@register_rule(aten.view_as_complex.default, aten.view_as_real.default)
def complex_view_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    # view_as_complex drops the trailing pair, view_as_real adds it (their *_copy forms alike): the dims
    # before it map one to one
    shared = min(x.ndim, schema.outputs[0].ndim)
    st = [Strategy((R,), (R,))]
    st += [Strategy((Shard(d),), (Shard(d),)) for d in range(shared)]
    st.append(Strategy((PSUM,), (PSUM,)))  # not avg: pending averages of complex values do not reduce on CPU
    return st


def _materialize(schema, decision, out_specs, mesh, coord):
    # Inside __torch_dispatch__ a local tensor's conjugate/negative bit is not honoured by the ops that
    # read it (they see the raw values), so the lazy view becomes a real copy on the local tensor; the
    # DTensor's values are the same, only the aliasing of the lazy view is lost
    conj = schema.op in (aten._conj.default, aten._conj_copy.default)
    physical = aten.conj_physical.default if conj else aten.neg.default
    return LocalPlan(kernel=lambda op, args, kwargs: physical(args[0]))


@register_rule(aten._conj.default, aten._neg_view.default, local=_materialize)
@register_rule(aten.resolve_conj.default, aten.resolve_neg.default)
def conj_view_rule(schema, mesh_size):
    # element by element (the backward of a complex product multiplies by the conjugate): any layout
    # passes through; a pending sum stays pending (conjugation and negation are linear over the reals)
    x = schema.tensor_args[0]
    st = [Strategy((R,), (R,))]
    st += [Strategy((Shard(d),), (Shard(d),)) for d in range(x.ndim)]
    st.append(Strategy((PSUM,), (PSUM,)))
    return st
