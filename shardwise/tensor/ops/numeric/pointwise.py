"""Pointwise ops (with broadcasting and scalars), their backward ops and in-place forms.

Shard placements follow broadcasting; Partial passes only through ops that are linear in it:
sums/differences of partials, a partial times replicated values, copies and casts.
"""

from __future__ import annotations

import torch
from torch.ops import aten

from ...collectives import mesh_max
from ...placements import Partial, Shard
from ...propagation.propagator import Decision
from ...propagation.registry import RULES, is_out_variant, register_rule
from ..common import ALL_PARTIALS, LINEAR_PARTIALS, R, broadcast_placement, pointwise_strategies, replicate_strategy
from ...propagation.schema import LocalPlan, Strategy, TensorArg

_NONLINEAR = [
    aten.abs, aten.exp, aten.log, aten.sqrt, aten.rsqrt, aten.relu, aten.gelu, aten.tanh, aten.sigmoid,
    aten.silu, aten.sin, aten.cos, aten.reciprocal, aten.sign, aten.square, aten.pow, aten.clamp,
    aten.clamp_min, aten.clamp_max, aten.erf, aten.log1p, aten.expm1, aten.hardtanh, aten.leaky_relu,
    aten.elu, aten.nan_to_num, aten.isnan, aten.logical_not, aten.bitwise_not, aten.maximum, aten.minimum,
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt, aten.le, aten.gt, aten.ge,
    aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar, aten.masked_fill,
    aten.threshold_backward, aten.gelu_backward, aten.tanh_backward, aten.sigmoid_backward,
    aten.silu_backward, aten.hardtanh_backward, aten.leaky_relu_backward, aten.threshold, aten.lerp,
    aten.addcmul, aten.addcdiv, aten.logical_and, aten.logical_or, aten.bitwise_and, aten.bitwise_or,
    aten.fmod, aten.remainder, aten.atan2, aten.rsub, aten.sqrt_, aten.exp_, aten.relu_, aten.pow_,
    aten.clamp_, aten.lerp_, aten.addcmul_, aten.addcdiv_, aten.masked_fill_, aten.maximum, aten.fill_,
    aten.sgn, aten.floor, aten.ceil, aten.round, aten.trunc, aten.neg_, aten.abs_,
    aten.clamp_min_, aten.clamp_max_, aten.sigmoid_, aten.tanh_, aten.reciprocal_, aten.rsqrt_,
    aten.bitwise_or_, aten.bitwise_and_,
]
_COPY_LIKE = [aten.clone, aten.detach, aten.alias, aten._to_copy, aten.contiguous, aten.neg]
# overloads, not packets, where a packet holds non-pointwise forms: where(cond) is nonzero, eq/ne.Tensor_list
# compare lists to a bool, copy.Dict_Tensor copies a dict
_ADDITIVE = [aten.add, aten.sub, aten.add_, aten.sub_, aten.copy_, aten.copy.default]
_SCALING = [aten.mul, aten.mul_, aten.div, aten.div_, aten.true_divide]
_FACTORY_LIKE = [aten.zeros_like, aten.ones_like, aten.empty_like, aten.full_like, aten.zero_, aten.fill]


def _is_tensor(x) -> bool:
    return isinstance(x, TensorArg)


@register_rule(*_NONLINEAR, pointwise=True)
def nonlinear_rule(schema, mesh_size):
    return pointwise_strategies(schema)




@register_rule(*_COPY_LIKE, pointwise=True)
def copy_like_rule(schema, mesh_size):
    partials = ALL_PARTIALS if schema.op.overloadpacket is not aten.neg else LINEAR_PARTIALS
    src, dst = schema.tensor_args[0].dtype, schema.outputs[0].dtype
    if dst == torch.bool and src != torch.bool:  # x != 0 commutes with no reduction
        partials = ()
    elif src.is_floating_point and not (dst.is_floating_point or dst.is_complex):
        partials = (Partial("max"), Partial("min"))  # truncation is monotone, neither additive nor multiplicative
    elif src.is_complex and not dst.is_complex:
        partials = LINEAR_PARTIALS  # the real part of a sum is the sum of real parts; not so for a product
    return pointwise_strategies(schema, [((p,), p) for p in partials])


@register_rule(*_ADDITIVE, pointwise=True)
def additive_rule(schema, mesh_size):
    # a sum of partials is a partial of sums; a scalar operand would be added once per rank
    operands = [a for a in schema.args[:2]]
    partials = []
    if all(_is_tensor(a) for a in operands) and all(t.is_dtensor for t in schema.tensor_args):
        partials = [(tuple(p for _ in schema.tensor_args), p) for p in LINEAR_PARTIALS]
    return pointwise_strategies(schema, partials)


@register_rule(*_SCALING, pointwise=True)
def scaling_rule(schema, mesh_size):
    # linear in each operand separately: one partial operand times (or over) replicated values
    n = len(schema.tensor_args)
    is_div = schema.op.overloadpacket in (aten.div, aten.div_, aten.true_divide)
    partials = []
    for i in range(1 if is_div else n):
        for p in LINEAR_PARTIALS:
            partials.append((tuple(p if j == i else R for j in range(n)), p))
    if is_div and schema.kwargs.get("rounding_mode") is not None:
        partials = []
    return pointwise_strategies(schema, partials)


@register_rule(*_FACTORY_LIKE, pointwise=True)
def factory_like_rule(schema, mesh_size):
    # new values do not inherit pending reductions: a partial input gives a replicated output
    # (zero_ keeps a partial: zeros sum to zero)
    strategies = pointwise_strategies(schema)
    keep = schema.op.overloadpacket is aten.zero_
    rest = (R,) * (len(schema.tensor_args) - 1)  # fill.Tensor's value
    for p in ALL_PARTIALS:
        strategies.append(Strategy((p if keep else R,), (p,) + rest))
    return strategies


@register_rule(aten._local_scalar_dense.default)
def item_rule(schema, mesh_size):
    return [replicate_strategy(schema)]


def _out_rule(schema, mesh_shape) -> Decision:
    # out= writes into the given DTensor, which keeps its layout: the inputs follow it (by broadcasting;
    # a pending sum in `out` comes from the first operand times replicated others, as mul's linear case)
    out = schema.kwargs["out"]
    if not isinstance(out, TensorArg) or out.placements is None:
        raise ValueError(f"{schema.op}: out= must be a DTensor when the inputs are DTensors; create it with "
                         "distribute_tensor(torch.empty(shape), mesh, placements)")
    ins = [ta for ta in schema.tensor_args if ta is not out]
    reqs = [[] for _ in ins]
    for m, p in enumerate(out.placements):
        if isinstance(p, Partial) and not (p.is_linear() and schema.op is aten.mul.out):
            raise NotImplementedError(f"{schema.op}: out= holds a pending {p} on mesh dim {m}; redistribute it first")
        for k, ta in enumerate(ins):
            req = broadcast_placement(p, ta, out.shape) if type(p) is Shard else (R if k and isinstance(p, Partial) else p)
            reqs[k].append(req)
    inputs = [None if ta.placements is None or tuple(r) == ta.placements else tuple(r) for ta, r in zip(ins, reqs)]
    return Decision(inputs + [None], [out.placements])


def _out_local(schema, decision, out_specs, mesh, coord) -> LocalPlan:
    def kernel(op, args, kwargs):
        out = kwargs["out"]  # the dispatcher passes a DTensor keyword as its local piece
        return op(*args, **{**kwargs, "out": getattr(out, "_local_tensor", out)})

    return LocalPlan(kernel=kernel)


register_rule(aten.mul.out, aten.add.out, aten.sub.out, local=_out_local, whole_mesh=True)(_out_rule)


def equal_rule(schema, mesh_size):
    # the same layout on both sides, then each rank compares its pieces; pending values are reduced first
    a, b = schema.tensor_args
    st = [Strategy((None,), (R, R))]
    if a.shape == b.shape:
        st += [Strategy((None,), (Shard(d), Shard(d))) for d in range(a.ndim)]
    return st


def _equal_local(schema, decision, out_specs, mesh, coord) -> LocalPlan:
    a, b = schema.tensor_args
    if a.shape != b.shape:  # global shapes are shared: every rank answers without communicating
        return LocalPlan(kernel=lambda op, args, kwargs: False)
    laid_out = [req or ta.placements or () for ta, req in zip((a, b), decision.inputs)]
    sharded = any(type(p) is Shard for pl in laid_out for p in pl)

    def kernel(op, args, kwargs):
        same = op(*args, **kwargs)
        if not sharded:  # every rank holds the whole of both: the local answer is the answer
            return same
        # PyTorch gathers every rank's answer; the max of "differs" over the mesh is the same thing
        differs = torch.tensor([0 if same else 1], dtype=torch.int32, device=args[0].device)
        return bool(mesh_max(differs, mesh).item() == 0)

    return LocalPlan(kernel=kernel)


register_rule(aten.equal.default, local=_equal_local)(equal_rule)


# elementwise ops torch does not tag pointwise (activation backward ops mostly); same rule
_UNTAGGED = [
    aten.hardswish, aten.hardswish_, aten.hardswish_backward, aten.elu_backward, aten.softplus_backward,
    aten.mish_backward, aten.hardsigmoid_backward, aten.hardshrink_backward, aten.softshrink_backward,
    aten.isin, aten.polar, aten.complex, aten.floor_divide, aten.floor_divide_, aten.mish_, aten.gelu_,
]
# tagged pointwise, but each element draws random numbers: a shard would draw other values
_NOT_ELEMENTWISE = {"rrelu", "rrelu_", "rrelu_with_noise", "rrelu_with_noise_"}


def tagged_pointwise_ops() -> list:
    """Every aten overload torch tags ``pointwise`` that has no rule yet: read from the ops' own tags, so
    a new torch version's pointwise ops are covered without a list here."""
    found = []
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        name, _, overload = full[len("aten::"):].partition(".")
        packet = getattr(aten, name, None)
        ov = getattr(packet, overload or "default", None) if packet is not None else None
        if ov is None or name in _NOT_ELEMENTWISE or torch.Tag.pointwise not in ov.tags:
            continue
        if ov in RULES or is_out_variant(ov) or not any("Tensor" in str(a.type) for a in ov._schema.arguments):
            continue
        if not ov.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
            found.append(ov)  # a composite op decomposes before a DTensor sees it
    return found


# the ops this module gave the pointwise rule from their tags (the validator builds their samples)
TAGGED = tuple(tagged_pointwise_ops())
register_rule(*_UNTAGGED, *TAGGED, pointwise=True)(nonlinear_rule)
