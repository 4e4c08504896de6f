"""View and shape ops: view/reshape, transpose/permute, (un)squeeze, expand, slicing, split, cat/stack.

A sharded dim survives a view when it is the major dim of a group of dims that merge or split, and
its torch.chunk boundaries line up on both sides; otherwise the rule asks for it to be replicated.
"""

from __future__ import annotations

from itertools import combinations
from math import prod

from torch.ops import aten

from ...placements import Partial, Shard
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy, TensorArg
from ...spec import chunk_range
from ..common import ALL_PARTIALS, LINEAR_PARTIALS, R, normalize_dim, size_sub_local

__all__ = ["view_groups", "base_name"]


def base_name(op) -> str:
    """The shape op an overload is a form of: ``squeeze_`` and ``squeeze_copy`` are ``squeeze``."""
    return op.overloadpacket.__name__.removesuffix("_copy").rstrip("_")


def view_groups(in_shape, out_shape) -> list[tuple[list[int], list[int]]]:
    """Pair up runs of input and output dims with equal element counts."""
    groups, i, j = [], 0, 0
    ni, no = len(in_shape), len(out_shape)
    while i < ni and j < no:
        a, b = [i], [j]
        pa, pb = in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while pa != pb and (i < ni or j < no):
            if (pa < pb and i < ni) or j >= no:
                pa *= in_shape[i]
                a.append(i)
                i += 1
            else:
                pb *= out_shape[j]
                b.append(j)
                j += 1
        groups.append((a, b))
    if groups:  # trailing size-1 dims join the last group
        groups[-1][0].extend(range(i, ni))
        groups[-1][1].extend(range(j, no))
    return groups


def _major(dims, shape) -> int:
    for d in dims:
        if shape[d] != 1:
            return d
    return dims[0]


def _element_spans(size: int, inner: int, chain) -> list:
    """(offset, length) in elements of every rank's block when ``size`` rows of ``inner`` elements are
    split by the mesh sizes in ``chain`` in turn (nested torch.chunk)."""
    spans = [(0, size)]
    for n in chain:
        spans = [(off + s, ln) for off, length in spans for s, ln in (chunk_range(length, n, i) for i in range(n))]
    return [(off * inner, ln * inner) for off, ln in spans]


def _view_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    out_shape = schema.outputs[0].shape
    strategies = [Strategy((R,), (R,))] + [Strategy((p,), (p,)) for p in ALL_PARTIALS]
    # the blocks must line up however the mesh dims nest on this dim (this one alone, or after/before
    # others sharding it too): check every ordered subset of the mesh sizes
    mesh = tuple(schema.mesh_shape) or (mesh_size,)
    chains = [c for k in range(1, len(mesh) + 1) for c in combinations(mesh, k)]
    for a, b in view_groups(list(x.shape), list(out_shape)):
        ma, mb = _major(a, x.shape), _major(b, out_shape)
        inner_a = prod(x.shape[d] for d in a if d > ma)
        inner_b = prod(out_shape[d] for d in b if d > mb)
        if all(_element_spans(x.shape[ma], inner_a, c) == _element_spans(out_shape[mb], inner_b, c) for c in chains):
            strategies.append(Strategy((Shard(mb),), (Shard(ma),)))
    return strategies


register_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, local=size_sub_local(1))(_view_rule)


def _perm_strategies(x: TensorArg, perm) -> list[Strategy]:
    inv = {p: i for i, p in enumerate(perm)}
    st = [Strategy((R,), (R,))] + [Strategy((p,), (p,)) for p in ALL_PARTIALS]
    return st + [Strategy((Shard(inv[d]),), (Shard(d),)) for d in range(x.ndim)]


@register_rule(aten.t.default, aten.transpose.int, aten.permute.default)
def permute_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    perm = list(range(x.ndim))
    if base_name(schema.op) == "permute":
        perm = [normalize_dim(d, x.ndim) for d in schema.args[1]]
    elif x.ndim >= 2:
        d0, d1 = (0, 1) if base_name(schema.op) == "t" else (
            normalize_dim(schema.args[1], x.ndim), normalize_dim(schema.args[2], x.ndim))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _perm_strategies(x, perm)


def _keep_dims_map(ndim_in: int, removed: set, inserted: int | None = None):
    """Map input dim -> output dim when dims are removed (squeeze/select) or one is inserted."""
    mapping, o = {}, 0
    for d in range(ndim_in):
        if inserted is not None and o == inserted:
            o += 1
        if d in removed:
            continue
        mapping[d] = o
        o += 1
    return mapping


def _mapped(x: TensorArg, mapping, partials=ALL_PARTIALS) -> list[Strategy]:
    st = [Strategy((R,), (R,))] + [Strategy((p,), (p,)) for p in partials]
    return st + [Strategy((Shard(o),), (Shard(d),)) for d, o in mapping.items()]


@register_rule(aten.unsqueeze.default)
def unsqueeze_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    dim = normalize_dim(schema.args[1], x.ndim + 1)
    return _mapped(x, {d: (d if d < dim else d + 1) for d in range(x.ndim)})


def _squeezed_dims(schema) -> list[int]:
    x = schema.tensor_args[0]
    if schema.op._overloadname == "default":
        dims = range(x.ndim)
    elif schema.op._overloadname == "dim":
        dims = [normalize_dim(schema.args[1], max(x.ndim, 1))]
    else:
        dims = [normalize_dim(d, max(x.ndim, 1)) for d in schema.args[1]]
    return [d for d in dims if x.ndim and x.shape[d] == 1]


def _squeeze_local(schema, decision, out_specs, mesh, coord):
    # squeeze by the GLOBAL size-1 dims: a short local shard of size 1 must not be squeezed away
    dims = _squeezed_dims(schema)
    return LocalPlan(kernel=lambda op, args, kwargs: aten.squeeze.dims(args[0], dims) if dims else aten.alias(args[0]))


@register_rule(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, local=_squeeze_local)
def squeeze_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    removed = set(_squeezed_dims(schema))
    return _mapped(x, _keep_dims_map(x.ndim, removed))


@register_rule(aten.expand.default, local=size_sub_local(1))
def expand_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    out_shape = schema.outputs[0].shape
    lead = len(out_shape) - x.ndim
    mapping = {d: d + lead for d in range(x.ndim) if x.shape[d] == out_shape[d + lead]}
    return _mapped(x, mapping)


@register_rule(aten.slice.Tensor, aten.select.int)
def slice_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    dim = normalize_dim(schema.arg(1, "dim", 0), x.ndim)
    if base_name(schema.op) == "select":
        return _mapped(x, _keep_dims_map(x.ndim, {dim}))
    return _mapped(x, {d: d for d in range(x.ndim) if d != dim})


@register_rule(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.unsafe_split.Tensor,
               aten.unsafe_split_with_sizes.default)
def split_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    unbind = base_name(schema.op) == "unbind"
    dim = normalize_dim(schema.arg(2 if not unbind else 1, "dim", 0), x.ndim)
    n = schema.num_outputs
    mapping = _keep_dims_map(x.ndim, {dim}) if unbind else {d: d for d in range(x.ndim) if d != dim}
    return [Strategy((s.outputs[0],) * n, s.inputs) for s in _mapped(x, mapping)]


@register_rule(aten.cat.default, aten.stack.default)
def cat_rule(schema, mesh_size):
    tensors = schema.args[0]
    out = schema.outputs[0]
    dim = normalize_dim(schema.arg(1, "dim", 0), out.ndim)
    n = len(schema.tensor_args)
    stack = schema.op is aten.stack.default
    st = [Strategy((R,), (R,) * n)] + [Strategy((p,), (p,) * n) for p in LINEAR_PARTIALS]
    for d in range(out.ndim):
        if d == dim:
            continue
        in_d = d if not stack or d < dim else d - 1
        if all(t.ndim > in_d and (stack or t.shape[in_d] == out.shape[d]) for t in tensors if t.ndim > 1 or stack):
            ins = tuple(Shard(in_d) if (t.ndim > 1 or stack) else R for t in schema.tensor_args)
            st.append(Strategy((Shard(d),), ins))
    return st


@register_rule(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
               aten.new_empty_strided.default)
def new_factory_rule(schema, mesh_size):
    # a new tensor of a given size: replicated regardless of the source's layout
    return [Strategy((R,), (None,))]


def _slice_backward_rule(schema, mesh_size):
    # (grad, input_sizes, dim, ...): the gradient is scattered into zeros along `dim`; other dims
    # keep their layout, and a pending gradient stays pending (zeros add nothing)
    grad = schema.tensor_args[0]
    out_ndim = len(schema.args[1])
    dim = normalize_dim(schema.args[2], out_ndim)
    if schema.op is aten.select_backward.default:
        mapping = {g: (g if g < dim else g + 1) for g in range(grad.ndim)}
    else:
        mapping = {g: g for g in range(grad.ndim) if g != dim}
    return _mapped(grad, mapping, LINEAR_PARTIALS)


register_rule(aten.slice_backward.default, aten.select_backward.default, local=size_sub_local(1))(
    _slice_backward_rule)


# in-place forms: the DTensor's spec changes with its shape (the dispatcher updates it)
def _squeeze_inplace_local(schema, decision, out_specs, mesh, coord):
    dims = _squeezed_dims(schema)
    return LocalPlan(kernel=lambda op, args, kwargs: aten.squeeze_.dims(args[0], dims) if dims else args[0])


register_rule(aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims, local=_squeeze_inplace_local)(squeeze_rule)
register_rule(aten.unsqueeze_.default)(unsqueeze_rule)
register_rule(aten.t_.default, aten.transpose_.default)(permute_rule)
