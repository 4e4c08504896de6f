"""Indexing ops: gather, scatter(_add/_reduce), index_select, index_add/copy/fill, index_put, take/put.

The indexed dim must be whole on every rank, and index tensors are replicated; the other dims may stay
sharded when the self, index and source tensors have the same size there (so each rank's rows line up).
A selection passes pending values through (a gather of a partial sum is the partial of the gather).
"""

from __future__ import annotations

from torch.ops import aten

from ...placements import Shard
from ...propagation.registry import register_rule
from ...propagation.schema import Strategy, TensorArg
from ..common import ALL_PARTIALS, R, named_arg, normalize_dim

__all__ = ["INDEXED_ALONG_DIM", "REPLICATED"]


def _dim(schema) -> int:
    x = schema.tensor_args[0]
    return normalize_dim(named_arg(schema, "dim", 0), max(x.ndim, 1))


def _along_dim(schema, shard_others: list, partial_args=(0,)) -> list[Strategy]:
    """``shard_others``: the tensor args sharded with self on a non-indexed dim (same size there)."""
    x, out = schema.tensor_args[0], schema.outputs[0]
    n, dim = len(schema.tensor_args), _dim(schema)
    st = [Strategy((R,), (R,) * n)]
    for p in ALL_PARTIALS if partial_args else ():
        st.append(Strategy((p,), tuple(p if i in partial_args else R for i in range(n))))
    for d in range(x.ndim):
        if d == dim or out.ndim != x.ndim:
            continue
        tas = [schema.tensor_args[i] for i in shard_others]
        if all(t.ndim == x.ndim and t.shape[d] == x.shape[d] == out.shape[d] for t in tas):
            st.append(Strategy((Shard(d),), tuple(Shard(d) if i == 0 or i in shard_others else R for i in range(n))))
    return st


def _positions(schema, names) -> list[int]:
    """Tensor-arg positions of the named arguments that are tensors."""
    out = []
    for name in names:
        v = named_arg(schema, name)
        if isinstance(v, TensorArg):
            out.append(schema.tensor_args.index(v))
    return out


@register_rule(aten.gather.default)
def gather_rule(schema, mesh_size):
    return _along_dim(schema, _positions(schema, ["index"]))


@register_rule(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
               aten.scatter_.src, aten.scatter_.value, aten.scatter_.reduce, aten.scatter_.value_reduce,
               aten.scatter_add.default, aten.scatter_add_.default, aten.scatter_reduce.two,
               aten.scatter_reduce_.two)
def scatter_rule(schema, mesh_size):
    # writes src[i] at index[i] along dim: self, index and src split alike on the other dims
    return _along_dim(schema, _positions(schema, ["index", "src"]), partial_args=())


@register_rule(aten.index_select.default)
def index_select_rule(schema, mesh_size):
    return _along_dim(schema, [])


@register_rule(aten.index_add.default, aten.index_add_.default, aten.index_copy.default, aten.index_copy_.default,
               aten.index_reduce.default, aten.index_reduce_.default)
def index_add_rule(schema, mesh_size):
    # (self, dim, index, source): source has self's size on every dim but `dim`; index replicated
    x, out = schema.tensor_args[0], schema.outputs[0]
    src = schema.tensor_args[_positions(schema, ["source"])[0]]
    index = set(_positions(schema, ["index"]))
    n, dim = len(schema.tensor_args), _dim(schema)
    st = [Strategy((R,), (R,) * n)]
    for d in range(x.ndim):
        if d != dim and src.ndim == x.ndim and src.shape[d] == x.shape[d] == out.shape[d]:
            st.append(Strategy((Shard(d),), tuple(R if i in index else Shard(d) for i in range(n))))
    return st


@register_rule(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, aten.index_fill_.int_Scalar,
               aten.index_fill_.int_Tensor)
def index_fill_rule(schema, mesh_size):
    return _along_dim(schema, [], partial_args=())


# every element may come from anywhere (flat or advanced indices): replicated, as data
REPLICATED = [
    aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default, aten.take.default,
    aten.put.default, aten.put_.default, aten.masked_scatter.default, aten.masked_scatter_.default,
    aten._unsafe_masked_index.default, aten._unsafe_masked_index_put_accumulate.default,
    aten.index_put.hacked_twin, aten.index_put_.hacked_twin, aten._unsafe_index_put.default,
    aten.bucketize.Tensor, aten.searchsorted.Tensor, aten.histc.default,
]
INDEXED_ALONG_DIM = [gather_rule, scatter_rule, index_select_rule, index_add_rule, index_fill_rule]
