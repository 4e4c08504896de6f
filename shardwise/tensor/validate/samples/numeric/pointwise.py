"""Validator samples for ``ops/numeric/pointwise.py``: unary, binary, comparison, in-place and backward
pointwise ops (integer-valued floats where ties matter, positive values for restricted domains)."""

from __future__ import annotations

import dataclasses

import torch
from torch.ops import aten

from ....ops.numeric import pointwise as _pw
from ..base import _BUILDERS, Plain, S, _on, schema_samples


_UNARY = [
    aten.abs.default, aten.exp.default, aten.relu.default, aten.gelu.default, aten.tanh.default,
    aten.sigmoid.default, aten.silu.default, aten.sin.default, aten.cos.default, aten.sign.default,
    aten.square.default, aten.erf.default, aten.expm1.default, aten.hardtanh.default, aten.leaky_relu.default,
    aten.elu.default, aten.nan_to_num.default, aten.isnan.default, aten.sgn.default, aten.floor.default,
    aten.ceil.default, aten.round.default, aten.trunc.default, aten.neg.default, aten.clone.default,
    aten.detach.default, aten.alias.default, aten.contiguous.default, aten.abs_.default, aten.exp_.default,
    aten.relu_.default, aten.neg_.default, aten.sigmoid_.default, aten.tanh_.default, aten.zeros_like.default,
    aten.ones_like.default, aten.zero_.default,
]
_UNARY_POS = [
    aten.log.default, aten.sqrt.default, aten.rsqrt.default, aten.reciprocal.default, aten.log1p.default,
    aten.sqrt_.default, aten.reciprocal_.default, aten.rsqrt_.default,
]


@_on(*_UNARY)
def _unary(op, m):
    return [S(m.f(5, 3)), S(m.f(2))]


@_on(*_UNARY_POS)
def _unary_pos(op, m):
    return [S(m.pos(5, 3)), S(m.pos(2))]


@_on(aten.empty_like.default)
def _empty_like(op, m):
    return [dataclasses.replace(s, undefined=True) for s in _unary(op, m)]


_ONE_SCALAR = {
    aten.hardtanh.default: (-0.5, 0.5), aten.leaky_relu.default: (0.2,), aten.elu.default: (0.5,),
    aten.threshold.default: (0.1, 20.0), aten.full_like.default: (2.5,), aten.fill_.Scalar: (1.5,),
    aten.copy_.int: (5,), aten.copy_.float: (2.5,), aten.clamp.default: (-0.5, 0.5),
    aten.clamp_.default: (-0.5, 0.5), aten.clamp_min.default: (0.1,), aten.clamp_min_.default: (0.1,),
    aten.clamp_max.default: (0.1,), aten.clamp_max_.default: (0.1,), aten.pow.Tensor_Scalar: (2.5,),
    aten.pow_.Scalar: (2,), aten.rsub.Scalar: (1.0,), aten.add.Scalar: (2.5,), aten.sub.Scalar: (2.5,),
    aten.mul.Scalar: (-2.0,), aten.div.Scalar: (-2.0,), aten.add_.Scalar: (2.5,), aten.sub_.Scalar: (2.5,),
    aten.mul_.Scalar: (-2.0,), aten.div_.Scalar: (-2.0,), aten.fmod.Scalar: (1.5,), aten.remainder.Scalar: (1.5,),
}


@_on(*_ONE_SCALAR)
def _with_scalars(op, m):
    scalars = _ONE_SCALAR[op]
    return [S(m.pos(5, 3), *scalars), S(m.f(2), *scalars), S(m.f(4, 3), *scalars)]


@_on(aten.div.Scalar_mode, aten.div_.Scalar_mode, aten.round.decimals)
def _scalar_kwarg(op, m):
    if op is aten.round.decimals:
        return [S(m.f(5, 3), decimals=1), S(m.f(2) * 10, decimals=-1)]
    return [S(m.f(5, 3), 0.7, rounding_mode="floor"), S(m.f(3), -2.0, rounding_mode="trunc")]


@_on(aten._to_copy.default)
def _to_copy(op, m):
    # float -> int truncates and float -> bool is not monotone: pending reductions must not pass
    return [S(m.f(5, 3)), S(m.f(5, 3), dtype=torch.float64), S(m.f(2, 3) * 3, dtype=torch.int64),
            S(m.f(3), dtype=torch.bool), S(m.i(4, 3), dtype=torch.float32)]


@_on(aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar)
def _compare_scalar(op, m):
    return [S(m.fi(5, 3), 0.0), S(m.fi(2), 1)]


@_on(aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor,
     aten.maximum.default, aten.minimum.default)
def _compare(op, m):
    return [S(m.fi(5, 3), m.fi(5, 3)), S(m.fi(5, 3), m.fi(3)), S(m.fi(5, 1), m.fi(1, 3)),
            S(m.fi(5, 3), Plain(m.fi()))]


_BINARY = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.atan2.default, aten.rsub.Tensor]
_BINARY_DIV = [aten.div.Tensor, aten.fmod.Tensor, aten.remainder.Tensor, aten.pow.Tensor_Tensor]
_BINARY_ = [aten.add_.Tensor, aten.sub_.Tensor, aten.mul_.Tensor, aten.copy_.default, aten.copy_.Tensor,
            aten.copy.default]  # copy(self, src) broadcasts src to self like the in-place forms
_BINARY_DIV_ = [aten.div_.Tensor, aten.pow_.Tensor, aten.clamp_min_.Tensor, aten.clamp_max_.Tensor]


@_on(*_BINARY, *_BINARY_DIV, aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _binary(op, m):
    a = m.pos if op in _BINARY_DIV else m.f
    b = m.pos if op in _BINARY_DIV else m.f
    out = [S(a(5, 3), b(5, 3)), S(a(5, 3), b(3)), S(a(5, 1), b(1, 3)), S(a(2, 3), b(2, 1)),
           S(a(5, 3), Plain(b())), S(a(5, 3), b())]
    if op in (aten.add.Tensor, aten.sub.Tensor, aten.rsub.Tensor):
        out.append(S(a(5, 3), b(5, 3), alpha=2))
    return out


@_on(*_BINARY_, *_BINARY_DIV_)
def _binary_inplace(op, m):
    a = m.pos if op in _BINARY_DIV_ else m.f
    out = [S(a(5, 3), a(5, 3)), S(a(5, 3), a(3)), S(a(2, 3), a(2, 1)), S(a(5, 3), Plain(a()))]
    if op in (aten.add_.Tensor, aten.sub_.Tensor):
        out.append(S(a(5, 3), a(5, 3), alpha=-0.5))
    return out


@_on(aten.div.Tensor_mode, aten.div_.Tensor_mode)
def _div_mode(op, m):
    return [S(m.f(5, 3) * 4, m.pos(3), rounding_mode="floor"), S(m.f(5, 3) * 4, m.pos(5, 3), rounding_mode="trunc")]


@_on(aten.bitwise_and.Tensor, aten.bitwise_or.Tensor)
def _bitwise(op, m):
    return [S(m.i(5, 3), m.i(5, 3)), S(m.i(5, 3), m.i(3)), S(m.b(5, 3), m.b(3))]


@_on(aten.bitwise_and_.Tensor, aten.bitwise_or_.Tensor)
def _bitwise_inplace(op, m):
    return [S(m.i(5, 3), m.i(5, 3)), S(m.i(5, 3), m.i(3)), S(m.b(5, 3), m.b(3))]


@_on(aten.bitwise_and_.Scalar, aten.bitwise_or_.Scalar)
def _bitwise_inplace_scalar(op, m):
    return [S(m.i(5, 3), 6), S(m.i(2), 3)]


@_on(aten.mul.out, aten.add.out, aten.sub.out)
def _binary_out(op, m):
    return [S(m.f(5, 3), m.f(5, 3), out=m.f(5, 3)), S(m.f(5, 3), m.f(3), out=m.f(5, 3)),
            S(m.f(5, 1), m.f(1, 3), out=m.f(5, 3))]


@_on(aten.equal.default)
def _equal(op, m):
    x = m.f(5, 3)
    return [S(x, x.clone()), S(x, m.f(5, 3)), S(x, m.f(3, 5)), S(m.i(4), m.i(4))]


@_on(aten.bitwise_and.Scalar, aten.bitwise_or.Scalar)
def _bitwise_scalar(op, m):
    return [S(m.i(5, 3), 6), S(m.i(2), 3)]


@_on(aten.bitwise_and.Scalar_Tensor, aten.bitwise_or.Scalar_Tensor, aten.remainder.Scalar_Tensor, aten.pow.Scalar)
def _scalar_tensor(op, m):
    return [S(6, m.i(5, 3, lo=1)), S(3, m.i(2, lo=1))] + ([S(2.0, m.f(5, 3))] if op is aten.pow.Scalar else [])


@_on(aten.logical_and.default, aten.logical_or.default)
def _logical(op, m):
    return [S(m.b(5, 3), m.b(5, 3)), S(m.b(5, 3), m.b(3)), S(m.f(5, 3), m.b(5, 3))]


@_on(aten.logical_not.default, aten.bitwise_not.default)
def _not(op, m):
    return [S(m.b(5, 3)), S(m.b(2))] + ([S(m.i(5, 3))] if op is aten.bitwise_not.default else [S(m.fi(5, 3))])


@_on(aten.clamp.Tensor, aten.clamp_.Tensor)
def _clamp_tensor(op, m):
    return [S(m.f(5, 3), m.f(3) - 0.5, m.f(5, 3) + 0.5), S(m.f(5, 3), m.f(5, 1)), S(m.f(5, 3), None, m.f(3))]


@_on(aten.fill_.Tensor)
def _fill_tensor(op, m):
    return [S(m.f(5, 3), Plain(m.f())), S(m.f(5, 3), m.f()), S(m.f(2), m.f())]


@_on(aten.where.self)
def _where(op, m):
    return [S(m.b(5, 3), m.f(5, 3), m.f(3)), S(m.b(3), m.f(5, 1), m.f(5, 3)), S(m.b(2), m.f(2), Plain(m.f()))]


@_on(aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where_scalar(op, m):
    pick = {aten.where.Scalar: lambda *s: -2.0, aten.where.ScalarSelf: lambda *s: m.f(*s)}.get(op)
    if pick is not None:
        return [S(m.b(5, 3), 1.5, pick(3)), S(m.b(2), 1, pick(2))]
    return [S(m.b(5, 3), m.f(3), 1.5), S(m.b(2), m.f(2), 1.5)]


@_on(aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.masked_fill.Tensor, aten.masked_fill_.Tensor)
def _masked_fill(op, m):
    v = (lambda: Plain(m.f())) if op._overloadname == "Tensor" else (lambda: -1.5)
    out = [S(m.f(5, 3), m.b(5, 3), v()), S(m.f(5, 3), m.b(3), v()), S(m.f(2), m.b(2), v())]
    if op._overloadname == "Tensor":
        out.append(S(m.f(5, 3), m.b(3), m.f()))
    return out


@_on(aten.lerp.Scalar, aten.lerp_.Scalar, aten.lerp.Tensor, aten.lerp_.Tensor)
def _lerp(op, m):
    w = (lambda *s: m.f(*s)) if op._overloadname == "Tensor" else (lambda *s: 0.3)
    return [S(m.f(5, 3), m.f(5, 3), w(5, 3)), S(m.f(5, 3), m.f(3), w(3)), S(m.f(2), m.f(2), w(2))]


@_on(aten.addcmul.default, aten.addcmul_.default, aten.addcdiv.default, aten.addcdiv_.default)
def _addc(op, m):
    return [S(m.f(5, 3), m.f(5, 3), m.pos(5, 3), value=0.5), S(m.f(5, 3), m.f(3), m.pos(5, 1)),
            S(m.f(2), m.f(2), m.pos(2), value=-2)]


@_on(aten.threshold_backward.default, aten.gelu_backward.default, aten.tanh_backward.default,
     aten.sigmoid_backward.default, aten.silu_backward.default, aten.hardtanh_backward.default,
     aten.leaky_relu_backward.default)
def _backward(op, m):
    extra = {
        aten.threshold_backward.default: (0.1,), aten.hardtanh_backward.default: (-0.5, 0.5),
        aten.leaky_relu_backward.default: (0.2, False),
    }.get(op, ())
    out = [S(m.f(5, 3), m.f(5, 3), *extra), S(m.f(2), m.f(2), *extra)]
    if op is aten.gelu_backward.default:
        out.append(S(m.f(5, 3), m.f(5, 3), approximate="tanh"))
    return out


@_on(aten.threshold.default)
def _threshold(op, m):
    return [S(m.f(5, 3), 0.1, 20.0), S(m.f(2), 0.0, -1.0)]


@_on(aten._local_scalar_dense.default)
def _item(op, m):
    return [S(m.f()), S(m.i()), S(m.f(1))]


# the ops given the pointwise rule from their tags, and the untagged elementwise ones: built from schemas
_on(*[op for op in (*_pw.TAGGED, *(getattr(p, n) for p in _pw._UNTAGGED for n in p.overloads()))
      if op in _pw.RULES and op not in _BUILDERS])(schema_samples([(5, 3), (3,)], [(4, 6), (4, 6)], [(2,)]))


@_on(aten.clip.default, aten.clip_.default)
def _clip(op, m):
    return [S(m.f(5, 3), -0.5, 0.5), S(m.f(5, 3), None, 0.2)]


@_on(aten.clip.Tensor, aten.clip_.Tensor)
def _clip_tensor(op, m):
    return [S(m.f(5, 3), m.f(3) - 0.5, m.f(5, 3) + 0.5)]


@_on(aten.float_power_.Tensor, aten.float_power_.Scalar)
def _float_power_(op, m):
    other = m.pos(3).double() if op is aten.float_power_.Tensor else 1.5
    return [S(m.pos(5, 3).double(), other)]


@_on(aten.round_.decimals)
def _round_decimals(op, m):
    return [S(m.f(5, 3), decimals=1)]
