"""Helpers shared by the op families: broadcasting maps, shard-dim rewiring, local-size substitutions."""

from __future__ import annotations

from typing import Optional, Sequence

from ..placements import Partial, Placement, Replicate, Shard
from ..propagation.schema import LocalPlan, Strategy, TensorArg

__all__ = [
    "R", "PSUM", "LINEAR_PARTIALS", "ALL_PARTIALS", "broadcast_placement", "pointwise_strategies",
    "replicate_strategy", "local_shape_sub", "normalize_dim", "normalize_dims", "named_arg", "has_arg",
]

R = Replicate()
PSUM = Partial("sum")
LINEAR_PARTIALS = (Partial("sum"), Partial("avg"))
# the float reductions a copy, view or fill passes through (bitwise ones are gathered first)
ALL_PARTIALS = (Partial("sum"), Partial("avg"), Partial("max"), Partial("min"), Partial("product"))


def normalize_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def normalize_dims(dims, ndim: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    return tuple(sorted(normalize_dim(d, ndim) for d in dims))


def broadcast_placement(out_p: Placement, arg: TensorArg, out_shape: Sequence[int]) -> Placement:
    """What an input broadcast to ``out_shape`` must be so the output has ``out_p``."""
    if type(out_p) is not Shard:
        return out_p
    ad = out_p.dim - (len(out_shape) - arg.ndim)
    if ad >= 0 and arg.shape[ad] == out_shape[out_p.dim]:
        return Shard(ad)
    return R


def replicate_strategy(schema) -> Strategy:
    outs = tuple(None if o is None else R for o in schema.outputs)
    return Strategy(outs, tuple(R for _ in schema.tensor_args))


def pointwise_strategies(schema, partials: Sequence[tuple] = ()) -> list[Strategy]:
    """Shard every output dim (inputs follow by broadcasting), replicate, and the given partial forms.

    ``partials`` is a list of (input placements, output placement) pairs for the op's linear cases."""
    out = schema.outputs[0]
    n_out = schema.num_outputs
    strategies = [replicate_strategy(schema)]
    for d in range(out.ndim):
        ins = tuple(broadcast_placement(Shard(d), ta, out.shape) for ta in schema.tensor_args)
        strategies.append(Strategy((Shard(d),) * n_out, ins))
    for ins, outp in partials:
        strategies.append(Strategy((outp,) * n_out, tuple(ins)))
    return strategies


def local_shape_sub(out_spec, coord) -> list[int]:
    """This rank's local sizes of an output (to substitute into view/expand/new_* size arguments)."""
    return list(out_spec.local_shape(coord))


def size_sub_local(arg_index: int):
    """A ``local`` hook replacing argument ``arg_index`` (a size list) with the output's local shape."""

    def local(schema, decision, out_specs, mesh, coord) -> Optional[LocalPlan]:
        if all(type(p) is not Shard for p in out_specs[0].placements):
            return None
        return LocalPlan(arg_subs={arg_index: local_shape_sub(out_specs[0], coord)})

    return local


def named_arg(schema, name: str, default=None):
    """The value of the op's argument ``name`` as called (positional or keyword), else the schema's
    default, else ``default``: read from the op's own schema, so one rule serves every overload."""
    for i, a in enumerate(schema.op._schema.arguments):
        if a.name == name:
            if not a.kwarg_only and i < len(schema.args):
                return schema.args[i]
            if name in schema.kwargs:
                return schema.kwargs[name]
            return a.default_value if a.has_default_value() else default
    return default


def has_arg(op, name: str) -> bool:
    return any(a.name == name for a in op._schema.arguments)
