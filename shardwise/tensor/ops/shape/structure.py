"""Structure ops that move or select elements along some dims and leave the others alone: tril/triu,
flip, roll, repeat, diagonal/diag_embed, unfold, padding, glu, repeat_interleave.

One rule shape serves them all (``dims_rule``): the dims an op works along must be whole on every
rank (replicated); every other dim may stay sharded, mapped to its place in the output; pending
values pass through when the op is linear in them (a selection or a copy passes every reduction; a
padding with zeros passes sums only).
"""

from __future__ import annotations

from torch.ops import aten

from ...placements import Shard
from ...propagation.registry import register_rule
from ...propagation.schema import Strategy
from ..common import ALL_PARTIALS, LINEAR_PARTIALS, R, named_arg, normalize_dim

__all__ = ["dims_rule"]


def dims_rule(schema, mapping: dict, partials=ALL_PARTIALS) -> list[Strategy]:
    """Strategies for a one-input op: ``mapping`` is input dim -> output dim for the dims that may stay
    sharded; other tensor args (indices, weights) are replicated."""
    n_in, n_out = len(schema.tensor_args), schema.num_outputs
    rest = (R,) * (n_in - 1)
    st = [Strategy((R,) * n_out, (R,) * n_in)]
    st += [Strategy((p,) * n_out, (p,) + rest) for p in partials]
    st += [Strategy((Shard(o),) * n_out, (Shard(d),) + rest) for d, o in mapping.items()]
    return st


def _identity_except(ndim: int, fixed) -> dict:
    return {d: d for d in range(ndim) if d not in fixed}


def _dims(schema, name, default=()):
    x = schema.tensor_args[0]
    v = named_arg(schema, name, default)
    v = [v] if isinstance(v, int) else list(v or ())
    return {normalize_dim(d, max(x.ndim, 1)) for d in v}


@register_rule(aten.tril.default, aten.triu.default, aten.tril_.default, aten.triu_.default)
def triangle_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    return dims_rule(schema, _identity_except(x.ndim, {x.ndim - 2, x.ndim - 1}), LINEAR_PARTIALS)


@register_rule(aten.flip.default)
def flip_rule(schema, mesh_size):
    return dims_rule(schema, _identity_except(schema.tensor_args[0].ndim, _dims(schema, "dims")))


@register_rule(aten.roll.default)
def roll_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    dims = _dims(schema, "dims")
    return dims_rule(schema, _identity_except(x.ndim, dims) if dims else {})  # no dims: the flat tensor rolls


@register_rule(aten.repeat.default)
def repeat_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    repeats = list(named_arg(schema, "repeats"))
    lead = len(repeats) - x.ndim
    return dims_rule(schema, {d: d + lead for d in range(x.ndim) if repeats[d + lead] == 1})


@register_rule(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    d1 = normalize_dim(named_arg(schema, "dim1", 0), x.ndim)
    d2 = normalize_dim(named_arg(schema, "dim2", 1), x.ndim)
    kept = [d for d in range(x.ndim) if d not in (d1, d2)]
    return dims_rule(schema, {d: i for i, d in enumerate(kept)})


@register_rule(aten.diag_embed.default)
def diag_embed_rule(schema, mesh_size):
    x, out = schema.tensor_args[0], schema.outputs[0]
    d1 = normalize_dim(named_arg(schema, "dim1", -2), out.ndim)
    d2 = normalize_dim(named_arg(schema, "dim2", -1), out.ndim)
    free = [d for d in range(out.ndim) if d not in (d1, d2)]
    return dims_rule(schema, {d: free[d] for d in range(x.ndim - 1)})


@register_rule(aten.diag.default, aten.diagonal_backward.default)
def diag_rule(schema, mesh_size):
    return dims_rule(schema, {}, LINEAR_PARTIALS)


@register_rule(aten.rot90.default)
def rot90_rule(schema, mesh_size):
    # the two rotated dims trade places; the others stay where they are
    return dims_rule(schema, _identity_except(schema.tensor_args[0].ndim, _dims(schema, "dims", (0, 1))))


@register_rule(aten.narrow_copy.default)
def narrow_rule(schema, mesh_size):
    return dims_rule(schema, _identity_except(schema.tensor_args[0].ndim, _dims(schema, "dim")))


@register_rule(aten.unfold.default)
def unfold_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    return dims_rule(schema, _identity_except(x.ndim, _dims(schema, "dimension")))


@register_rule(aten.constant_pad_nd.default)
def pad_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    pad = list(named_arg(schema, "pad"))
    padded = {x.ndim - 1 - i // 2 for i in range(len(pad)) if pad[i]}
    zero = named_arg(schema, "value", 0) == 0  # zeros add nothing to a pending sum
    return dims_rule(schema, _identity_except(x.ndim, padded), LINEAR_PARTIALS if zero else ())


@register_rule(aten.repeat_interleave.self_int)
def repeat_interleave_rule(schema, mesh_size):
    x = schema.tensor_args[0]
    dim = named_arg(schema, "dim", None)
    if dim is None:
        return dims_rule(schema, {})
    return dims_rule(schema, _identity_except(x.ndim, {normalize_dim(dim, x.ndim)}))


@register_rule(aten.glu.default)
def glu_rule(schema, mesh_size):
    # glu halves `dim` and multiplies the halves: that dim must be whole; elementwise on the others
    x = schema.tensor_args[0]
    return dims_rule(schema, _identity_except(x.ndim, _dims(schema, "dim", -1)), ())


@register_rule(aten.glu_backward.default)
def glu_backward_rule(schema, mesh_size):
    # (grad_output, self, dim): both laid out alike
    x = schema.tensor_args[1]
    dim = normalize_dim(named_arg(schema, "dim", -1), x.ndim)
    st = [Strategy((R,), (R, R))]
    return st + [Strategy((Shard(d),), (Shard(d), Shard(d))) for d in range(x.ndim) if d != dim]
